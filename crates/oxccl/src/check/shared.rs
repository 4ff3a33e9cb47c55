//! The board's records in shared memory, for ranks that are processes of
//! one host: one region (rank 0's `memfd`, mapped by every rank, see
//! `oxccl_host::SharedRegion`) holding every rank's row of collective
//! slots, laid out as in one process, and a fixed ring of open messages
//! per ordered pair for Send/Recv, each ring behind a tiny lock word.
//! Sleepers wait on a futex word of the region; a pidfd watcher
//! (`oxccl_bootstrap::PeerWatch`) notes peers whose process exited, so a
//! wait for a dead rank ends naming it instead of at its deadline.
//!
//! | offset | what |
//! | --- | --- |
//! | 0 | [`Header`]: the bell (wake-up epoch, the futex word; sleepers), the first abort |
//! | [`HEADER`] | a row of [`DEPTH`] slots per rank, then its "gone" word, [`ROW`] bytes each |
//! | after the rows | a [`PairShm`] per ordered pair (sender, receiver) |

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::utils::Backoff;
use oxccl_bootstrap::{Bootstrap, PeerWatch};
use oxccl_core::DataType;
use oxccl_host::{Bell, SharedRegion};
use parking_lot::Mutex;

use super::records::{P2pRecord, Slot, DEPTH, NAP};
use crate::error::{Error, Result};

/// Tag of the region's descriptor in the bootstrap's fd mailbox.
const TAG: u64 = 0x6f78_6363_6c63_686b;
/// Open messages per ordered pair: a record whose ring entry still holds
/// an older message waits in this process ([`SharedBoard::pending`]) and
/// is written once both sides compared that one, so groups of any size
/// work; only their records past the first `CAP` wait a little.
const CAP: usize = 64;
const HEADER: usize = 128;
/// Bytes per rank's row of slots (cache-line multiple).
const ROW: usize = 256;
/// How long taking a pair's lock may take: its holder runs a few loads
/// and stores; only a process killed inside them holds it longer.
const LOCK_LIMIT: Duration = Duration::from_secs(5);

/// What every rank's sleepers share.
#[repr(C)]
struct Header {
    /// Rung by every publish; processes' waiters sleep on it.
    bell: Bell,
    /// The first rank that aborted its communicator, + 1 (0: none). An
    /// abort fails the clique whatever carries its data (some transports
    /// tell peers only when they wait for data, never in the check).
    aborted: AtomicU32,
}

/// Both sides of one open message of a pair. Index 0 of `count`/`meta`
/// is the sender's record, 1 the receiver's.
#[repr(C)]
struct Entry {
    /// The message's index on the pair + 1; 0: free.
    k1: AtomicU64,
    count: [AtomicU64; 2],
    /// [`PRESENT`], the type and the direct buffer id; 0: not posted.
    meta: [AtomicU64; 2],
    /// Bit per side that compared it (or gave it up); both: free again.
    seen: AtomicU64,
}

/// One ordered pair's ring of open messages.
#[repr(C)]
struct PairShm {
    /// 1 while a rank reads or writes `entries`.
    lock: AtomicU32,
    entries: [Entry; CAP],
}

const PAIR: usize = size_of::<PairShm>().next_multiple_of(64);
const _: () = assert!(size_of::<Header>() <= HEADER);
const _: () = assert!(size_of::<[Slot; DEPTH]>() + size_of::<AtomicU64>() <= ROW);
/// Where a row's "gone" word sits: after its slots, 8-byte aligned.
const GONE: usize = size_of::<[Slot; DEPTH]>().next_multiple_of(8);

const PRESENT: u64 = 1 << 63;
const HAS_DIRECT: u64 = 1 << 32;

/// One side's record as its entry holds it: (count, meta).
fn encode(rec: &P2pRecord) -> (u64, u64) {
    let direct = rec.direct.map_or(0, |d| HAS_DIRECT | u64::from(d) << 16);
    (rec.count as u64, PRESENT | rec.dtype as u64 | direct)
}

fn decode(count: u64, meta: u64) -> Option<(usize, DataType, Option<u16>)> {
    let dtype = *DataType::ALL.get((meta & 0xff) as usize)?;
    let direct = (meta & HAS_DIRECT != 0).then_some((meta >> 16) as u16);
    Some((count as usize, dtype, direct))
}

/// Fuzz entry: one side's record from two arbitrary words, as a peer's
/// process may have written them; one that decodes encodes back to
/// itself.
pub(super) fn fuzz_record(count: u64, meta: u64) {
    if let Some((count, dtype, direct)) = decode(count, meta) {
        let rec = P2pRecord {
            peer: 0,
            send: true,
            count,
            dtype,
            direct,
        };
        let (c, m) = encode(&rec);
        assert_eq!(decode(c, m), Some((count, dtype, direct)));
    }
}

