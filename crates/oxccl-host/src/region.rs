//! One shared-memory region of a clique of processes on this host, for
//! records every rank reads and writes (the facade's call check keeps its
//! fingerprints there; [`crate::Bell`] sleeps on a word of it).
//!
//! Rank 0 creates an anonymous `memfd` (no name in any file system: the
//! memory goes with the last process that maps it, crashed or not) and
//! sends it to every peer through the bootstrap's fd mailbox; all map it.

use std::os::fd::AsFd;
use std::time::Instant;

use oxccl_bootstrap::Bootstrap;

use crate::error::HostError;
use crate::shm::Segment;

/// A zero-filled mapping of `len` bytes shared by every rank of a clique.
#[derive(Debug)]
pub struct SharedRegion {
    seg: Segment,
    len: usize,
}

impl SharedRegion {
    /// Every rank of `boot` calls this with the same `tag` (one tag per
    /// region of a clique) and `len`: rank 0 makes the region, the others
    /// map it. Needs every rank on this host.
    pub fn exchange(boot: &Bootstrap, tag: u64, len: usize) -> Result<SharedRegion, HostError> {
        if !boot.all_local() {
            return Err(HostError::Shm(
                "a shared region needs every rank on this machine".into(),
            ));
        }
        let deadline = Instant::now() + boot.limit();
        let seg = if boot.rank() == 0 {
            let (seg, fd) = Segment::create(len, 0)?;
            for p in 1..boot.nranks() {
                boot.mailbox().send(p, tag, &[fd.as_fd()], deadline)?;
            }
            seg
        } else {
            let fds = boot.mailbox().recv(0, tag, deadline)?;
            let fd = fds
                .first()
                .ok_or_else(|| HostError::Shm("rank 0 sent no shared region".into()))?;
            Segment::map(fd, len, boot.rank(), 0)?
        };
        Ok(SharedRegion { seg, len })
    }

    /// The region's first byte in this process (page-aligned).
    pub fn base(&self) -> *mut u8 {
        self.seg.base()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
