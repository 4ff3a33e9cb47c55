//! The records the call check keeps: one row of slots per rank for
//! collectives, one log per ordered pair for Send/Recv, in this process's
//! memory (`Local`: ranks as threads, or a rank's mirror of its peers'
//! records). The shared region across processes (`super::shared`) lays out
//! the same slots; `super::board` waits on either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam::utils::CachePadded;
use oxccl_core::DataType;
use oxccl_host::Bell;
use parking_lot::Mutex;

/// Slots per rank. A rank publishes call `s + 1` only after it read every
/// rank's record of call `s`, so no rank is more than one call ahead of
/// another and two slots would do; four leave room.
pub(super) const DEPTH: usize = 4;

/// How long a sleeping waiter sleeps before it looks again (abort, a
/// peer's failure, its deadline) even if no one wakes it.
pub(super) const NAP: Duration = Duration::from_millis(20);

/// One published collective record: `seq` is stored last (Release), so a
/// reader that sees its call's `seq` sees the words.
#[repr(C)]
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) seq: AtomicU64,
    pub(super) words: [AtomicU64; 4],
}

impl Slot {
    /// Writes the record of call `seq`: the words, then `seq` (SeqCst).
    pub(super) fn write(&self, seq: u64, words: [u64; 4]) {
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq, Ordering::SeqCst);
    }
}

/// One side of a Send/Recv as its peer checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct P2pRecord {
    /// The other rank.
    pub peer: u32,
    /// A send (else a receive).
    pub send: bool,
    pub count: usize,
    pub dtype: DataType,
    /// On a send the sender read directly from its buffer by the
    /// receiver: the buffer's id in the sender's plan (`p2p::Path`).
    /// Not compared: the receiver takes the sender's word.
    pub direct: Option<u16>,
}

impl P2pRecord {
    /// The pair log it belongs to: (sender, receiver).
    pub(super) fn pair(&self, rank: u32) -> (u32, u32) {
        if self.send {
            (rank, self.peer)
        } else {
            (self.peer, rank)
        }
    }
}

/// Both sides of the k-th message of one ordered pair.
#[derive(Debug, Default)]
pub(super) struct Match {
    /// Index 0: the sender's record, 1: the receiver's: count, type and
    /// direct buffer id.
    pub(super) sides: [Option<(usize, DataType, Option<u16>)>; 2],
    /// Sides that have compared it (the second removes it).
    pub(super) seen: u8,
}

/// Send/Recv records between one sender and one receiver.
#[derive(Debug, Default)]
pub(super) struct PairLog {
    /// How many records each side has posted.
    pub(super) posted: [u64; 2],
    pub(super) open: HashMap<u64, Match>,
}

/// The records of ranks that are threads of this process (or a rank's
/// mirror of its peers' records).
#[derive(Debug)]
pub(super) struct Local {
    pub(super) rows: Box<[CachePadded<[Slot; DEPTH]>]>,
    /// Per rank: its communicator was destroyed or dropped, so it will
    /// publish nothing more (a wait for it fails at once, naming it).
    pub(super) gone: Box<[AtomicBool]>,
    pub(super) pairs: Mutex<HashMap<(u32, u32), PairLog>>,
    /// Rung by the record that completes a call and by every other
    /// change; waiters sleep on it, as across processes.
    pub(super) bell: Bell,
}

impl Local {
    pub(super) fn new(nranks: u32) -> Local {
        Local {
            rows: (0..nranks).map(|_| CachePadded::default()).collect(),
            gone: (0..nranks).map(|_| AtomicBool::new(false)).collect(),
            pairs: Mutex::default(),
            bell: Bell::default(),
        }
    }

    /// Wakes every sleeping waiter.
    pub(super) fn wake_all(&self) {
        self.bell.ring();
    }

    /// Stores `rank`'s record of collective `seq` (a peer's, mirrored).
    pub(super) fn store(&self, rank: u32, seq: u64, words: [u64; 4]) {
        if let Some(row) = self.rows.get(rank as usize) {
            row[(seq % DEPTH as u64) as usize].write(seq, words);
        }
    }

    /// Stores `rank`'s side of Send/Recv record `k` (a peer's, mirrored).
    pub(super) fn put_side(&self, rank: u32, rec: P2pRecord, k: u64) {
        let side = usize::from(!rec.send);
        let mut pairs = self.pairs.lock();
        let log = pairs.entry(rec.pair(rank)).or_default();
        log.open.entry(k).or_default().sides[side] = Some((rec.count, rec.dtype, rec.direct));
    }

    /// Forgets `rank`'s side of record `k` (it withdrew it unmatched).
    pub(super) fn drop_side(&self, rank: u32, rec: P2pRecord, k: u64) {
        let side = usize::from(!rec.send);
        let mut pairs = self.pairs.lock();
        if let Some(log) = pairs.get_mut(&rec.pair(rank)) {
            if let Some(m) = log.open.get_mut(&k) {
                m.sides[side] = None;
                if m.sides.iter().all(Option::is_none) {
                    log.open.remove(&k);
                }
            }
        }
    }

    pub(super) fn mark_gone(&self, rank: u32) {
        if let Some(g) = self.gone.get(rank as usize) {
            g.store(true, Ordering::SeqCst);
        }
    }
}
