//! oxccl-topo: the machine as a graph, and the choices made on it.
//!
//! # API (kept small and stable)
//!
//! - [`Topology`]: the graph. Build it with [`Topology::detect`] (live
//!   machine, never panics), [`Topology::from_file_or_detect`] (a
//!   file the caller names, else detect), [`Topology::from_xml_str`] /
//!   [`Topology::from_xml_file`], or [`Topology::preset`]`(name, hosts)`;
//!   write it with [`Topology::to_xml_string`]. GPU indices everywhere are
//!   positions in [`Topology::gpus`].
//! - [`Topology::merge_driver_facts`]: adds what the CUDA driver knows
//!   ([`DriverFacts`]: ordinals, bus ids, peer access) to a detected
//!   topology; `oxccl_cuda::detect_topology` does both.
//! - [`Topology::path`] / [`Topology::gpu_matrix`]: [`PathClass`]
//!   (X, NV#, NVB, PIX, PXB, PHB, NODE, SYS, NET), bottleneck bandwidth,
//!   hops.
//! - [`select::Selector`]: `Selector::new(&topo, ranks_to_gpus)`, then
//!   `choose(kind, bytes, nranks, allowed_algos, allowed_protos) -> Choice
//!   { algo, proto, channels, transport, predicted_us, forced }` and `rings() -> Vec<Vec<u32>>`
//!   (one rank order per channel). `bytes` is nccl-tests' size of the call
//!   (`Collective::bytes`). The allowed lists already reflect
//!   NCCL_ALGO/NCCL_PROTO; the selector never returns anything outside them
//!   except, when nothing allowed applies at all, Ring (with the first
//!   allowed protocol the model accepts). Pass only protocols your backend
//!   implements (the CUDA backend Simple and LL, the host backend Simple):
//!   LL128 is modelled and will be picked when allowed.
//! - [`calibrate`]: read `cargo xtask sweep --json` output and fit the
//!   [`consts::Constants`] to it, including its `avoid` list of variants
//!   the selector must not pick; [`calibrate::builtin_for`] returns the
//!   built-in calibration for a placement (today only ranks sharing one
//!   H200, `calib/h200-1gpu-8ranks.json`).
//! - [`search`]: ring search and the double binary tree.
//! - [`netdev`]: a network device (a net plugin's, or the built-in TCP's
//!   interface) as a NIC of the graph ([`Topology::with_net_device`]);
//!   [`NetPlacement::device`] carries it into [`Policy::network`]'s prices.
#![forbid(unsafe_code)]
#![doc = include_str!("MODEL.md")]

pub mod calibrate;
pub mod consts;
pub mod detect;
pub mod driver;
pub mod error;
pub mod graph;
pub mod model;
pub mod netdev;
pub mod paths;
pub mod policy;
pub mod presets;
pub mod report;
pub mod search;
pub mod select;
pub mod shape;
pub mod xml;

pub use driver::{DriverFacts, DriverGpu, P2pFacts};
pub use error::{Result, TopoError};
pub use graph::{Attrs, LinkKind, Node, NodeId, NodeKind, NvLinkGen, Topology};
pub use netdev::NetDevice;
pub use paths::{Path, PathClass};
pub use policy::{Launcher, NetPlacement, Policy};
pub use select::{Choice, Selector, Transport};
