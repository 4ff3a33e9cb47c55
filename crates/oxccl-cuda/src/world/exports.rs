//! Ranks as processes: the caller's own allocations (a framework's caching
//! allocator, `cudaMalloc`) shared with peer processes per call, so direct
//! plans run on them as on the heap (torch's tensors are not in
//! any heap of ours).
//!
//! A rank about to run a call on such memory asks [`World::share_range`]:
//! the allocation holding the range (found with `cuPointerGetAttributes`,
//! identified by its process-wide buffer id, so a freed and reallocated
//! address is a new allocation) gets a tag, 1 to [`LAST_TAG`], the first
//! time it is seen, and an export record (its legacy IPC handle and its
//! base here) that the facade puts where peers read it before the call's
//! launch (the call check orders it). A peer imports each record once
//! ([`World::import`]): it opens the handle and stores, on its stream
//! ahead of its next kernel, the delta from the owner's base to its own
//! mapping into its row of the delta table. Kernels publish addresses
//! with the tag in the top byte ([`World::tagged`]); a reader adds the
//! delta of that tag. The heap is tag 0; [`UNKNOWN_TAG`] and tags whose
//! import failed hold [`UNMAPPED`], which the kernel refuses with an
//! error naming the peer instead of touching a wrong address.
//!
//! Windows (`ncclCommWindowRegister`) take tags from the same count but
//! are mapped at registration instead ([`World::window_export`],
//! [`World::window_import`], [`World::window_publish`]): `ncclMemAlloc`'s
//! VMM memory, which legacy IPC cannot share, travels as a POSIX file
//! descriptor; once published, [`World::share_range`] answers for it
//! without a record.
//!
//! Tags are never reused: a clique shares at most [`LAST_TAG`]
//! allocations per rank, after which calls on new allocations run FIFO
//! plans, as do calls on an allocation made over addresses shared before
//! (a freed one's: peers still map it, and replacing that mapping made
//! kernels fault on the H200) and on allocations under 2 MiB. Mappings
//! stay open until the clique ends.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUpointer_attribute as P};

use crate::driver::check;
use crate::error::{CudaError, Result};
use crate::ipc::{export_base, Imported, HANDLE_BYTES};
use crate::layout::{MAPS, TAG_SHIFT, UNMAPPED};

use super::{lock, World};

/// Bytes of an export record: the IPC handle, then the allocation's base
/// and size in the owner's process (little-endian).
pub const EXPORT_BYTES: usize = HANDLE_BYTES + 16;
/// The last tag an allocation may get.
pub const LAST_TAG: u8 = (MAPS - 2) as u8;
/// The tag of an address that was never shared: always [`UNMAPPED`].
const UNKNOWN_TAG: u8 = (MAPS - 1) as u8;
const _: () = assert!(LAST_TAG < UNKNOWN_TAG && MAPS == 256);

/// A range of the caller's memory as this rank shares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    /// The allocation's tag (0: the rank's heap).
    pub tag: u8,
    /// The export record, the first time the allocation is shared: the
    /// facade publishes it as the tag's record before the call.
    pub record: Option<[u8; EXPORT_BYTES]>,
}

/// One allocation this rank shared.
#[derive(Clone, Copy, Debug)]
struct Mine {
    base: u64,
    end: u64,
    id: u64,
    tag: u8,
    /// A window's allocation, mapped by every peer at its registration
    /// (`World::window_publish`), rather than shared per call.
    window: bool,
}

/// Bytes of a window record: the tag, then the allocation's start and
/// size in the owner's process (little-endian).
pub const WINDOW_RECORD_BYTES: usize = 24;

/// This process's side of sharing.
#[derive(Debug, Default)]
pub(super) struct Exports {
    /// The allocations this rank shared and believes live.
    mine: Vec<Mine>,
    /// Tags handed out so far (the next is `given + 1`).
    given: u8,
    /// Peers' allocations mapped here, kept open until the clique ends.
    opened: Vec<Imported>,
    /// Peers' window allocations mapped here, kept until the clique ends.
    windows: Vec<crate::vmm::Import>,
    /// Set once the tags ran out (warned once).
    exhausted: bool,
}

