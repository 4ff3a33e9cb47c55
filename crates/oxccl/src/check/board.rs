//! The exchange of call fingerprints: one row of slots per rank for
//! collectives, one log per ordered pair for Send/Recv, and a way to wait
//! for peers that spins briefly, then sleeps until a peer publishes. Ranks
//! as threads keep all of it in this process's memory; ranks as processes
//! of one host keep it in a region they all map ([`super::shared`]), with
//! the same slots and the same waits.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam::utils::Backoff;
use oxccl_core::DataType;

use super::mirror::Mirror;
pub(crate) use super::records::P2pRecord;
use super::records::{Local, Slot, DEPTH, NAP};
use super::shared::SharedBoard;
use crate::error::{Error, Result};
use oxccl_core::ranks_with;

/// How long a waiter spins before it sleeps, where every rank thread has a
/// core of its own. Ranks reach a call some µs apart (a CUDA launch takes
/// that long), and a waiter that went to sleep costs a futex wake-up
/// (several µs, on the H200 host 7 µs a call at 8 ranks) when the last
/// one publishes; spinning through the usual skew keeps the check at a
/// few cache-line reads. Where threads share cores, spinning would steal
/// the very rank waited for: there waiters sleep after a short backoff.
const SPIN: Duration = Duration::from_micros(200);

/// What waiting for the other side of a Send/Recv found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum P2pOutcome {
    /// Same count and type; the other side's direct buffer id (a
    /// sender's, read directly by this receiver).
    Matched { direct: Option<u16> },
    /// The other side's count and type.
    Differs { count: usize, dtype: DataType },
    /// The peer entered collective `seq`, which this rank has not reached,
    /// without posting the other side.
    PeerMovedOn { seq: u64 },
}

/// Who is waiting, for how long, and what ends the wait early.
pub(crate) struct WaitCtx<'a> {
    pub rank: u32,
    /// `None`: no deadline.
    pub deadline: Option<Duration>,
    /// When the wait warns that peers are absent.
    pub warn: crate::config::branches::WaitWarn,
    /// The clique's failure, if any (abort, a peer's deadline).
    pub failure: &'a dyn Fn() -> Option<Error>,
}

/// The fingerprints of one clique's ranks.
#[derive(Debug)]
pub(crate) struct Board {
    nranks: u32,
    mem: Mem,
    /// How long a waiter spins before sleeping ([`SPIN`], or none where
    /// rank threads share cores).
    spin: Duration,
    /// The first lost peer a wait of this process found (why, as
    /// [`Board::lost`] said it): the clique is not failed for it (every
    /// rank finds it alike), but the communicators are unusable, and
    /// `async_error` says so.
    lost_seen: std::sync::OnceLock<String>,
}

/// Where the records live.
#[derive(Debug)]
enum Mem {
    /// Ranks are threads of this process.
    Local(Local),
    /// Ranks are processes of this host.
    Shared(SharedBoard),
    /// Ranks talk over the network: each keeps its own copy, fed by its
    /// peers' frames ([`super::mirror`]).
    Mirror(Mirror),
}

/// Where the records are read and written: this process's memory
/// (threads, or a rank's mirror) or the shared region.
enum Store<'a> {
    Local(&'a Local),
    Shared(&'a SharedBoard),
}

impl Mem {
    fn store(&self) -> Store<'_> {
        match self {
            Mem::Local(l) => Store::Local(l),
            Mem::Mirror(m) => Store::Local(m.local()),
            Mem::Shared(s) => Store::Shared(s),
        }
    }
}

/// How long waiters of a clique of `nranks` rank threads spin on a
/// machine of `cores` cores: [`SPIN`] when each has a core and one is left
/// over, else none.
fn spin_for(nranks: u32, cores: usize) -> Duration {
    if cores > nranks as usize {
        SPIN
    } else {
        Duration::ZERO
    }
}

impl Board {
    /// The board of `nranks` rank threads of this process.
    pub fn new(nranks: u32) -> Board {
        Board::with(nranks, Mem::Local(Local::new(nranks)))
    }

    /// The board of a clique whose ranks talk over the network: every rank
    /// calls this at init (it connects every pair of ranks).
    pub fn mirrored(boot: &oxccl_bootstrap::Bootstrap) -> Result<Board> {
        let n = boot.nranks();
        Ok(Board::with(
            n,
            Mem::Mirror(Mirror::new(boot, Local::new(n))?),
        ))
    }

    /// The board of a clique of processes on this host: every rank calls
    /// this at init (it exchanges a shared region over `boot`).
    pub fn shared(boot: &oxccl_bootstrap::Bootstrap) -> Result<Board> {
        Ok(Board::with(
            boot.nranks(),
            Mem::Shared(SharedBoard::new(boot)?),
        ))
    }

