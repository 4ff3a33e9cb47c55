//! CUDA ranks as processes: where each rank publishes the export records
//! of the caller's allocations it shares (`oxccl_cuda`'s `share_range`),
//! and where its peers find them before their launches.
//!
//! One shared region of the clique (rank 0's `memfd`, as the call check's
//! board), a row per rank: a count, then one record per tag. A rank
//! writes the record of tag `t`, then stores `t` into its count with
//! release order, before publishing the call in the call check; a peer
//! that compared that call (acquire order) therefore sees the count, and
//! before its launch maps every record up to it ([`ExportBoard::import_new`]).
//! Records are written once and never changed (tags are not reused).

use std::sync::atomic::{AtomicU32, Ordering};

use oxccl_bootstrap::Bootstrap;
use oxccl_cuda::{World, EXPORT_BYTES, LAST_TAG};
use oxccl_host::SharedRegion;
use parking_lot::Mutex;

use crate::error::Error;

/// Tag of the region's descriptor in the bootstrap's fd mailbox.
const TAG: u64 = 0x6f78_6363_6c65_7870;
/// Bytes before a row's records (its count, alone on a cache line).
const HEAD: usize = 64;
/// Bytes of one rank's row.
const ROW: usize = (HEAD + LAST_TAG as usize * EXPORT_BYTES).next_multiple_of(64);

/// The clique's export records, as one rank sees them.
#[derive(Debug)]
pub(crate) struct ExportBoard {
    region: SharedRegion,
    me: u32,
    nranks: u32,
    /// Per peer, the records mapped here so far.
    imported: Mutex<Vec<u8>>,
}

impl ExportBoard {
    /// Every rank of `boot` calls this at creation.
    pub fn new(boot: &Bootstrap) -> Result<ExportBoard, Error> {
        let n = boot.nranks();
        let region =
            SharedRegion::exchange(boot, TAG, n as usize * ROW).map_err(super::host::map_error)?;
        Ok(ExportBoard {
            region,
            me: boot.rank(),
            nranks: n,
            imported: Mutex::new(vec![0; n as usize]),
        })
    }

    fn count(&self, rank: u32) -> &AtomicU32 {
        debug_assert!(rank < self.nranks);
        // SAFETY: each row starts with its count, ROW bytes apart (a
        // multiple of 64) in the zero-filled shared region; zero is a
        // valid AtomicU32.
        unsafe {
            &*self
                .region
                .base()
                .add(rank as usize * ROW)
                .cast::<AtomicU32>()
        }
    }

    /// The record slot of `rank`'s tag `tag` (1..=LAST_TAG).
    fn record(&self, rank: u32, tag: u8) -> *mut u8 {
        debug_assert!(rank < self.nranks && (1..=LAST_TAG).contains(&tag));
        let at = rank as usize * ROW + HEAD + (tag as usize - 1) * EXPORT_BYTES;
        // SAFETY: inside the region: rows hold LAST_TAG records after HEAD.
        unsafe { self.region.base().add(at) }
    }

    /// Publishes this rank's record of `tag` (tags come in order, once).
    pub fn publish(&self, tag: u8, rec: &[u8; EXPORT_BYTES]) {
        // SAFETY: this rank's own record slot, written once, before the
        // count that lets peers read it.
        unsafe {
            std::ptr::copy_nonoverlapping(rec.as_ptr(), self.record(self.me, tag), EXPORT_BYTES)
        };
        self.count(self.me).store(u32::from(tag), Ordering::Release);
    }

    /// Maps every peer record published since the last call into `world`
    /// for this rank's kernels (a failure to map one is logged by the
    /// world and fails only a call that reads through it).
    pub fn import_new(&self, world: &World) {
        let mut done = self.imported.lock();
        for peer in 0..self.nranks {
            if peer == self.me {
                continue;
            }
            let have = self
                .count(peer)
                .load(Ordering::Acquire)
                .min(u32::from(LAST_TAG)) as u8;
            while done[peer as usize] < have {
                let tag = done[peer as usize] + 1;
                let mut rec = [0u8; EXPORT_BYTES];
                // SAFETY: the peer wrote this slot before its count reached
                // `tag` (acquire above) and never writes it again.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.record(peer, tag),
                        rec.as_mut_ptr(),
                        EXPORT_BYTES,
                    )
                };
                if let Err(e) = world.import(self.me, peer, tag, &rec) {
                    tracing::warn!(rank = self.me, peer, tag, error = %e, "oxccl: import failed");
                }
                done[peer as usize] = tag;
            }
        }
    }
}
