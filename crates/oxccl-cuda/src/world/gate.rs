//! The launch gate: a launch returns only once the kernels its kernel
//! waits for, directly or through peers, have been launched too.
//!
//! Each rank's kernels run on its own stream, and the driver maps a
//! context's streams onto at most `CUDA_DEVICE_MAX_CONNECTIONS` (≤ 32)
//! hardware queues, so streams can share a queue: the ranks' streams past
//! that count, and the streams of the caller (calls on a caller's stream,
//! `streams`), which the driver places wherever it likes. A queue runs its
//! entries in order and stalls at one whose stream dependency is not met
//! (the next kernel of a rank, a copy after it, an event wait); when that
//! entry waits on a kernel that spins for a peer whose kernel is queued
//! behind the entry, nothing moves until the deadline. That is the
//! first-call deadline of 64 ranks on one GPU, and the 8-rank
//! Send/Recv ring on callers' streams whose receivers timed out while the
//! host copied each result back on its stream right after the call.
//!
//! The gate removes the cycle without touching the streams: a launch
//! returns only once every kernel of the same call that its kernel depends
//! on (the peers its plan exchanges with, their peers, and so on: the
//! call's connected ranks in this process) has been launched, so whatever
//! a rank puts on a stream after its call (its next call, a copy that
//! waits for this one) reaches the hardware after all of them. Ahead of a
//! kernel in any queue there is then only work that depends on kernels
//! already launched, which (by induction, with every block resident: see
//! `World::max_channels`) completes.
//!
//! Which launches match: a collective (or a group holding one) is launched
//! by every rank ([`Party::All`]): the k-th such launch of each rank. A
//! launch of Send/Recv only ([`Party::Peers`]) names its peers; the k-th
//! launch of rank a that names b matches the k-th launch of b that names
//! a, and the gate follows those matches from peer to peer until it has
//! the whole connected set (a Send/Recv between two ranks waits for those
//! two; a ring waits for the whole ring). The cost is a host rendezvous of
//! those ranks per call, so the gate is on only where queues may be
//! shared: past the device's queues (`GateMode::Auto`) or for a call on a
//! caller's stream.
//!
//! What it asks of the caller: connected ranks call from their own threads
//! (or in one group, whose end then launches each communicator on a thread
//! of its own). One thread that issues rank 0's call and then rank 1's,
//! outside a group, waits in rank 0's call until the deadline, which the
//! error explains.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::thread::futex;

use super::lock;

/// Whether launches on a device wait for its other ranks' launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GateMode {
    /// On for a device whose rank streams (plus its setup stream) exceed
    /// its hardware queues.
    #[default]
    Auto,
    /// Always (for experiments: what it costs at few ranks).
    On,
    /// Never (for experiments: to see the queues' deadlock).
    Off,
}

impl GateMode {
    /// An `OXCCL_LAUNCH_GATE` value: `auto` (or unset), `on`/`1`,
    /// `off`/`0`; any other value is `Auto` with a warning.
    pub fn parse(value: Option<&str>) -> GateMode {
        match value {
            None => GateMode::Auto,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "" | "auto" => GateMode::Auto,
                "on" | "1" => GateMode::On,
                "off" | "0" => GateMode::Off,
                other => {
                    tracing::warn!("OXCCL_LAUNCH_GATE={other} is not auto, on or off: auto");
                    GateMode::Auto
                }
            },
        }
    }

    /// Whether a device with `ranks_here` rank streams and `queues`
    /// hardware queues is gated (its setup stream takes one queue too).
    pub fn gates(self, ranks_here: u32, queues: u32) -> bool {
        match self {
            GateMode::On => ranks_here > 1,
            GateMode::Off => false,
            GateMode::Auto => ranks_here > 1 && ranks_here + 1 > queues,
        }
    }
}

/// Hardware queues per context the driver gives this process: what
/// `CUDA_DEVICE_MAX_CONNECTIONS` says (read by the driver at context
/// creation; `driver::init` sets it unless the user did), else the
/// driver's default of 8; the driver caps it at 32.
pub fn hardware_queues() -> u32 {
    std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map_or(8, |n| n.clamp(1, 32))
}

/// Why a gate wait ended without every rank's launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateFault {
    /// How long the wait lasted.
    pub waited: Duration,
    /// The device's ranks that had not launched this call.
    pub absent: Vec<u32>,
    /// It ended because the clique failed or was aborted, not at the
    /// deadline.
    pub aborted: bool,
}

