//! One shared-memory region of a clique of processes on this host, for
//! records every rank reads and writes (the facade's call check keeps its
//! fingerprints there), with a futex to sleep on a word of it.
//!
//! Rank 0 creates an anonymous `memfd` (no name in any file system: the
//! memory goes with the last process that maps it, crashed or not) and
//! sends it to every peer through the bootstrap's fd mailbox; all map it.

use std::os::fd::AsFd;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use oxccl_bootstrap::Bootstrap;
use rustix::event::Timespec;
use rustix::thread::futex;

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
            Segment::map(fd, len)?
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

/// Sleeps while `word` (in a region shared between processes) holds
/// `seen`, at most `timeout`; returns early on [`futex_wake_all`], a
/// signal, or when the word already moved.
pub fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // Not FUTEX_PRIVATE: the sleepers are in other processes.
    let _ = futex::wait(word, futex::Flags::empty(), seen, Some(&ts));
}

/// Wakes every process sleeping on `word` in [`futex_wait`].
pub fn futex_wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_futex_sleeper_wakes_when_woken() {
        let word = AtomicU32::new(0);
        // A word that already moved returns at once.
        futex_wait(&word, 1, Duration::from_secs(60));
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                word.store(1, Ordering::SeqCst);
                futex_wake_all(&word);
            });
            while word.load(Ordering::SeqCst) == 0 {
                futex_wait(&word, 0, Duration::from_secs(60));
            }
        });
        // A lost wake-up would have slept the whole minute.
        assert!(t.elapsed() < Duration::from_secs(50));
    }
}
