//! The fabric as the compiler, the executor and the hop measurement see
//! it: [`FabricView`] and [`Executes`] for [`HostFabric`], each method its
//! own of the same name (kept apart from `fabric.rs`, which names only the
//! traits' module, so the files stay layered).

use std::sync::Arc;
use std::time::Duration;

use crossbeam::sync::Parker;
use oxccl_core::plan::{Rank, RankPlan};
use oxccl_core::{DataType, RedOp};

use crate::config::HostConfig;
use crate::error::HostError;
use crate::fabric::HostFabric;
use crate::fifo::Link;
use crate::remote::{RemoteAccess, RemoteFault};
use crate::view::{BlockedAt, Executes, FabricView};
use crate::HostBuf;

/// Each method is `HostFabric`'s own of the same name.
impl FabricView for HostFabric {
    fn nranks(&self) -> u32 {
        HostFabric::nranks(self)
    }
    fn config(&self) -> &HostConfig {
        HostFabric::config(self)
    }
    fn max_channels(&self) -> usize {
        HostFabric::max_channels(self)
    }
    fn link(&self, channel: usize, from: Rank, to: Rank) -> Arc<Link> {
        HostFabric::link(self, channel, from, to)
    }
    fn shared_heap(&self) -> bool {
        HostFabric::shared_heap(self)
    }
    fn alloc_shared(&self, bytes: usize) -> Result<*mut u8, HostError> {
        HostFabric::alloc_shared(self, bytes)
    }
    fn free_shared(&self, ptr: *mut u8) {
        HostFabric::free_shared(self, ptr)
    }
    fn arm(&self) -> u32 {
        HostFabric::arm(self)
    }
    fn park(&self, parker: &Parker, seen: u32, timeout: Duration) {
        HostFabric::park(self, parker, seen, timeout)
    }
    fn spin(&self) -> u32 {
        HostFabric::spin(self)
    }
    fn wake(&self, rank: Rank) {
        HostFabric::wake(self, rank)
    }
    fn deadline(&self) -> Duration {
        HostFabric::deadline(self)
    }
    fn is_broken(&self) -> bool {
        HostFabric::is_broken(self)
    }
    fn fail(&self, reason: String) {
        HostFabric::fail(self, reason)
    }
    fn stop_error(&self, me: Rank) -> Option<HostError> {
        HostFabric::stop_error(self, me)
    }
    fn dead_peer_error(&self, at: BlockedAt) -> Option<HostError> {
        HostFabric::dead_peer_error(self, at)
    }
    fn absent(&self, call: u64) -> Vec<Rank> {
        HostFabric::absent(self, call)
    }
    fn remote(&self, peer: Rank, a: &RemoteAccess) -> Result<usize, RemoteFault> {
        HostFabric::remote(self, peer, a)
    }
}

impl Executes for HostFabric {
    unsafe fn execute_f32(&self, plan: &RankPlan, bufs: &[HostBuf]) -> Result<(), HostError> {
        let op = RedOp::Sum.lower(DataType::F32, plan.nranks);
        // SAFETY: the caller keeps `execute`'s contract (this one's).
        unsafe { HostFabric::execute(self, plan, bufs, DataType::F32, &op) }.map(|_| ())
    }
}
