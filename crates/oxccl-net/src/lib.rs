//! oxccl-net: the transport between hosts.
//!
//! - [`Net`]: the interface, shaped like NCCL's network plugin API
//!   (`ncclNet_v8`): devices and properties, listen/connect/accept,
//!   memory registration, non-blocking isend/irecv completed by test.
//! - [`TcpNet`]: its TCP implementation (NCCL's `Socket` transport):
//!   every connection is `NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD`
//!   sockets driven by helper threads, each message split over them; every
//!   socket starts with the communicator's magic and a MAC proving the
//!   communicator's key ([`wire::Hello`]; listeners drop strangers,
//!   garbage and silence without failing), and a stalled socket fails its
//!   connection after the deadline.
//! - [`plugin`]: NCCL's network plugins (`ncclNet` v8 to v12) loaded
//!   behind the same interface, chosen by `NCCL_NET_PLUGIN`/`NCCL_NET`.
//! - [`config`]: the knobs, and whether the environment forces ranks of
//!   one host onto the network (`NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`).
//!
//! The host backend (`oxccl-host`) carries its plans' FIFO messages over
//! it between processes; see `NET.md` for the design, the plugin host, and
//! how GPU data is staged.
#![doc = include_str!("NET.md")]

mod api;
pub mod config;
mod error;
mod ids;
pub mod plugin;
mod stream;
mod tcp;
pub mod wire;

pub use api::{
    Buf, Comm, ListenComm, MemHandle, MemKind, Net, NetHandle, Posted, Properties, RecvComm,
    Region, Request, SendComm, HANDLE_BYTES,
};
pub use config::TcpConfig;
pub use error::{NetError, WireError};
pub use plugin::PluginNet;
pub use stream::{stream_throughput, streams_throughput};
pub use tcp::{TcpNet, Waker};
pub use wire::Handle;