/// One side of one ordered pair: ((sender, receiver), 0 sends / 1 receives).
type PairSide = ((u32, u32), usize);

/// A record this process posted that is not in its ring yet.
#[derive(Clone, Copy, Debug)]
struct Pending {
    pair: (u32, u32),
    side: usize,
    k: u64,
    words: (u64, u64),
}

/// The board of a clique of processes on one host.
#[derive(Debug)]
pub(super) struct SharedBoard {
    region: Arc<SharedRegion>,
    nranks: u32,
    /// Records posted per (pair, side) by this process's rank: only the
    /// posting rank counts its side, so the count is its own.
    posted: Mutex<HashMap<PairSide, u64>>,
    pending: Mutex<Vec<Pending>>,
    /// Per rank: its pid + 1 once its process exited (0: alive).
    dead: Arc<[AtomicU64]>,
    _watch: PeerWatch,
}

fn header(region: &SharedRegion) -> &Header {
    // SAFETY: offset 0 of the region (page-aligned, zero-filled, shared
    // by every rank) holds a Header of atomics; zeros are a valid Header.
    unsafe { &*region.base().cast::<Header>() }
}

fn wake(region: &SharedRegion) {
    header(region).bell.ring();
}

/// Holds a pair's lock word; releases it on drop.
struct Locked<'a>(&'a PairShm);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.0.lock.store(0, Ordering::Release);
    }
}

impl SharedBoard {
    /// The region of `boot`'s clique: every rank calls this at init.
    pub fn new(boot: &Bootstrap) -> Result<SharedBoard> {
        let n = boot.nranks() as usize;
        let len = HEADER + n * ROW + n * n * PAIR;
        let region = Arc::new(
            SharedRegion::exchange(boot, TAG, len).map_err(crate::backend::host::map_error)?,
        );
        let dead: Arc<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let (r2, d2) = (Arc::downgrade(&region), dead.clone());
        let watch = PeerWatch::start(boot, move |r, pid| {
            d2[r as usize].store(u64::from(pid) + 1, Ordering::Release);
            if let Some(region) = r2.upgrade() {
                wake(&region);
            }
        })
        .map_err(crate::init::map_bootstrap)?;
        Ok(SharedBoard {
            region,
            nranks: n as u32,
            posted: Mutex::default(),
            pending: Mutex::default(),
            dead,
            _watch: watch,
        })
    }

    pub fn row(&self, rank: u32) -> &[Slot; DEPTH] {
        assert!(rank < self.nranks, "rank {rank} of {} ranks", self.nranks);
        // SAFETY: rows start at HEADER, ROW bytes apart (ROW is a multiple
        // of a Slot's alignment and holds DEPTH slots); the region is
        // zero-filled shared memory, and zeros are valid atomics.
        unsafe {
            &*self
                .region
                .base()
                .add(HEADER + rank as usize * ROW)
                .cast::<[Slot; DEPTH]>()
        }
    }

    /// `rank`'s "gone" word: 1 once its communicator was destroyed or
    /// dropped.
    fn gone_word(&self, rank: u32) -> &AtomicU64 {
        assert!(rank < self.nranks, "rank {rank} of {} ranks", self.nranks);
        // SAFETY: the word sits GONE bytes into `rank`'s row, inside it
        // (asserted above) and 8-byte aligned (rows are ROW-aligned from a
        // page-aligned base); zero-filled shared memory is a valid atomic.
        unsafe {
            &*self
                .region
                .base()
                .add(HEADER + rank as usize * ROW + GONE)
                .cast::<AtomicU64>()
        }
    }

    /// Records that `rank`'s communicator is gone and wakes everyone.
    pub fn leave(&self, rank: u32) {
        self.gone_word(rank).store(1, Ordering::Release);
        wake(&self.region);
    }

    /// Whether `rank`'s communicator is gone (it publishes no more).
    pub fn left(&self, rank: u32) -> bool {
        self.gone_word(rank).load(Ordering::Acquire) != 0
    }

    fn pair(&self, (s, r): (u32, u32)) -> &PairShm {
        let n = self.nranks as usize;
        let off = HEADER + n * ROW + (s as usize * n + r as usize) * PAIR;
        // SAFETY: one PairShm per ordered pair after the rows, PAIR bytes
        // apart (a multiple of its alignment), inside the region's length.
        unsafe { &*self.region.base().add(off).cast::<PairShm>() }
    }

