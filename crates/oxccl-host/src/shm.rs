//! Shared-memory segments for ranks in different processes of one host.
//!
//! Each rank owns one segment: an anonymous `memfd` (no name in any file
//! system, so nothing can be left behind: the memory goes when the last
//! process holding a mapping exits, crashed or not), sent to every peer
//! over the bootstrap's fd mailbox and mapped by all. Its layout:
//!
//! | offset | what |
//! | --- | --- |
//! | 0 | [`GlobalCtl`] (used in rank 0's segment only): failed flag, first failure's reason |
//! | [`RANK_CTL`] | [`RankCtl`] of the owner: call counter, in-call flag, doorbell, published buffers |
//! | [`LINKS`] | inbound links, one per (channel, sender): counters, lengths, then the slots |
//! | after the links | the owner's heap: registered buffers and scratch, carved by [`Heap`] |
//!
//! The segment is sized once (sparse: untouched pages cost nothing), so
//! no address ever moves and every process computes the same offsets.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crossbeam::utils::CachePadded;
use rustix::fs::{
    fallocate, fcntl_add_seals, fcntl_get_seals, ftruncate, memfd_create, FallocateFlags, FileType,
    MemfdFlags, SealFlags,
};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

use crate::error::HostError;

/// Most channels a plan may use across processes (the facade's limit).
pub(crate) const MAX_CHANNELS: usize = 32;
/// Buffers a rank publishes per call for peers' remote steps.
pub(crate) const MAX_PUB: usize = 256;
const PAGE: usize = 4096;
pub(crate) const RANK_CTL: usize = 1024;
pub(crate) const LINKS: usize = 16 << 10;
/// Bytes for a link's counters and slot lengths, before its slots.
const LINK_HDR: usize = PAGE;
/// Most slots per link (their lengths must fit the header page).
pub(crate) const MAX_SLOTS: usize = (LINK_HDR - size_of::<LinkCtr>()) / 8;

/// Seals every segment carries: its size is fixed (punching freed heap
/// pages out stays allowed: that changes no size).
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Failure state shared by every rank.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct GlobalCtl {
    pub broken: AtomicU32,
    /// 0 free, 1 being written, 2 written.
    pub reason_state: AtomicU32,
    pub reason_len: AtomicU32,
    pub reason: [AtomicU64; 100],
}

/// One rank's state that peers read.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct RankCtl {
    /// Calls this rank has started.
    pub joined: AtomicU64,
    /// Non-zero while the rank is inside a call.
    pub active: AtomicU32,
    /// Bumped by every peer that may have unblocked this rank.
    pub doorbell: AtomicU32,
    /// Non-zero while the rank sleeps on its doorbell.
    pub sleeping: AtomicU32,
    pub pub_n: AtomicU32,
    /// The call whose buffers `pub_bufs` holds (stored last, Release).
    pub pub_call: AtomicU64,
    /// Per buffer: heap offset + 1 (0: not in the heap, not addressable
    /// by peers) and length in elements.
    pub pub_bufs: [[AtomicU64; 2]; MAX_PUB],
}

/// A link's counters (see `fifo`), each on its own cache line.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct LinkCtr {
    pub tail: CachePadded<AtomicU64>,
    pub head: CachePadded<AtomicU64>,
    pub posted: CachePadded<AtomicU64>,
    pub consumed: CachePadded<AtomicU64>,
}

const _: () = assert!(size_of::<GlobalCtl>() <= RANK_CTL);
const _: () = assert!(RANK_CTL + size_of::<RankCtl>() <= LINKS);

/// Offsets of one segment for `nranks` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub nranks: usize,
    pub slots: usize,
    pub stride: usize,
    pub link_bytes: usize,
    pub heap: usize,
    pub total: usize,
}

impl Layout {
    pub fn new(nranks: usize, slots: usize, stride: usize, heap_bytes: usize) -> Layout {
        let link_bytes = (LINK_HDR + slots * stride).next_multiple_of(PAGE);
        let heap = LINKS + MAX_CHANNELS * nranks * link_bytes;
        Layout {
            nranks,
            slots,
            stride,
            link_bytes,
            heap,
            total: heap + heap_bytes.next_multiple_of(PAGE),
        }
    }

    /// Offset of the link from `from` on `channel`, in the receiver's segment.
    pub fn link(&self, channel: usize, from: usize) -> usize {
        LINKS + (channel * self.nranks + from) * self.link_bytes
    }

    pub fn link_lens(&self, link: usize) -> usize {
        link + size_of::<LinkCtr>()
    }