/// The smallest allocation shared, and the alignment it must have: the
/// driver packs small `cuMemAlloc`s into 2 MiB regions, and legacy IPC
/// maps a region as a whole in the importer (the H200's importers got
/// neighbouring allocations at neighbouring addresses of one mapping), so
/// sharing only whole regions keeps one mapping per allocation and no two
/// handles into one region. Frameworks' caching allocators hand out memory
/// from segments of at least this size, which are shared; calls on
/// smaller allocations run FIFO plans.
const REGION: u64 = 2 << 20;

/// What the driver says of the allocation holding `ptr`.
struct Found {
    base: u64,
    size: u64,
    id: u64,
    ordinal: i32,
    ipc: bool,
}

fn find(ptr: u64) -> Result<Found> {
    let (mut base, mut size, mut id, mut ordinal, mut ipc) = (0u64, 0usize, 0u64, -1i32, 0u32);
    let mut attrs = [
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        P::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    ];
    let mut data: [*mut c_void; 5] = [
        (&mut base as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
        (&mut id as *mut u64).cast(),
        (&mut ordinal as *mut i32).cast(),
        (&mut ipc as *mut u32).cast(),
    ];
    // SAFETY: each out-pointer has its attribute's documented C type
    // (CUdeviceptr, size_t, unsigned long long, int, a boolean the driver
    // writes into a zeroed int); `ptr` is only looked up.
    unsafe {
        check(
            "cuPointerGetAttributes",
            sys::cuPointerGetAttributes(
                attrs.len() as u32,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr,
            ),
        )?
    };
    Ok(Found {
        base,
        size: size as u64,
        id,
        ordinal,
        ipc: ipc != 0,
    })
}

impl World {
    /// Makes `bytes` bytes at `ptr`, memory of `rank`'s device, reachable
    /// by peer processes' kernels for the coming call, where it can be:
    /// `None` when ranks are threads of one process, or the memory cannot
    /// be shared (not legacy-IPC capable: pool or VMM memory; another
    /// device; an allocation under 2 MiB (`REGION`); the tags ran out).
    /// See the module docs.
    pub fn share_range(&self, rank: u32, ptr: u64, bytes: usize) -> Result<Option<Shared>> {
        let Some(s) = self.shared.as_ref() else {
            return Ok(None);
        };
        let end = ptr.checked_add(bytes as u64).ok_or_else(|| {
            CudaError::Invalid(format!(
                "{bytes} bytes at {ptr:#x} overflow the address space"
            ))
        })?;
        if s.heap.contains(ptr, end) {
            return Ok(Some(Shared {
                tag: 0,
                record: None,
            }));
        }
        if let Some(m) = lock(&s.exports)
            .mine
            .iter()
            .rev()
            .find(|m| m.window && ptr >= m.base && end <= m.end)
        {
            // Every peer mapped this window at its registration.
            return Ok(Some(Shared {
                tag: m.tag,
                record: None,
            }));
        }
        let dev = self.dev(rank)?;
        dev.ctx.bind()?;
        let f = match find(ptr) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(ptr, error = %e, "oxccl: not memory the driver can share");
                return Ok(None);
            }
        };
        if !f.ipc
            || f.ordinal != dev.ctx.ordinal
            || end > f.base + f.size
            || f.size < REGION
            || !f.base.is_multiple_of(REGION)
        {
            return Ok(None);
        }
        let mut ex = lock(&s.exports);
        if let Some(m) = ex.mine.iter().find(|m| m.id == f.id) {
            return Ok(Some(Shared {
                tag: m.tag,
                record: None,
            }));
        }
        if ex.given >= LAST_TAG {
            if !ex.exhausted {
                ex.exhausted = true;
                tracing::warn!(
                    rank,
                    "oxccl: {LAST_TAG} allocations were shared with peer processes; calls on \
                     newer ones run FIFO plans (allocate long-lived buffers, or reuse them)"
                );
            }
            return Ok(None);
        }
        // An allocation the driver reports with a new id over addresses
        // shared before replaced a freed one. Peers still map the old one
        // (the driver then refuses to map the new one: ALREADY_MAPPED),
        // and closing the old mapping to open the new one made kernels
        // fault on the H200 (3 processes freeing and reallocating). So it
        // is not shared: calls on it run FIFO plans.
        let (base, stop) = (f.base, f.base + f.size);
        if ex.mine.iter().any(|m| m.base < stop && base < m.end) {
            tracing::debug!(
                rank,
                base,
                "oxccl: reallocated over a shared allocation: not shared"
            );
            return Ok(None);
        }
        // SAFETY: `f.base` is the base of the live, IPC-capable cuMemAlloc
        // allocation holding `ptr` in this context (the driver just said so).
        let handle = unsafe { export_base(f.base, &dev.ctx)? };
        ex.given += 1;
        let tag = ex.given;
        ex.mine.push(Mine {
            base,
            end: stop,
            id: f.id,
            tag,
            window: false,
        });
        tracing::debug!(
            rank,
            tag,
            base,
            size = f.size,
            id = f.id,
            "oxccl: sharing an allocation"
        );
        let mut record = [0u8; EXPORT_BYTES];
        record[..HANDLE_BYTES].copy_from_slice(&handle);
        record[HANDLE_BYTES..HANDLE_BYTES + 8].copy_from_slice(&base.to_le_bytes());
        record[HANDLE_BYTES + 8..].copy_from_slice(&f.size.to_le_bytes());
        Ok(Some(Shared {
            tag,
            record: Some(record),
        }))
    }

    /// `addr` with its allocation's tag in the top byte, as this rank's
    /// kernels publish it (unchanged when ranks are threads, and for the
    /// heap). An address never shared gets [`UNKNOWN_TAG`], so a peer
    /// reading through it fails with an error rather than at a wrong
    /// address.
    pub(super) fn tagged(&self, addr: u64) -> u64 {
        let Some(s) = self.shared.as_ref() else {
            return addr;
        };
        if addr == 0 || s.heap.contains(addr, addr) {
            return addr;
        }
        let ex = lock(&s.exports);
        let tag = ex
            .mine
            .iter()
            .rev()
            .find(|m| addr >= m.base && addr < m.end)
            .map_or(UNKNOWN_TAG, |m| m.tag);
        addr | (u64::from(tag) << TAG_SHIFT)
    }

    /// Maps `peer`'s allocation of export `record` (tag `tag`) into this
    /// process, for `rank`'s kernels: the delta goes into the table on
    /// `rank`'s stream, ahead of its next launch. A record that cannot be
    /// opened (its allocation already freed, say) leaves the tag
    /// unmapped: only a call that reads through it then fails.
    pub fn import(&self, rank: u32, peer: u32, tag: u8, record: &[u8]) -> Result<()> {
        let s = self
            .shared
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("import: ranks are not processes".into()))?;
        if tag == 0 || tag > LAST_TAG || peer >= self.nranks() || record.len() != EXPORT_BYTES {
            return Err(CudaError::Invalid(format!(
                "import: tag {tag} of rank {peer}, a {}-byte record",
                record.len()
            )));
        }
        if record[..HANDLE_BYTES].iter().all(|&b| b == 0) {
            // A tag given to a window: mapped at its registration
            // (`window_import`), so its slot on the board stays empty.
            return Ok(());
        }
        let dev = self.dev(rank)?;
        let word =
            |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap_or_default());
        let (theirs, size) = (word(HANDLE_BYTES), word(HANDLE_BYTES + 8));
        let opened = match Imported::open(&dev.ctx, &record[..HANDLE_BYTES]) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(
                    rank,
                    peer,
                    tag,
                    error = %e,
                    "oxccl: a peer's shared allocation could not be mapped here; a call that \
                     reads it will fail"
                );
                return Ok(());
            }
        };
        debug_assert_ne!(opened.ptr.wrapping_sub(theirs) as i64, UNMAPPED);
        let mapping = Mapping {
            rank,
            peer,
            tag,
            theirs,
            here: opened.ptr,
            size,
        };
        self.store_delta(mapping, "allocation")?;
        lock(&s.exports).opened.push(opened);
        Ok(())
    }

    /// Puts `m`'s delta (its address here less the peer's) into `m.rank`'s
    /// table entry for (`m.peer`, `m.tag`), on that rank's stream, ahead of
    /// its next launch; `what` names the allocation's kind in the log.
    fn store_delta(&self, m: Mapping, what: &str) -> Result<()> {
        let s = self
            .shared
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("a mapping: ranks are not processes".into()))?;
        let delta = m.here.wrapping_sub(m.theirs);
        let entry = s.delta.ptr + ((m.peer as usize * MAPS + m.tag as usize) * 8) as u64;
        tracing::debug!(
            rank = m.rank,
            peer = m.peer,
            tag = m.tag,
            theirs = m.theirs,
            size = m.size,
            here = m.here,
            "oxccl: mapped a peer's {what}"
        );
        // SAFETY: an entry of the delta table, which lives as long as the
        // clique.
        unsafe { self.rank(m.rank)?.stream.store_u64_async(entry, delta) }
    }
}

