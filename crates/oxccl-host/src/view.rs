//! [`FabricView`]: what the plan compiler and the executor use of the
//! fabric they run on, and [`Executes`]: what the network hop's
//! measurement runs its plan with. The fabric implements it (`fabric.rs`); the compiler
//! and the executor sit below the fabric and name only this, so the files
//! form layers.

use std::sync::Arc;
use std::time::Duration;

use crossbeam::sync::Parker;
use oxccl_core::plan::{Rank, RankPlan};

use crate::config::HostConfig;
use crate::error::HostError;
use crate::fifo::Link;
use crate::remote::{RemoteAccess, RemoteFault};
use crate::HostBuf;

/// A rank's call numbers: every call (`call`, for diagnoses), and calls
/// with semaphore steps (`synced`, 0 for a call without), which remote
/// steps are matched by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Calls {
    pub call: u64,
    pub synced: u64,
}

/// The fabric as the compiler and the executor see it (see
/// `HostFabric`'s methods of the same names for what each does).
pub(crate) trait FabricView {
    // The compiler's part.
    fn nranks(&self) -> u32;
    fn config(&self) -> &HostConfig;
    fn max_channels(&self) -> usize;
    fn link(&self, channel: usize, from: Rank, to: Rank) -> Arc<Link>;
    fn shared_heap(&self) -> bool;
    fn alloc_shared(&self, bytes: usize) -> Result<*mut u8, HostError>;
    fn free_shared(&self, ptr: *mut u8);
    // The executor's part.
    fn arm(&self) -> u32;
    fn park(&self, parker: &Parker, seen: u32, timeout: Duration);
    fn spin(&self) -> u32;
    fn wake(&self, rank: Rank);
    fn deadline(&self) -> Duration;
    fn is_broken(&self) -> bool;
    fn fail(&self, reason: String);
    fn stop_error(&self, me: Rank) -> Option<HostError>;
    fn dead_peer_error(&self, at: BlockedAt) -> Option<HostError>;
    fn absent(&self, call: u64) -> Vec<Rank>;
    fn remote(&self, peer: Rank, a: &RemoteAccess) -> Result<usize, RemoteFault>;
}

/// Where a rank is blocked: on `peer`, at `step` of `channel`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockedAt {
    pub me: Rank,
    pub peer: Rank,
    pub channel: usize,
    pub step: usize,
}

/// Runs one rank's plan (the fabric's `execute`, for code below the
/// fabric that needs a whole call: the network hop's measurement).
pub(crate) trait Executes {
    /// Runs `plan` on `bufs` of f32 (a sum where it reduces), dropping
    /// the statistics.
    ///
    /// # Safety
    /// As `HostFabric::execute`: each `HostBuf` points to `bytes` valid
    /// bytes for the whole call, aligned for f32, touched by no one else
    /// during the call.
    unsafe fn execute_f32(&self, plan: &RankPlan, bufs: &[HostBuf]) -> Result<(), HostError>;
}