    pub fn link_slots(&self, link: usize) -> usize {
        link + LINK_HDR
    }
}

/// A mapped segment.
#[derive(Debug)]
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    /// Kept by the owner only, to punch freed heap ranges out.
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain shared memory; every concurrent access to
// it goes through atomics or is ordered by the FIFO and signal protocols.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn sys(what: &str, e: rustix::io::Errno) -> HostError {
    HostError::Shm(format!("{what}: {e}"))
}

impl Segment {
    /// A new zero-filled segment of `len` bytes, and its fd to send peers.
    /// Its size is sealed: no process can shrink it under a peer's mapping
    /// (which would turn that peer's next access into a SIGBUS).
    pub fn create(len: usize, rank: u32) -> Result<(Segment, OwnedFd), HostError> {
        let fd = memfd_create(
            format!("oxccl-host-rank{rank}"),
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| sys("memfd_create", e))?;
        ftruncate(&fd, len as u64).map_err(|e| sys("sizing a shared segment", e))?;
        fcntl_add_seals(&fd, SEALS).map_err(|e| sys("sealing a shared segment", e))?;
        let mut seg = Segment::map_fd(&fd, len)?;
        let send = fd
            .try_clone()
            .map_err(|e| HostError::Shm(format!("dup: {e}")))?;
        seg.fd = Some(fd);
        Ok((seg, send))
    }

    /// Maps the segment rank `peer` sent rank `me` (its fd), once checked:
    /// a memfd (a regular file) of at least `len` bytes whose size is
    /// sealed. Anything else is [`HostError::Corrupt`], naming the peer.
    pub fn map(fd: &impl AsFd, len: usize, me: u32, peer: u32) -> Result<Segment, HostError> {
        let bad = |detail: String| HostError::Corrupt {
            rank: me,
            peer,
            detail,
        };
        let st = rustix::fs::fstat(fd).map_err(|e| bad(format!("fstat of its segment: {e}")))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(bad(format!(
                "its segment is a {:?}, not a memfd",
                FileType::from_raw_mode(st.st_mode)
            )));
        }
        if u64::try_from(st.st_size).map_or(true, |s| s < len as u64) {
            return Err(bad(format!(
                "its segment has {} bytes, the layout needs {len}",
                st.st_size
            )));
        }
        let seals =
            fcntl_get_seals(fd).map_err(|e| bad(format!("its segment has no seals: {e}")))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(bad(
                "its segment's size is not sealed (it could shrink under this rank's mapping)"
                    .into(),
            ));
        }
        Segment::map_fd(fd, len)
    }

    /// Maps `len` bytes of `fd`, shared.
    fn map_fd(fd: &impl AsFd, len: usize) -> Result<Segment, HostError> {
        // SAFETY: a fresh shared mapping of a file we hold; nothing else in
        // this process uses that address range.
        let base = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::NORESERVE,
                fd,
                0,
            )
        }
        .map_err(|e| sys("mapping a shared segment", e))?;
        Ok(Segment {
            base: base.cast(),
            len,
            fd: None,
        })
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// A reference to the `T` at `off`.
    ///
    /// # Safety
    /// `off` must be a `T`-aligned offset of the layout where a `T` lives
    /// (zero bytes are a valid `T` for every control struct here).
    pub unsafe fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + size_of::<T>() <= self.len);
        // SAFETY: caller's contract; the mapping lives as long as `self`.
        unsafe { &*self.base.add(off).cast::<T>() }
    }

    /// Gives the pages of `[off, off + len)` back to the system (the range
    /// reads as zeros afterwards). Owner only; best effort.
    pub fn punch(&self, off: usize, len: usize) {
        if let Some(fd) = &self.fd {
            let _ = fallocate(
                fd,
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                off as u64,
                len as u64,
            );
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; nothing
        // borrows the mapping once its fabric is dropped.
        unsafe {
            let _ = munmap(self.base.cast(), self.len);
        }
    }
}

/// First-fit allocator over the owner's heap range (offsets relative to
/// the segment). Page-granular, so freed ranges can be punched out.
#[derive(Debug)]
pub(crate) struct Heap {
    /// Free ranges: start → length, coalesced.
    free: BTreeMap<usize, usize>,
    used: BTreeMap<usize, usize>,
}

impl Heap {
    pub fn new(start: usize, end: usize) -> Heap {
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Heap {
            free,
            used: BTreeMap::new(),
        }
    }