    /// Takes a pair's lock: spins, then yields; gives up after
    /// [`LOCK_LIMIT`] (its holder's process died inside it).
    fn lock(&self, pair: (u32, u32)) -> Result<Locked<'_>> {
        let p = self.pair(pair);
        let b = Backoff::new();
        let mut since: Option<Instant> = None;
        loop {
            if p.lock
                .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Locked(p));
            }
            if !b.is_completed() {
                b.snooze();
                continue;
            }
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > LOCK_LIMIT {
                return Err(Error::Aborted(format!(
                    "the Send/Recv records of ranks {} -> {} stayed locked for {LOCK_LIMIT:?}: a rank's process died holding them",
                    pair.0, pair.1
                )));
            }
            std::thread::yield_now();
        }
    }

    pub fn wake_all(&self) {
        wake(&self.region);
    }

    /// Records that `rank` aborted (the first one only) and wakes everyone.
    pub fn abort(&self, rank: u32) {
        let _ = header(&self.region).aborted.compare_exchange(
            0,
            rank + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        wake(&self.region);
    }

    /// The first rank that aborted, if any. The word is shared memory any
    /// rank's process can write: a value naming no rank of the clique is
    /// no abort (it is never used as an index).
    pub fn aborted_by(&self) -> Option<u32> {
        header(&self.region)
            .aborted
            .load(Ordering::Acquire)
            .checked_sub(1)
            .filter(|&r| r < self.nranks)
    }

    /// Sleeps until a publish, at most [`NAP`], unless `ready` answers.
    pub fn sleep_unless<T>(&self, ready: &mut impl FnMut() -> Option<T>) -> Option<T> {
        header(&self.region).bell.sleep_unless(NAP, ready)
    }

    /// The pid of `rank`'s process if it exited.
    pub fn exited(&self, rank: u32) -> Option<u32> {
        match self.dead.get(rank as usize)?.load(Ordering::Acquire) {
            0 => None,
            p => Some((p - 1) as u32),
        }
    }

    /// Posts one side of a Send/Recv of `rank`; its index on the pair.
    pub fn post(&self, rank: u32, rec: P2pRecord) -> u64 {
        let (pair, side) = (rec.pair(rank), usize::from(!rec.send));
        let k = {
            let mut posted = self.posted.lock();
            let c = posted.entry((pair, side)).or_default();
            *c += 1;
            *c - 1
        };
        self.pending.lock().push(Pending {
            pair,
            side,
            k,
            words: encode(&rec),
        });
        // A lock that cannot be had now is tried again while waiting.
        let _ = self.flush();
        self.wake_all();
        k
    }

    /// Writes the pending records whose ring entries are free.
    fn flush(&self) -> Result<()> {
        let mut pending = self.pending.lock();
        let mut wrote = false;
        // Each pair side's records go in in order: one that must wait
        // holds back its later ones. (Else an entry freed between two
        // looks of one pass could take record k + 2 * CAP before k.)
        let mut held: Vec<PairSide> = Vec::new();
        let mut i = 0;
        while i < pending.len() {
            let p = pending[i];
            if held.contains(&(p.pair, p.side)) {
                i += 1;
                continue;
            }
            let g = self.lock(p.pair)?;
            let e = &g.0.entries[(p.k % CAP as u64) as usize];
            let k1 = e.k1.load(Ordering::Relaxed);
            if k1 == 0 || k1 == p.k + 1 {
                e.k1.store(p.k + 1, Ordering::Relaxed);
                e.count[p.side].store(p.words.0, Ordering::Relaxed);
                e.meta[p.side].store(p.words.1, Ordering::Relaxed);
                pending.remove(i);
                wrote = true;
            } else {
                held.push((p.pair, p.side));
                i += 1;
            }
        }
        drop(pending);
        if wrote {
            self.wake_all();
        }
        Ok(())
    }

    /// The other side of `rank`'s record `k`, once posted (compared: this
    /// side is done with the message).
    pub fn take(
        &self,
        rank: u32,
        rec: &P2pRecord,
        k: u64,
    ) -> Result<Option<(usize, DataType, Option<u16>)>> {
        self.flush()?;
        let (pair, side) = (rec.pair(rank), usize::from(!rec.send));
        let g = self.lock(pair)?;
        let e = &g.0.entries[(k % CAP as u64) as usize];
        let meta = e.meta[1 - side].load(Ordering::Relaxed);
        if e.k1.load(Ordering::Relaxed) != k + 1 || meta & PRESENT == 0 {
            return Ok(None);
        }
        let theirs = decode(e.count[1 - side].load(Ordering::Relaxed), meta).ok_or_else(|| {
            Error::Internal(format!(
                "rank {}'s Send/Recv record #{k} is unreadable",
                rec.peer
            ))
        })?;
        self.done(e, side);
        Ok(Some(theirs))
    }

    /// Marks `side` done with entry `e`; frees it once both are.
    fn done(&self, e: &Entry, side: usize) {
        let seen = e.seen.load(Ordering::Relaxed) | 1 << side;
        if seen == 3 {
            free(e);
        } else {
            e.seen.store(seen, Ordering::Relaxed);
        }
    }

    /// Withdraws `rank`'s unmatched record `k` when it is still the last
    /// it posted on the pair (as the in-process board does); a record the
    /// peer matched stays for the peer, this side done with it.
    pub fn withdraw(&self, rank: u32, rec: &P2pRecord, k: u64) {
        let (pair, side) = (rec.pair(rank), usize::from(!rec.send));
        let mut posted = self.posted.lock();
        let last = posted.get(&(pair, side)) == Some(&(k + 1));
        {
            let mut pending = self.pending.lock();
            if let Some(i) = pending
                .iter()
                .position(|p| p.pair == pair && p.side == side && p.k == k)
            {
                if last {
                    pending.remove(i);
                    posted.insert((pair, side), k);
                }
                return;
            }
        }
        let Ok(g) = self.lock(pair) else { return };
        let e = &g.0.entries[(k % CAP as u64) as usize];
        if e.k1.load(Ordering::Relaxed) != k + 1 {
            return;
        }
        if last && e.meta[1 - side].load(Ordering::Relaxed) & PRESENT == 0 {
            free(e);
            posted.insert((pair, side), k);
        } else {
            self.done(e, side);
        }
    }
}