    fn with(nranks: u32, mem: Mem) -> Board {
        Board {
            nranks,
            mem,
            lost_seen: std::sync::OnceLock::new(),
            spin: spin_for(
                nranks,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
        }
    }

    fn row(&self, rank: u32) -> &[Slot; DEPTH] {
        match self.mem.store() {
            Store::Local(l) => &l.rows[rank as usize],
            Store::Shared(s) => s.row(rank),
        }
    }

    fn slot(&self, rank: u32, seq: u64) -> &Slot {
        &self.row(rank)[(seq % DEPTH as u64) as usize]
    }

    /// The latest collective sequence number `rank` published.
    fn latest(&self, rank: u32) -> u64 {
        self.row(rank)
            .iter()
            .map(|s| s.seq.load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// The latest collective sequence number `rank` published, as this
    /// process can read it (the watchdog's view of a peer's progress).
    pub fn published(&self, rank: u32) -> u64 {
        self.latest(rank)
    }

    /// Wakes every sleeping waiter (after a publish, or an abort).
    pub fn wake_all(&self) {
        match self.mem.store() {
            Store::Local(l) => l.wake_all(),
            Store::Shared(s) => s.wake_all(),
        }
    }

    /// `rank` aborted its communicator: wakes every waiter; across
    /// processes, peers' waits fail naming it.
    pub fn abort(&self, rank: u32) {
        match &self.mem {
            Mem::Local(_) => self.wake_all(),
            Mem::Shared(s) => s.abort(rank),
            Mem::Mirror(m) => m.abort(rank),
        }
    }

    /// `rank`'s communicator was destroyed or dropped: a wait for it ends
    /// at once naming it, among threads and across processes (where a
    /// process that exits is also named, by the pid watcher).
    pub fn leave(&self, rank: u32) {
        match &self.mem {
            Mem::Local(l) => {
                l.mark_gone(rank);
                self.wake_all();
            }
            Mem::Shared(s) => s.leave(rank),
            Mem::Mirror(m) => m.leave(rank),
        }
    }

    /// Whether `rank`'s communicator is gone ([`Board::leave`]).
    fn left(&self, rank: u32) -> bool {
        match self.mem.store() {
            Store::Local(l) => l.gone[rank as usize].load(Ordering::SeqCst),
            Store::Shared(s) => s.left(rank),
        }
    }

    /// What a waiter among threads of this process is told when its peers
    /// are late: the usual cause is one thread calling for several ranks.
    fn late_hint(&self) -> &'static str {
        match self.mem {
            Mem::Local(_) => {
                " (ranks of one process each call from a thread of their own, or from one \
                 thread inside one `oxccl::group`: a thread blocked in one rank's call never \
                 reaches the next rank's)"
            }
            Mem::Shared(_) | Mem::Mirror(_) => "",
        }
    }

    /// Publishes `rank`'s record of collective call `seq` (from 1).
    pub fn publish(&self, rank: u32, seq: u64, words: [u64; 4]) {
        self.slot(rank, seq).write(seq, words);
        if let Mem::Mirror(m) = &self.mem {
            m.published(rank, seq, words);
        }
        // Waiters of a call wait for every rank's record, so only the
        // record that completes the call wakes them: a wake per publish
        // woke each of 128 rank threads 128 times a call. Of ranks
        // publishing last together, at least the later of any two sees the
        // other's record (both SeqCst), so one of them wakes the waiters.
        let complete =
            (0..self.nranks).all(|r| self.slot(r, seq).seq.load(Ordering::SeqCst) >= seq);
        if complete {
            self.wake_all();
        }
    }

    /// Waits until every rank published call `seq`, then returns every
    /// rank's words, in rank order (inline up to 8 ranks: every call
    /// gathers, and a call should allocate nothing).
    pub fn gather(
        &self,
        ctx: &WaitCtx<'_>,
        seq: u64,
        what: &dyn Fn() -> String,
    ) -> Result<smallvec::SmallVec<[[u64; 4]; 8]>> {
        let ready = |r: u32| self.slot(r, seq).seq.load(Ordering::Acquire) >= seq;
        self.wait(
            ctx,
            || (0..self.nranks).all(ready).then_some(Ok(())),
            &|r| !ready(r),
            || {
                let missing: Vec<u32> = (0..self.nranks).filter(|&r| !ready(r)).collect();
                format!(
                    "{}: {} reached it",
                    what(),
                    ranks_with(&missing, ("has not", "have not"))
                )
            },
        )?;
        let mut out = smallvec::SmallVec::with_capacity(self.nranks as usize);
        for r in 0..self.nranks {
            let slot = self.slot(r, seq);
            let w = [0, 1, 2, 3].map(|i| slot.words[i].load(Ordering::Relaxed));
            if slot.seq.load(Ordering::Acquire) != seq {
                return Err(Error::Internal(format!(
                    "rank {r} overwrote its record of call #{seq} before rank {} read it",
                    ctx.rank
                )));
            }
            out.push(w);
        }
        Ok(out)
    }

    /// `rank`'s record of call `seq`, if it has published it and not
    /// overwritten it since (read without waiting).
    pub fn record(&self, rank: u32, seq: u64) -> Option<[u64; 4]> {
        let slot = self.slot(rank, seq);
        if slot.seq.load(Ordering::Acquire) != seq {
            return None;
        }
        let w = [0, 1, 2, 3].map(|i| slot.words[i].load(Ordering::Relaxed));
        (slot.seq.load(Ordering::Acquire) == seq).then_some(w)
    }

    /// Posts one side of a Send/Recv of `rank`; returns its index on the
    /// pair (the k-th send matches the k-th receive).
    pub fn post(&self, rank: u32, rec: P2pRecord) -> u64 {
        let l = match self.mem.store() {
            Store::Local(l) => l,
            Store::Shared(s) => return s.post(rank, rec),
        };
        let side = usize::from(!rec.send);
        let k = {
            let mut pairs = l.pairs.lock();
            let log = pairs.entry(rec.pair(rank)).or_default();
            let k = log.posted[side];
            log.posted[side] += 1;
            log.open.entry(k).or_default().sides[side] = Some((rec.count, rec.dtype, rec.direct));
            k
        };
        if let Mem::Mirror(m) = &self.mem {
            m.posted(rank, rec, k);
        }
        self.wake_all();
        k
    }

    /// Waits for the other side of `rank`'s posted record `k` and compares.
    /// `coll_seq` is the last collective call this rank published: a peer
    /// that published a later one is waiting for this rank there and will
    /// never post the other side first.
    pub fn await_p2p(
        &self,
        ctx: &WaitCtx<'_>,
        rec: P2pRecord,
        k: u64,
        coll_seq: u64,
    ) -> Result<P2pOutcome> {
        let pair = rec.pair(ctx.rank);
        let side = usize::from(!rec.send);
        let other = 1 - side;
        let (verb, dir) = if rec.send {
            ("send", "to")
        } else {
            ("recv", "from")
        };
        self.wait(
            ctx,
            || {
                let theirs = match &self.mem {
                    Mem::Local(l) => take_local(l, pair, k, other, 2),
                    // Only this rank compares its copy of the pair.
                    Mem::Mirror(m) => take_local(m.local(), pair, k, other, 1),
                    Mem::Shared(s) => match s.take(ctx.rank, &rec, k) {
                        Ok(t) => t,
                        Err(e) => return Some(Err(e)),
                    },
                };
                if let Some((count, dtype, direct)) = theirs {
                    let same = count == rec.count && dtype == rec.dtype;
                    return Some(Ok(if same {
                        P2pOutcome::Matched { direct }
                    } else {
                        P2pOutcome::Differs { count, dtype }
                    }));
                }
                let seq = self.latest(rec.peer);
                if seq > coll_seq {
                    // The caller withdraws its records before it poisons
                    // that collective, so the peer, which cannot post
                    // before that collective ends, never matches them.
                    return Some(Ok(P2pOutcome::PeerMovedOn { seq }));
                }
                None
            },
            &|r| r == rec.peer,
            || {
                format!(
                    "{verb} #{k} of {} x {} {dir} rank {}: rank {} has not posted the matching {}",
                    rec.count,
                    rec.dtype,
                    rec.peer,
                    rec.peer,
                    if rec.send { "recv" } else { "send" }
                )
            },
        )
    }

    /// Withdraws `rank`'s unmatched record `k` (its group failed before
    /// its data moved), when it is still the last one it posted on the pair.
    pub fn withdraw(&self, rank: u32, rec: P2pRecord, k: u64) {
        let l = match self.mem.store() {
            Store::Local(l) => l,
            Store::Shared(s) => return s.withdraw(rank, &rec, k),
        };
        let side = usize::from(!rec.send);
        let mut pairs = l.pairs.lock();
        if let Some(log) = pairs.get_mut(&rec.pair(rank)) {
            let unmatched = log
                .open
                .get(&k)
                .is_some_and(|m| m.sides[1 - side].is_none());
            if unmatched && log.posted[side] == k + 1 {
                log.posted[side] = k;
                log.open.remove(&k);
                if let Mem::Mirror(m) = &self.mem {
                    m.withdrew(rank, rec, k);
                }
            }
        }
    }

    /// Polls `ready` until it answers, spinning briefly, then sleeping
    /// until a publish wakes the board. Bounded by the deadline; ends
    /// early on the clique's failure or, across processes, when a rank
    /// `waits_on` names has exited; warns on stderr (with or without
    /// logging) at `ctx.warn.first`, then every `ctx.warn.every`.
    fn wait<T>(
        &self,
        ctx: &WaitCtx<'_>,
        mut ready: impl FnMut() -> Option<Result<T>>,
        waits_on: &dyn Fn(u32) -> bool,
        pending: impl Fn() -> String,
    ) -> Result<T> {
        let start = Instant::now();
        if !self.spin.is_zero() {
            // Time is read once every 64 polls: a poll is a few loads.
            let mut polls = 0u32;
            loop {
                if let Some(r) = ready() {
                    return r;
                }
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(64) && start.elapsed() >= self.spin {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        let backoff = Backoff::new();
        while !backoff.is_completed() {
            if let Some(r) = ready() {
                return r;
            }
            backoff.snooze();
        }
        let mut next_warn = ctx.warn.first;
        loop {
            let found = match self.mem.store() {
                Store::Local(l) => l.bell.sleep_unless(NAP, &mut ready),
                Store::Shared(s) => s.sleep_unless(&mut ready),
            };
            if let Some(r) = found.or_else(&mut ready) {
                return r;
            }
            // A dead rank this wait needs is named first: the clique may
            // have failed from another rank's report of the same death.
            // Each rank reports it alike, so the clique is not failed here.
            if let Some(e) = self.lost(ctx.rank, waits_on, &pending) {
                if let Error::Aborted(why) = &e {
                    let _ = self.lost_seen.set(why.clone());
                }
                return Err(e);
            }
            if let Some(e) = (ctx.failure)() {
                return Err(e);
            }
            let waited = start.elapsed();
            if let Some(deadline) = ctx.deadline.filter(|&d| waited >= d) {
                return Err(Error::Timeout(format!(
                    "rank {} waited {deadline:?} (the deadline) before any data moved: {}{}",
                    ctx.rank,
                    pending(),
                    self.late_hint()
                )));
            }
            if waited >= next_warn {
                next_warn = waited + ctx.warn.every;
                let limit = ctx
                    .deadline
                    .map_or_else(|| "no deadline".to_string(), |d| format!("deadline {d:?}"));
                crate::debug::warn_loud(
                    ctx.rank,
                    &format!(
                        "oxccl: still waiting after {:.1} s ({limit}): {}{}",
                        waited.as_secs_f64(),
                        pending(),
                        self.late_hint()
                    ),
                );
            }
        }
    }
}

impl Board {
    /// The first lost peer (exited, aborted, or gone) a wait of this
    /// process returned, as that wait's error: what `async_error` reports
    /// once the communicators are unusable for it.
    pub fn peer_lost(&self) -> Option<Error> {
        self.lost_seen.get().map(|why| Error::Aborted(why.clone()))
    }

    /// The error for a rank this wait needs that will never publish, the
    /// likeliest root cause first: across processes, one that aborted, or
    /// whose process exited; one whose communicator is gone
    /// ([`Board::leave`]); across processes, else, a peer that aborted
    /// after it reached this call (most likely because of a third rank).
    fn lost(
        &self,
        me: u32,
        waits_on: &dyn Fn(u32) -> bool,
        pending: &dyn Fn() -> String,
    ) -> Option<Error> {
        let needed = |r: u32| r != me && waits_on(r);
        let aborted = match &self.mem {
            Mem::Shared(s) => s.aborted_by(),
            Mem::Mirror(m) => m.aborted_by(),
            Mem::Local(_) => None,
        }
        .filter(|&r| r != me);
        let abort_error = |r: u32| {
            Error::Aborted(format!(
                "rank {me}: peer rank {r} is lost: it aborted the communicator before any data moved: {}; rebuild it",
                pending()
            ))
        };
        if let Some(r) = aborted.filter(|&r| needed(r)) {
            return Some(abort_error(r));
        }
        let exited = (0..self.nranks)
            .filter(|&r| needed(r))
            .find_map(|r| match &self.mem {
                Mem::Shared(s) => s
                    .exited(r)
                    .map(|pid| format!("peer rank {r} (pid {pid}) exited or was killed")),
                Mem::Mirror(m) => m.closed(r).then(|| {
                    format!("peer rank {r}'s connection closed (its process exited or was killed, or its host is unreachable)")
                }),
                Mem::Local(_) => None,
            });
        if let Some(what) = exited {
            return Some(Error::Aborted(format!(
                "rank {me}: {what} before any data moved: {}; the communicator is unusable: rebuild it",
                pending()
            )));
        }
        if let Some(r) = (0..self.nranks).find(|&r| needed(r) && self.left(r)) {
            return Some(Error::Aborted(format!(
                "rank {me}: peer rank {r} destroyed or dropped its communicator before reaching this call: {}; the communicator set is unusable: rebuild it",
                pending()
            )));
        }
        aborted.map(abort_error)
    }
}

/// The other side of message `k` of `pair` in one process's log, once
/// posted (the second side to compare it removes it).
fn take_local(
    l: &Local,
    pair: (u32, u32),
    k: u64,
    other: usize,
    comparers: u8,
) -> Option<(usize, DataType, Option<u16>)> {
    let mut pairs = l.pairs.lock();
    let log = pairs.get_mut(&pair)?;
    let m = log.open.get_mut(&k)?;
    let theirs = m.sides[other]?;
    m.seen += 1;
    if m.seen == comparers {
        log.open.remove(&k);
    }
    Some(theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_spin_only_where_every_rank_has_a_core() {
        assert_eq!(spin_for(8, 16), SPIN);
        assert_eq!(spin_for(8, 8), Duration::ZERO);
        assert_eq!(spin_for(2, 2), Duration::ZERO);
    }

    /// A spinning waiter finds a record published while it spins, one
    /// published after it went to sleep, and gives up at its deadline
    /// naming the rank that never came: the spin changes how it waits,
    /// never what it returns.
    #[test]
    fn a_spinning_waiter_sees_early_and_late_records_and_its_deadline() {
        for spin in [SPIN, Duration::ZERO] {
            let board = Board {
                spin,
                ..Board::new(2)
            };
            let none = || None;
            let ctx = WaitCtx {
                rank: 0,
                deadline: Some(Duration::from_secs(10)),
                warn: Default::default(),
                failure: &none,
            };
            for (seq, delay) in [
                (1, Duration::from_micros(20)),
                (2, Duration::from_millis(30)),
            ] {
                let got = std::thread::scope(|s| {
                    s.spawn(|| {
                        std::thread::sleep(delay);
                        board.publish(1, seq, [seq, 2, 3, 4]);
                    });
                    board.publish(0, seq, [seq, 0, 0, 0]);
                    board.gather(&ctx, seq, &|| "call".into()).unwrap()
                });
                assert_eq!(got[..], [[seq, 0, 0, 0], [seq, 2, 3, 4]], "{spin:?}");
            }
            let ctx = WaitCtx {
                deadline: Some(Duration::from_millis(50)),
                ..ctx
            };
            board.publish(0, 3, [3, 0, 0, 0]);
            let e = board.gather(&ctx, 3, &|| "call #3".into()).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::Timeout(_)), "{msg}");
            assert!(msg.contains("rank 1 has not reached it"), "{msg}");
        }
    }

    /// A log that a test subscriber writes into.
    #[derive(Clone, Default)]
    struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Log {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// A wait without a deadline warns at the first period and again at
    /// every later one, naming the absent rank and the call; the absent
    /// rank publishes only once two warnings were seen, so the count does
    /// not depend on timing.
    #[test]
    fn a_long_wait_warns_first_then_periodically_naming_the_absent_rank() {
        let board = Board::new(3);
        let log = Log::default();
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        let none = || None;
        let ctx = WaitCtx {
            rank: 0,
            deadline: None,
            warn: crate::config::branches::WaitWarn {
                first: Duration::from_millis(30),
                every: Duration::from_millis(30),
            },
            failure: &none,
        };
        board.publish(0, 1, [1, 0, 0, 0]);
        board.publish(1, 1, [1, 0, 0, 0]);
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                while log.text().matches("still waiting").count() < 2 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                board.publish(2, 1, [1, 2, 0, 0]);
            });
            tracing::subscriber::with_default(subscriber, || {
                board.gather(&ctx, 1, &|| "call #1 (AllReduce)".into())
            })
        })
        .unwrap();
        assert_eq!(got[2], [1, 2, 0, 0]);
        let text = log.text();
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("still waiting"))
            .collect();
        assert!(warnings.len() >= 2, "{text}");
        for w in warnings {
            assert!(w.contains("WARN"), "{w}");
            assert!(w.contains("no deadline"), "{w}");
            assert!(
                w.contains("call #1 (AllReduce): rank 2 has not reached it"),
                "{w}"
            );
        }
    }
}
