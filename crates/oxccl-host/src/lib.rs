//! oxccl-host: the CPU backend. Ranks are threads of one process; every
//! connection is a shared-memory FIFO with NCCL's head/tail counters.
//!
//! A [`HostFabric`] holds what one communicator's ranks share. Each rank's
//! thread calls [`HostFabric::execute`] with its part of a plan from
//! `oxccl_core::gen`; the fabric runs the same plans as the reference
//! interpreter (`oxccl_core::interp`), with real concurrency. Only the
//! Simple protocol is built (the facade offers nothing else here).
//!
//! Ranks may also be processes of one host
//! ([`HostFabric::across_processes`], met through an
//! `oxccl_bootstrap::Bootstrap`): the same plans and executor, with the
//! FIFOs, control words and registered buffers in `memfd` segments every
//! rank maps, futex doorbells instead of thread parking, and a pidfd
//! watcher that fails the fabric naming a peer whose process died. Ranks
//! on different hosts (or forced with `NCCL_P2P_DISABLE=1
//! NCCL_SHM_DISABLE=1`) talk over `oxccl_net` instead: the same FIFOs in
//! each process, carried between them by a proxy thread. See
//! `docs/ARCHITECTURE.md` (section `oxccl-host`) for the FIFO layout, the
//! waiting policy and the invariants.
#![doc = include_str!("BACKEND.md")]

mod bell;
mod compile;
mod config;
mod error;
mod exec;
mod fabric;
mod fifo;
#[doc(hidden)]
pub mod fuzz;
mod kernel;
mod landing;
mod net;
mod oneshot;
mod procs;
mod program_cache;
mod reason;
mod region;
mod remote;
mod shm;
mod view;
mod view_impl;
mod widened;

#[cfg(test)]
mod corrupt_tests;

pub use bell::{futex_wait, futex_wake_all, Bell};
pub use config::{HostConfig, MAX_NET_CHANNELS};
pub use error::HostError;
pub use exec::ExecStats;
pub use fabric::HostFabric;
pub use net::{ProxyEvents, StepState};
pub use oneshot::{ll_flag, OneShotLl};
/// The network transport's settings and errors, as [`HostConfig`] takes them.
pub use oxccl_net::{config::SocketSettings, NetError};
pub use region::SharedRegion;

/// `acc[i] = acc[i] (base) src[i]` as the reductions fold f16, bf16 and
/// fp8 blocks (`false`, nothing done, for other types); public only so
/// `examples/fold_speed.rs` can time it alone. Not part of the API.
#[doc(hidden)]
pub fn fold_narrow<T: oxccl_core::Element>(
    acc: &mut [T],
    src: &[T],
    base: oxccl_core::BaseOp,
) -> bool {
    widened::fold(acc, src, base)
}

/// One caller buffer of a call: `bytes` bytes at `ptr`. One per entry of
/// the plan's `bufs`, scratch buffers excepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostBuf {
    pub ptr: *mut u8,
    pub bytes: usize,
}

// SAFETY: a `HostBuf` is only an address and a length; dereferencing it is
// gated by the `unsafe` contract of `HostFabric::execute`.
unsafe impl Send for HostBuf {}
// SAFETY: as above.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// A buffer over a slice (input buffers are never written by the fabric).
    pub fn from_slice<T>(s: &[T]) -> HostBuf {
        HostBuf {
            ptr: s.as_ptr().cast_mut().cast(),
            bytes: size_of_val(s),
        }
    }

    /// A buffer over a mutable slice.
    pub fn from_mut_slice<T>(s: &mut [T]) -> HostBuf {
        HostBuf {
            ptr: s.as_mut_ptr().cast(),
            bytes: size_of_val(s),
        }
    }
}