fn free(e: &Entry) {
    for s in 0..2 {
        e.count[s].store(0, Ordering::Relaxed);
        e.meta[s].store(0, Ordering::Relaxed);
    }
    e.seen.store(0, Ordering::Relaxed);
    e.k1.store(0, Ordering::Relaxed);
}

/// How a clique of processes checks its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CheckMode {
    Off,
    /// Records in a region every rank maps (processes of one host).
    Shared,
    /// Records mirrored over TCP (ranks that talk over the network).
    Mirrored,
}

/// How a clique of processes checks its calls: only if every rank asked
/// for it (`on`, exchanged over `boot`: ranks configured differently run
/// without it, with a warning). Ranks of one host share a region; ranks
/// that talk over the network (on several hosts, or forced onto it)
/// mirror their records over TCP if every rank also asked for that
/// (`across`, `OXCCL_CHECK_CALLS=all`), else run unchecked, said once at
/// init (ranks in separate network namespaces cannot pass the region's
/// fd).
pub(crate) fn agree_on_check(
    boot: &Bootstrap,
    on: bool,
    across: bool,
    forced: bool,
) -> Result<CheckMode> {
    let mine = u8::from(on) | u8::from(on && across) << 1;
    let all = boot
        .all_gather(&[mine])
        .map_err(crate::init::map_bootstrap)?;
    let asked = |bit: u8| {
        all.iter()
            .filter(|v| v.first().is_some_and(|b| b & bit != 0))
            .count()
    };
    let ons = asked(1);
    if ons != 0 && ons != all.len() {
        let off: Vec<u32> = (0..all.len() as u32)
            .filter(|&r| all[r as usize].first().is_none_or(|b| b & 1 == 0))
            .collect();
        tracing::warn!(
            rank = boot.rank(),
            "oxccl: the call check is off: {} turned it off (OXCCL_CHECK_CALLS), the others did not",
            oxccl_core::ranks_named(&off)
        );
        return Ok(CheckMode::Off);
    }
    if ons == 0 {
        return Ok(CheckMode::Off);
    }
    let network = oxccl_host::HostFabric::network_wanted(boot, forced);
    if !network {
        return Ok(CheckMode::Shared);
    }
    if asked(2) == all.len() {
        tracing::info!(
            rank = boot.rank(),
            "oxccl: the call check crosses the network (OXCCL_CHECK_CALLS=all): n - 1 messages per rank per collective"
        );
        return Ok(CheckMode::Mirrored);
    }
    tracing::info!(
        rank = boot.rank(),
        "oxccl: the call check is off: ranks that talk over the network (on different hosts, or NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) are checked only with OXCCL_CHECK_CALLS=all on every rank; mismatched calls there fail or hang until the deadline"
    );
    Ok(CheckMode::Off)
}
