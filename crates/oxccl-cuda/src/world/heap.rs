//! A rank's heap when ranks are processes: one `cuMemAlloc` arena made at
//! creation, exported by IPC and mapped by every peer process, out of
//! which the rank's user buffers ([`World::alloc`]) and scratch areas are
//! carved. Direct (registered) plans need every rank to reach every other
//! rank's buffers; a buffer of another process can be reached only if it
//! lies in memory that process shared, and sharing happens once, at
//! creation (an `alloc` is one rank's call: no peer is there to open a new
//! handle). So the arena is fixed; an `alloc` past its end fails with an
//! error naming `OXCCL_PROC_HEAP`.
//!
//! Kernels publish buffer addresses as their own process sees them; a peer
//! adds the heap's delta (its mapping here minus the owner's address)
//! before using one (`OxDesc::heap_delta`).
//!
//! Carving is a bump pointer: memory comes back through the pool of
//! [`World::free`] (by size class), never to the arena.

use std::sync::Mutex;

use crate::driver::DevMem;
use crate::error::{CudaError, Result};

use super::lock;

/// Carving alignment (the pool's smallest class).
const ALIGN: usize = 256;

/// The variable that sets the heap's bytes (K/M/G suffixes), read by the
/// facade.
pub const HEAP_VAR: &str = "OXCCL_PROC_HEAP";

/// A rank's arena and how much of it is handed out.
#[derive(Debug)]
pub(super) struct Heap {
    arena: DevMem,
    used: Mutex<usize>,
}

impl Heap {
    pub(super) fn new(arena: DevMem) -> Heap {
        Heap {
            arena,
            used: Mutex::new(0),
        }
    }

    /// The arena's base in this process.
    pub(super) fn base(&self) -> u64 {
        self.arena.ptr
    }

    /// Whether `[start, end)` lies in the arena.
    pub(super) fn contains(&self, start: u64, end: u64) -> bool {
        start >= self.arena.ptr && end <= self.arena.ptr + self.arena.bytes as u64
    }

    pub(super) fn arena(&self) -> &DevMem {
        &self.arena
    }

    /// `bytes` of the arena not handed out before (contents undefined).
    pub(super) fn carve(&self, rank: u32, bytes: usize) -> Result<DevMem> {
        let mut used = lock(&self.used);
        let Some((at, end)) = place(*used, bytes, self.arena.bytes) else {
            return Err(CudaError::Invalid(format!(
                "rank {rank}'s heap shared with its peer processes is full: {bytes} bytes \
                 asked, {} of {} in use; set {HEAP_VAR} (bytes, K/M/G) larger",
                *used, self.arena.bytes
            )));
        };
        let part = self.arena.part(at, bytes)?;
        *used = end;
        Ok(part)
    }
}

/// Where `bytes` go in an arena of `cap` bytes whose first `used` are
/// handed out: `(start, new used)`, or `None` when they do not fit.
fn place(used: usize, bytes: usize, cap: usize) -> Option<(usize, usize)> {
    let at = used.checked_next_multiple_of(ALIGN)?;
    let end = at.checked_add(bytes).filter(|&e| e <= cap)?;
    Some((at, end))
}

/// The default heap of a rank: an eighth of its device's memory shared by
/// the ranks on that device, between 256 MiB and 8 GiB, in 2 MiB units.
pub fn default_heap_bytes(device_bytes: usize, ranks_here: u32) -> usize {
    let share = device_bytes / 8 / ranks_here.max(1) as usize;
    let b = share.clamp(256 << 20, 8 << 30);
    b / (2 << 20) * (2 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_aligns_and_stops_at_the_end() {
        assert_eq!(place(0, 100, 1024), Some((0, 100)));
        assert_eq!(place(100, 100, 1024), Some((256, 356)));
        assert_eq!(place(356, 512, 1024), Some((512, 1024)));
        assert_eq!(place(356, 513, 1024), None);
        assert_eq!(place(1024, 0, 1024), Some((1024, 1024)));
        assert_eq!(place(usize::MAX - 3, 1, usize::MAX), None);
        assert_eq!(place(0, usize::MAX, 1024), None);
    }

    #[test]
    fn default_heap_is_a_share_within_bounds() {
        let h200 = 143_771_369_472usize;
        let b = default_heap_bytes(h200, 8);
        assert!(b > 2 << 30 && b < 3 << 30, "{b}");
        assert_eq!(b % (2 << 20), 0);
        assert_eq!(default_heap_bytes(h200, 1), 8 << 30);
        assert_eq!(default_heap_bytes(1 << 30, 64), 256 << 20);
        assert_eq!(default_heap_bytes(h200, 0), 8 << 30);
    }
}