/// A peer's allocation mapped into this process for `rank`: `theirs` in
/// `peer`'s address space, `here` in this one.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    rank: u32,
    peer: u32,
    tag: u8,
    theirs: u64,
    here: u64,
    size: u64,
}

impl World {
    /// Ranks as processes: the allocation holding a window of `rank`
    /// (`bytes` bytes at `ptr`), exported for the peer processes to map at
    /// the window's registration: its file descriptor and a record of
    /// [`WINDOW_RECORD_BYTES`] (a new tag, the allocation's start and
    /// size). `None` where it cannot be: threads, memory other than
    /// `ncclMemAlloc`'s exportable VMM memory (`vmm::export_fd`), memory
    /// of another device, or the tags ran out. The tag is used only once
    /// [`World::window_publish`] says every peer mapped it.
    pub fn window_export(
        &self,
        rank: u32,
        ptr: u64,
        bytes: usize,
    ) -> Result<Option<(std::os::fd::OwnedFd, [u8; WINDOW_RECORD_BYTES])>> {
        let Some(s) = self.shared.as_ref() else {
            return Ok(None);
        };
        let dev = self.dev(rank)?;
        dev.ctx.bind()?;
        let Some((fd, base, size)) = crate::vmm::export_fd(ptr, bytes)? else {
            return Ok(None);
        };
        // The allocation must be on this rank's device.
        let mut attrs = [P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL];
        let mut ordinal = -1i32;
        let mut data: [*mut c_void; 1] = [(&mut ordinal as *mut i32).cast()];
        // SAFETY: DEVICE_ORDINAL is an int; `base` is only looked up.
        let known = unsafe {
            check(
                "cuPointerGetAttributes",
                sys::cuPointerGetAttributes(1, attrs.as_mut_ptr(), data.as_mut_ptr(), base),
            )
        };
        if known.is_ok() && ordinal != dev.ctx.ordinal {
            return Ok(None);
        }
        let mut ex = lock(&s.exports);
        if ex.given >= LAST_TAG {
            return Ok(None);
        }
        ex.given += 1;
        let mut rec = [0u8; WINDOW_RECORD_BYTES];
        rec[0] = ex.given;
        rec[8..16].copy_from_slice(&base.to_le_bytes());
        rec[16..24].copy_from_slice(&(size as u64).to_le_bytes());
        Ok(Some((fd, rec)))
    }