/// How often a waiting launch looks at the clique's abort and failure
/// words (nothing wakes it for those).
const POLL: Duration = Duration::from_millis(5);

/// Launches of Send/Recv kept per rank for peers to match; older ones
/// count as launched by their counters alone.
const HISTORY: usize = 1024;

/// Whose launches a launch waits for (clique ranks).
#[derive(Clone, Copy, Debug)]
pub enum Party<'a> {
    /// Every rank of the gate launches this call (collectives).
    All,
    /// The ranks this rank's plan exchanges with (Send/Recv groups); the
    /// gate follows their own peers in turn.
    Peers(&'a [u32]),
}

/// One Send/Recv launch of a slot: for each peer slot, which of this
/// slot's launches naming that peer it is (1-based).
#[derive(Debug)]
struct Record {
    peers: Vec<(usize, u64)>,
}

#[derive(Debug)]
struct State {
    /// `(a, b)`: slot a's launches naming slot b.
    pairs: HashMap<(usize, usize), u64>,
    /// Per slot: its latest Send/Recv launches, oldest first.
    records: Vec<VecDeque<Record>>,
}

impl State {
    /// Records a Send/Recv launch of `slot` naming the slots `peers`:
    /// returns, per peer, which of `slot`'s launches naming it this is.
    fn launch(&mut self, slot: usize, peers: Vec<usize>) -> Vec<(usize, u64)> {
        let peers: Vec<(usize, u64)> = peers
            .into_iter()
            .map(|b| {
                let k = self.pairs.entry((slot, b)).or_insert(0);
                *k += 1;
                (b, *k)
            })
            .collect();
        let h = &mut self.records[slot];
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(Record {
            peers: peers.clone(),
        });
        peers
    }

    /// Slot `b`'s launch matching the `k`-th launch of `a` naming `b`:
    /// `None` while `b` has not launched it; `Some(None)` when it has but
    /// its record left the history.
    fn matching(&self, a: usize, b: usize, k: u64) -> Option<Option<&Record>> {
        if self.pairs.get(&(b, a)).copied().unwrap_or(0) < k {
            return None;
        }
        Some(
            self.records[b]
                .iter()
                .rev()
                .find(|r| r.peers.contains(&(a, k))),
        )
    }
}

/// A Send/Recv launch's walk over its connected set, kept across its
/// wake-ups: each slot of the set is reached by one edge and looked up
/// until its matching launch is found, so a ring of n ranks costs each
/// waiter O(n) lookups per call, not O(n) per wake-up.
#[derive(Debug)]
struct Walk {
    seen: Vec<bool>,
    /// Edges `(a, b, k)`: the `k`-th launch of `a` naming `b`, whose match
    /// `b` has not launched yet (or not looked at yet).
    todo: Vec<(usize, usize, u64)>,
}

impl Walk {
    /// The walk of `slot`'s launch naming `peers` (slot, count) pairs.
    fn new(nslots: usize, slot: usize, peers: &[(usize, u64)]) -> Walk {
        let mut seen = vec![false; nslots];
        seen[slot] = true;
        let mut todo = Vec::with_capacity(peers.len());
        for &(b, k) in peers {
            seen[b] = true;
            todo.push((slot, b, k));
        }
        Walk { seen, todo }
    }

    /// Follows every edge whose far end has launched its match, on to that
    /// launch's own peers; keeps the others.
    fn advance(&mut self, st: &State) {
        let mut blocked = Vec::new();
        while let Some((a, b, k)) = self.todo.pop() {
            match st.matching(a, b, k) {
                None => blocked.push((a, b, k)),
                Some(None) => {}
                Some(Some(r)) => {
                    for &(c, j) in &r.peers {
                        if !self.seen[c] {
                            self.seen[c] = true;
                            self.todo.push((b, c, j));
                        }
                    }
                }
            }
        }
        self.todo = blocked;
    }