    pub fn alloc(&mut self, bytes: usize) -> Option<usize> {
        let need = bytes.max(1).next_multiple_of(PAGE);
        let (&at, &len) = self.free.iter().find(|(_, &l)| l >= need)?;
        self.free.remove(&at);
        if len > need {
            self.free.insert(at + need, len - need);
        }
        self.used.insert(at, need);
        Some(at)
    }

    /// Frees the block at `at`; returns its length (None: not allocated).
    pub fn free(&mut self, at: usize) -> Option<usize> {
        let len = self.used.remove(&at)?;
        let (mut start, mut size) = (at, len);
        if let Some((&p, &pl)) = self.free.range(..at).next_back() {
            if p + pl == at {
                self.free.remove(&p);
                start = p;
                size += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(at + len)) {
            self.free.remove(&(at + len));
            size += nl;
        }
        self.free.insert(start, size);
        Some(len)
    }

    /// The allocated block holding `[at, at + len)`, if one does.
    pub fn contains(&self, at: usize, len: usize) -> bool {
        self.used
            .range(..=at)
            .next_back()
            .is_some_and(|(&s, &l)| at + len <= s + l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_reuses_and_coalesces() {
        let mut h = Heap::new(PAGE, 11 * PAGE);
        let a = h.alloc(1).unwrap();
        let b = h.alloc(PAGE + 1).unwrap();
        let c = h.alloc(3 * PAGE).unwrap();
        assert_eq!((a, b, c), (PAGE, 2 * PAGE, 4 * PAGE));
        assert!(h.contains(b + 10, PAGE) && !h.contains(b, 3 * PAGE));
        assert!(h.alloc(5 * PAGE).is_none(), "only 4 pages left");
        assert_eq!(h.free(b), Some(2 * PAGE));
        assert_eq!(h.free(b), None);
        assert_eq!(h.free(a), Some(PAGE));
        // a and b coalesced: three pages at the start.
        assert_eq!(h.alloc(3 * PAGE), Some(PAGE));
        h.free(c);
        assert_eq!(h.alloc(7 * PAGE), Some(4 * PAGE));
    }

    #[test]
    fn a_segment_is_shared_between_two_mappings() {
        let lay = Layout::new(2, 4, 4096, 1 << 20);
        let (seg, fd) = Segment::create(lay.total, 0).unwrap();
        let peer = Segment::map(&fd, lay.total, 1, 0).unwrap();
        // SAFETY: RANK_CTL holds a RankCtl in every segment.
        let (a, b) = unsafe { (seg.at::<RankCtl>(RANK_CTL), peer.at::<RankCtl>(RANK_CTL)) };
        a.joined.store(7, std::sync::atomic::Ordering::Release);
        assert_eq!(b.joined.load(std::sync::atomic::Ordering::Acquire), 7);
        let too_big = Segment::map(&fd, lay.total * 2, 1, 0).unwrap_err();
        assert!(
            matches!(
                too_big,
                HostError::Corrupt {
                    rank: 1,
                    peer: 0,
                    ..
                }
            ),
            "{too_big}"
        );
        // The owner cannot shrink it under its peers.
        assert!(ftruncate(&fd, PAGE as u64).is_err());
        // Freed heap pages can still be given back.
        seg.punch(lay.heap, PAGE);
    }

    #[test]
    fn a_segment_that_is_not_a_sealed_memfd_of_the_right_size_is_refused() {
        let want = 16 * PAGE;
        let named = |e: HostError| match e {
            HostError::Corrupt {
                rank: 2,
                peer: 5,
                detail,
            } => detail,
            e => panic!("not an error naming peer 5: {e}"),
        };
        // Unsealed: could shrink under the mapping.
        let fd = memfd_create("test-unsealed", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, want as u64).unwrap();
        let d = named(Segment::map(&fd, want, 2, 5).unwrap_err());
        assert!(d.contains("not sealed"), "{d}");
        // Sealed but short.
        let fd = memfd_create(
            "test-short",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .unwrap();
        ftruncate(&fd, PAGE as u64).unwrap();
        fcntl_add_seals(&fd, SEALS).unwrap();
        let d = named(Segment::map(&fd, want, 2, 5).unwrap_err());
        assert!(d.contains("4096 bytes"), "{d}");
        // Not a regular file at all.
        let (sock, _other) = std::os::unix::net::UnixStream::pair().unwrap();
        let d = named(Segment::map(&sock, want, 2, 5).unwrap_err());
        assert!(d.contains("not a memfd"), "{d}");
    }
}