    /// Maps `peer`'s window allocation (its descriptor `fd` and record
    /// from [`World::window_export`]) for `rank`'s kernels: the delta to
    /// this mapping goes into the table on `rank`'s stream, ahead of its
    /// next launch. The mapping stays until the clique ends.
    pub fn window_import(
        &self,
        rank: u32,
        peer: u32,
        fd: &std::os::fd::OwnedFd,
        record: &[u8],
    ) -> Result<()> {
        let s = self
            .shared
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("window_import: ranks are not processes".into()))?;
        let (tag, theirs, size) = parse_window_record(record)?;
        if peer >= self.nranks() {
            return Err(CudaError::Invalid(format!("window_import: rank {peer}")));
        }
        let dev = self.dev(rank)?;
        let size = usize::try_from(size)
            .map_err(|_| CudaError::Invalid(format!("window_import: {size} bytes")))?;
        let m = crate::vmm::Import::open(&dev.ctx, fd, size)?;
        let mapping = Mapping {
            rank,
            peer,
            tag,
            theirs,
            here: m.ptr,
            size: size as u64,
        };
        self.store_delta(mapping, "window")?;
        lock(&s.exports).windows.push(m);
        Ok(())
    }

    /// Marks this rank's window allocation of `record` (from
    /// [`World::window_export`]) shared under its tag: every peer mapped
    /// it, so calls on it take the direct plans ([`World::share_range`]).
    pub fn window_publish(&self, record: &[u8]) -> Result<()> {
        let s = self
            .shared
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("window_publish: ranks are not processes".into()))?;
        let (tag, base, size) = parse_window_record(record)?;
        lock(&s.exports).mine.push(Mine {
            base,
            end: base + size,
            id: 0,
            tag,
            window: true,
        });
        Ok(())
    }

    /// Ends the sharing of `rank`'s window allocation holding `ptr`
    /// (deregistration): later calls on it are not shared through the
    /// window. Peers keep their mapping until the clique ends, so calls
    /// already enqueued on it stay valid.
    pub fn window_retire(&self, ptr: u64) {
        if let Some(s) = self.shared.as_ref() {
            let mut ex = lock(&s.exports);
            if let Some(i) = ex
                .mine
                .iter()
                .rposition(|m| m.window && ptr >= m.base && ptr < m.end)
            {
                ex.mine.remove(i);
            }
        }
    }
}