    /// The slots whose matching launch is still missing, ascending.
    fn absent(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.todo.iter().map(|&(_, b, _)| b).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The gate of a clique's ranks in this process.
#[derive(Debug)]
pub struct Gate {
    /// The clique ranks, by slot.
    ranks: Vec<u32>,
    /// Send/Recv launches, matched under the lock.
    state: Mutex<State>,
    /// Per slot: its [`Party::All`] launches, each written by its slot's
    /// thread alone. Collectives take no lock: 128 rank threads on 16
    /// cores that pass through one mutex per call leave one after another
    /// (a lock, a condition variable: 1.75 ms per call at 128 threads on
    /// the 2-core VM).
    all: Box<[AtomicU64]>,
    /// Bumped, and its sleepers woken, when a slot completes a collective
    /// round; collectives' waiters sleep on this word.
    epoch: AtomicU32,
    /// Per slot: bumped, and its sleepers woken, after each of its
    /// Send/Recv launches is recorded. A Send/Recv waiter sleeps on the
    /// word of one slot it still waits for, so a launch wakes only those
    /// waiting for it: with one word for all, every launch of a 128-rank
    /// ring woke all 128 waiters to walk the ring again (5.3 ms a round on
    /// the 2-core VM against 0.55 ms for a collective).
    launches: Box<[AtomicU32]>,
}

impl Gate {
    /// A gate for the clique ranks `ranks` (one slot each, in this order).
    pub fn new(ranks: Vec<u32>) -> Gate {
        let n = ranks.len();
        Gate {
            ranks,
            state: Mutex::new(State {
                pairs: HashMap::new(),
                records: (0..n).map(|_| VecDeque::new()).collect(),
            }),
            all: (0..n).map(|_| AtomicU64::new(0)).collect(),
            epoch: AtomicU32::new(0),
            launches: (0..n).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// The slot of clique rank `rank`, if it is in this gate.
    pub fn slot(&self, rank: u32) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }

    /// Counts a launch of `slot` without waiting (a launch that failed
    /// before reaching the stream: its peers must not wait for it).
    pub fn count(&self, slot: usize, party: Party<'_>) {
        self.record(slot, party);
    }

    /// Counts a launch of `slot`, then waits until every launch it is
    /// connected to has been made, at most `deadline` (`None`: no
    /// deadline), returning early when `stop()` says the clique failed or
    /// was aborted.
    pub fn pass(
        &self,
        slot: usize,
        party: Party<'_>,
        deadline: Option<Duration>,
        stop: impl Fn() -> bool,
    ) -> Result<(), GateFault> {
        let start = Instant::now();
        let end = deadline.and_then(|d| start.checked_add(d));
        let mut mine = match self.record(slot, party) {
            Mine::Nothing => return Ok(()),
            Mine::All(k) => Wait::All(k),
            Mine::Peers(peers) => Wait::Peers(Walk::new(self.ranks.len(), slot, &peers)),
        };
        loop {
            // The word to sleep on and its value, read so that a change
            // after the check moves the word and the futex then does not
            // sleep: before the check, or (Send/Recv) under the lock the
            // check holds, since a launch is recorded under it before its
            // word moves.
            let (absent, word) = match &mut mine {
                Wait::All(k) => {
                    let seen = self.epoch.load(Ordering::Acquire);
                    (self.behind(*k, false), (&self.epoch, seen))
                }
                Wait::Peers(walk) => {
                    let st = lock(&self.state);
                    walk.advance(&st);
                    let absent = walk.absent();
                    let w = &self.launches[absent.first().copied().unwrap_or(slot)];
                    let seen = w.load(Ordering::Acquire);
                    (absent, (w, seen))
                }
            };
            if absent.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            let aborted = stop();
            if aborted || end.is_some_and(|e| now >= e) {
                let absent = match &mine {
                    Wait::All(k) => self.behind(*k, true),
                    Wait::Peers(_) => absent,
                };
                return Err(GateFault {
                    waited: now - start,
                    absent: absent.iter().map(|&s| self.ranks[s]).collect(),
                    aborted,
                });
            }
            let slice = end.map_or(POLL, |e| (e - now).min(POLL));
            let ts = rustix::event::Timespec {
                tv_sec: slice.as_secs() as _,
                tv_nsec: slice.subsec_nanos() as _,
            };
            // Returns at a wake-up, at the slice's end, or at once if the
            // word already moved; each is checked again above.
            let _ = futex::wait(word.0, futex::Flags::PRIVATE, word.1, Some(&ts));
        }
    }

    /// The slots behind collective round `k`, ascending; only the first
    /// unless `every` asks for each one.
    fn behind(&self, k: u64, every: bool) -> Vec<usize> {
        let behind = (0..self.all.len()).filter(|&s| self.all[s].load(Ordering::SeqCst) < k);
        if every {
            behind.collect()
        } else {
            behind.take(1).collect()
        }
    }

    /// Moves `word` and wakes every waiter sleeping on it.
    fn bump(word: &AtomicU32) {
        word.fetch_add(1, Ordering::Release);
        let _ = futex::wake(word, futex::Flags::PRIVATE, i32::MAX as u32);
    }

    /// Adds one launch of `slot` and wakes the waiters it may release.
    fn record(&self, slot: usize, party: Party<'_>) -> Mine {
        match party {
            Party::All => {
                let k = self.all[slot].fetch_add(1, Ordering::SeqCst) + 1;
                // Of slots finishing round k together, at least the later
                // of any two sees the other's count (both SeqCst), so the
                // last one in always wakes the round.
                if self.all.iter().all(|c| c.load(Ordering::SeqCst) >= k) {
                    Self::bump(&self.epoch);
                }
                Mine::All(k)
            }
            Party::Peers(ranks) => {
                let mut peers: Vec<usize> = ranks
                    .iter()
                    .filter_map(|&r| self.slot(r))
                    .filter(|&b| b != slot)
                    .collect();
                peers.sort_unstable();
                peers.dedup();
                if peers.is_empty() {
                    return Mine::Nothing;
                }
                let peers = lock(&self.state).launch(slot, peers);
                // After the record is in: a waiter reads this word under
                // the lock, after looking for the record, so either it saw
                // the record or the word moves past what it read.
                Self::bump(&self.launches[slot]);
                Mine::Peers(peers)
            }
        }
    }
}

/// What one launch was: its `All` count, the (slot, count) pairs its
/// Send/Recv record names, or nothing to wait for.
enum Mine {
    All(u64),
    Peers(Vec<(usize, u64)>),
    Nothing,
}

/// What a passing launch waits for.
enum Wait {
    All(u64),
    Peers(Walk),
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn auto_gates_only_past_the_queues() {
        assert!(!GateMode::Auto.gates(8, 32));
        assert!(!GateMode::Auto.gates(31, 32));
        assert!(GateMode::Auto.gates(32, 32));
        assert!(GateMode::Auto.gates(8, 8));
        assert!(!GateMode::Auto.gates(1, 1));
        assert!(GateMode::On.gates(2, 32));
        assert!(!GateMode::Off.gates(128, 32));
    }

    /// `n` ranks launch `rounds` times in threads; round k waits for
    /// `peers(k, rank)` (`None`: every rank). Fails where a launch returns
    /// before a rank of `set(k, rank)`, its connected set, launched round k.
    fn launches_wait_for_their_sets(
        n: usize,
        rounds: u64,
        peers: fn(u64, usize) -> Option<Vec<u32>>,
        set: fn(u64, usize) -> Vec<usize>,
    ) {
        let gate = Arc::new(Gate::new((0..n as u32).collect()));
        let launched: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let handles: Vec<_> = (0..n)
            .map(|s| {
                let (gate, launched) = (gate.clone(), launched.clone());
                std::thread::spawn(move || {
                    for k in 1..=rounds {
                        launched[s].store(k, Ordering::SeqCst);
                        let peers = peers(k, s);
                        let party = peers.as_deref().map_or(Party::All, Party::Peers);
                        gate.pass(s, party, Some(Duration::from_secs(60)), || false)
                            .map_err(|f| format!("slot {s} round {k}: {f:?}"))?;
                        if let Some(p) = set(k, s)
                            .into_iter()
                            .find(|&p| launched[p].load(Ordering::SeqCst) < k)
                        {
                            return Err(format!("slot {s} passed round {k} before slot {p}"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread").expect("gate order");
        }
    }

    /// 128 ranks, 50 calls each: no rank returns from call k before every
    /// rank has launched call k.
    #[test]
    fn no_rank_passes_a_call_before_every_rank_launched_it() {
        launches_wait_for_their_sets(128, 50, |_, _| None, |_, _| (0..128).collect());
    }

    /// 128 ranks in a Send/Recv ring, 30 calls each (each waiter sleeps on
    /// one absent rank's word at a time): no rank returns from call k
    /// before the whole ring has launched call k.
    #[test]
    fn no_rank_of_a_128_ring_passes_before_the_ring_launched() {
        launches_wait_for_their_sets(
            128,
            30,
            |_, r| Some(vec![((r + 1) % 128) as u32, ((r + 127) % 128) as u32]),
            |_, _| (0..128).collect(),
        );
    }

    /// A rank that never launches: the others stop at the deadline, naming it.
    #[test]
    fn a_missing_rank_is_named_at_the_deadline() {
        let gate = Arc::new(Gate::new(vec![4, 5, 6]));
        let g = gate.clone();
        let t = std::thread::spawn(move || {
            g.pass(1, Party::All, Some(Duration::from_millis(100)), || false)
        });
        let f = gate
            .pass(0, Party::All, Some(Duration::from_millis(100)), || false)
            .expect_err("rank 6 never launched");
        assert_eq!(f.absent, vec![6]);
        assert!(!f.aborted);
        assert!(f.waited >= Duration::from_millis(100));
        assert_eq!(t.join().expect("thread").expect_err("same").absent, vec![6]);
    }

    /// An abort ends the wait without a deadline.
    #[test]
    fn an_abort_ends_the_wait() {
        let gate = Gate::new(vec![0, 1]);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s.store(true, Ordering::SeqCst);
        });
        let f = gate
            .pass(0, Party::All, None, || stop.load(Ordering::SeqCst))
            .expect_err("aborted");
        t.join().expect("thread");
        assert!(f.aborted);
        assert_eq!(f.absent, vec![1]);
    }

    /// A failed launch is counted without waiting, so its peers pass.
    #[test]
    fn a_counted_failure_releases_the_peers() {
        let gate = Gate::new(vec![0, 1]);
        gate.count(1, Party::All);
        assert_eq!(
            gate.pass(0, Party::All, Some(Duration::from_secs(5)), || false),
            Ok(())
        );
        assert_eq!(gate.slot(1), Some(1));
        assert_eq!(gate.slot(7), None);
    }

    /// Send/Recv between two ranks of four waits for those two only: the
    /// other two never launch, and the pair passes at once.
    #[test]
    fn a_pair_waits_for_its_pair_only() {
        let gate = Arc::new(Gate::new(vec![0, 1, 2, 3]));
        let g = gate.clone();
        let t = std::thread::spawn(move || {
            g.pass(1, Party::Peers(&[0]), Some(Duration::from_secs(20)), || {
                false
            })
        });
        assert_eq!(
            gate.pass(0, Party::Peers(&[1]), Some(Duration::from_secs(20)), || {
                false
            }),
            Ok(())
        );
        assert_eq!(t.join().expect("thread"), Ok(()));
    }

    /// A ring of Send/Recv (each rank names only its two neighbours)
    /// waits for the whole ring: with one rank absent, every other rank,
    /// even those two hops away from it, names it at the deadline.
    #[test]
    fn a_ring_waits_for_the_whole_ring() {
        const N: u32 = 6;
        let gate = Arc::new(Gate::new((0..N).collect()));
        let absent = 3u32;
        let handles: Vec<_> = (0..N)
            .filter(|&r| r != absent)
            .map(|r| {
                let g = gate.clone();
                std::thread::spawn(move || {
                    let peers = [(r + 1) % N, (r + N - 1) % N];
                    g.pass(
                        r as usize,
                        Party::Peers(&peers),
                        Some(Duration::from_millis(150)),
                        || false,
                    )
                })
            })
            .collect();
        for h in handles {
            let f = h
                .join()
                .expect("thread")
                .expect_err("rank 3 never launched");
            assert_eq!(f.absent, vec![absent]);
        }
    }

    /// 16 ranks, 200 rounds mixing collectives, rings and pairs (in the
    /// same order on every rank, as calls are): no launch returns before
    /// every launch of its connected set was made.
    #[test]
    fn no_launch_passes_before_its_connected_set() {
        const N: usize = 16;
        // Round k: 0 every rank (All), 1 a ring, 2 pairs (2i, 2i+1).
        let peers_of = |k: u64, r: usize| -> Option<Vec<u32>> {
            match k % 3 {
                0 => None,
                1 => Some(vec![((r + 1) % N) as u32, ((r + N - 1) % N) as u32]),
                _ => Some(vec![(r ^ 1) as u32]),
            }
        };
        // The connected set: everyone, except in pair rounds.
        let set_of = |k: u64, r: usize| -> Vec<usize> {
            if k % 3 == 2 {
                vec![r, r ^ 1]
            } else {
                (0..N).collect()
            }
        };
        launches_wait_for_their_sets(N, 200, peers_of, set_of);
    }
}
