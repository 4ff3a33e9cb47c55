//! Each communicator's stand-in for buffers its rank ignores: NCCL lets a
//! non-root pass anything (even nothing) as Broadcast's and Scatter's send
//! buffer and Reduce's and Gather's receive buffer, but plans declare
//! every buffer on every rank. Such a buffer, when the caller's will not
//! do, is bound to this backend memory instead, so the caller's is never
//! touched.

use std::sync::Arc;

use crate::backend::{Backend, RawBuf};
use crate::error::Result;

/// Backend allocations of one rank, grown by doubling and freed only with
/// the communicator: a launch still queued on CUDA may use an older one,
/// so none is returned to the pool (where a user buffer could reuse it)
/// while the communicator lives.
#[derive(Debug)]
pub(crate) struct Sinks {
    backend: Arc<dyn Backend>,
    rank: u32,
    bufs: Vec<RawBuf>,
}

impl Sinks {
    pub fn new(backend: Arc<dyn Backend>, rank: u32) -> Sinks {
        Sinks {
            backend,
            rank,
            bufs: Vec::new(),
        }
    }

    /// `bytes` bytes of this rank's backend memory nobody else uses.
    pub fn get(&mut self, bytes: usize) -> Result<RawBuf> {
        match self.bufs.last() {
            Some(b) if b.bytes >= bytes => Ok(b.sub(0, bytes)),
            last => {
                let size = bytes.max(last.map_or(0, |b| b.bytes * 2)).max(64);
                let b = self.backend.alloc(self.rank, size)?;
                self.bufs.push(b);
                Ok(b.sub(0, bytes))
            }
        }
    }
}

impl Drop for Sinks {
    fn drop(&mut self) {
        for b in self.bufs.drain(..) {
            // SAFETY: `b` came from `alloc` on this backend for `rank`, and
            // the communicator owning it is gone, so no call binds it again.
            unsafe { self.backend.free(self.rank, b) };
        }
    }
}