/// (tag, start, size) of a window record.
fn parse_window_record(record: &[u8]) -> Result<(u8, u64, u64)> {
    let bad = || CudaError::Invalid(format!("a window record of {} bytes", record.len()));
    if record.len() != WINDOW_RECORD_BYTES {
        return Err(bad());
    }
    let word = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap_or_default());
    let (tag, base, size) = (record[0], word(8), word(16));
    if tag == 0 || tag > LAST_TAG || size == 0 || base.checked_add(size).is_none() {
        return Err(bad());
    }
    Ok((tag, base, size))
}

/// The delta table's initial contents, `[nranks][MAPS]`: each peer's heap
/// delta at tag 0, [`UNMAPPED`] elsewhere; this rank's own row all 0 (its
/// own addresses are valid here).
pub(super) fn initial_table(me: usize, heap_deltas: &[i64]) -> Vec<u8> {
    let mut t = Vec::with_capacity(heap_deltas.len() * MAPS * 8);
    for (r, &d) in heap_deltas.iter().enumerate() {
        for tag in 0..MAPS {
            let v = match (r == me, tag) {
                (true, _) => 0,
                (false, 0) => d,
                (false, _) => UNMAPPED,
            };
            t.extend(v.to_le_bytes());
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_records_are_checked() {
        let rec = |tag: u8, base: u64, size: u64| {
            let mut r = [0u8; WINDOW_RECORD_BYTES];
            r[0] = tag;
            r[8..16].copy_from_slice(&base.to_le_bytes());
            r[16..24].copy_from_slice(&size.to_le_bytes());
            r
        };
        assert_eq!(
            parse_window_record(&rec(3, 0x7000_0000, 2 << 20)).unwrap(),
            (3, 0x7000_0000, 2 << 20)
        );
        assert!(parse_window_record(&rec(0, 0x7000_0000, 2 << 20)).is_err());
        assert!(parse_window_record(&rec(LAST_TAG + 1, 0x7000_0000, 2 << 20)).is_err());
        assert!(parse_window_record(&rec(3, 0x7000_0000, 0)).is_err());
        assert!(parse_window_record(&rec(3, u64::MAX - 8, 4096)).is_err());
        assert!(parse_window_record(&rec(3, 0x7000_0000, 4096)[..23]).is_err());
    }

    #[test]
    fn the_table_starts_with_heaps_mapped_and_every_other_tag_refused() {
        let t = initial_table(1, &[16 << 20, 0, -(32 << 20)]);
        let at = |r: usize, tag: usize| {
            let o = (r * MAPS + tag) * 8;
            i64::from_le_bytes(t[o..o + 8].try_into().unwrap())
        };
        assert_eq!(t.len(), 3 * MAPS * 8);
        assert_eq!(at(0, 0), 16 << 20);
        assert_eq!(at(2, 0), -(32 << 20));
        assert_eq!(at(0, 1), UNMAPPED);
        assert_eq!(at(2, UNKNOWN_TAG as usize), UNMAPPED);
        assert_eq!(at(1, 0), 0);
        assert_eq!(at(1, 7), 0);
        // A tag and the address bits never overlap on a 57-bit address space.
        assert_eq!(
            ((u64::from(UNKNOWN_TAG) << TAG_SHIFT) >> TAG_SHIFT) as u8,
            UNKNOWN_TAG
        );
    }
}
