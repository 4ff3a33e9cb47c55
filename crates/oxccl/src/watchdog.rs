//! The watchdog of calls a backend enqueues (CUDA): a call that has not
//! completed `Config::wait_warn.first` after its launch, and again every
//! `wait_warn.every`, gets one WARN line on stderr (no debug variable
//! needed) naming the communicator, the call and the ranks that have not
//! reached it.
//!
//! On a blocking backend (host) the caller's thread waits inside the
//! call, and that wait warns itself. On CUDA the wait is a kernel spinning
//! on its peers' flags, and through the C ABI the caller's thread has long
//! left the library (`ncclAllReduce` returns at once; the framework syncs
//! its stream), so nothing in the wait can speak. Here each clique of this
//! process gets one thread, started at its first enqueued call, that wakes
//! a few times per warning period (at most once a second) and asks the
//! backend, through [`crate::backend::Backend::probe`] (a CUDA event it
//! records on the rank's stream and queries: `cuEventQuery`), whether the
//! rank's work launched so far has completed. The thread is in relaxed
//! capture mode, and a rank whose stream is being captured into a graph
//! is not probed until the capture ends (an event recorded there would
//! join the caller's graph); calls replayed from a captured graph do not
//! pass through the library and are not watched. The launch path only
//! bumps counters and stores the call's four fingerprint words (no lock,
//! no synchronisation, nothing recorded on the stream); the caller is
//! never blocked. The thread ends within one tick once every communicator
//! of the clique is dropped, or the clique fails (abort, a peer's
//! failure).
//!
//! Who has not reached the call: ranks of this process are read from
//! their own counters (a rank that has not launched it); ranks of other
//! processes from the call check's board (a rank whose host side has not
//! published it). A rank of another process that did publish it may still
//! be behind on its device: that cannot be read from here, and the line
//! says so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use oxccl_core::DataType;

use crate::backend::Backend;
use crate::backend::Completion;
use crate::check::Call;
use crate::config::branches::WaitWarn;
use oxccl_core::ranks_with;

/// What a launch was, as the watchdog names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Launched {
    /// A collective call (its fingerprint).
    Coll(Call),
    /// One launch of a group's merged plan: its data type, and whether it
    /// holds Send/Recv only (launched by the ranks it names, not all).
    Group { dtype: DataType, p2p_only: bool },
}

impl std::fmt::Display for Launched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Launched::Coll(c) => write!(f, "{c}"),
            Launched::Group {
                dtype,
                p2p_only: false,
            } => write!(f, "a group launch of {dtype}"),
            Launched::Group {
                dtype,
                p2p_only: true,
            } => write!(f, "a Send/Recv launch of {dtype}"),
        }
    }
}

/// Tags of [`Launched`] in [`Watch::words`]' first word.
const COLL: u64 = 1;
const GROUP: u64 = 2;
const P2P: u64 = 3;

/// One communicator's launches, as its watchdog reads them.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// Launches so far.
    launched: AtomicU64,
    /// Launches every rank makes alike (all but Send/Recv-only ones): the
    /// same count on every rank at the same call.
    common: AtomicU64,
    /// The last launch: a tag, then its fingerprint or data type.
    words: [AtomicU64; 4],
    /// The communicator was destroyed or dropped: no more warnings.
    closed: AtomicBool,
}

/// A snapshot of a [`Watch`].
#[derive(Clone, Copy, Debug)]
struct Seen {
    launched: u64,
    common: u64,
    what: Option<Launched>,
}

impl Watch {
    /// Notes one launch (after the backend enqueued it): a few relaxed
    /// stores, then the counters, released. Only the thread holding the
    /// communicator's call lock launches, so the counters are bumped by a
    /// load and a store, not a locked read-modify-write.
    pub fn note(&self, what: Launched) {
        let words = match what {
            Launched::Coll(c) => {
                let [a, b, c] = c.encode(false);
                [COLL, a, b, c]
            }
            Launched::Group { dtype, p2p_only } => {
                [if p2p_only { P2P } else { GROUP }, dtype as u64, 0, 0]
            }
        };
        for (slot, w) in self.words.iter().zip(words) {
            slot.store(w, Ordering::Relaxed);
        }
        if !matches!(what, Launched::Group { p2p_only: true, .. }) {
            let n = self.common.load(Ordering::Relaxed);
            self.common.store(n + 1, Ordering::Release);
        }
        let n = self.launched.load(Ordering::Relaxed);
        self.launched.store(n + 1, Ordering::Release);
    }

    /// The communicator is gone: its watchdog stops watching it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn seen(&self) -> Seen {
        let launched = self.launched.load(Ordering::Acquire);
        let common = self.common.load(Ordering::Acquire);
        let w = self.words.each_ref().map(|a| a.load(Ordering::Relaxed));
        // A launch noted while these were read may mix two calls' words:
        // the description is then left out rather than made up.
        let stable = self.launched.load(Ordering::Acquire) == launched;
        let what = match w[0] {
            _ if !stable => None,
            COLL => Call::decode([w[1], w[2], w[3]]).map(|(c, _)| Launched::Coll(c)),
            GROUP | P2P => DataType::ALL
                .iter()
                .find(|&&d| d as u64 == w[1])
                .map(|&dtype| Launched::Group {
                    dtype,
                    p2p_only: w[0] == P2P,
                }),
            _ => None,
        };
        Seen {
            launched,
            common,
            what,
        }
    }
}

/// What the watchdog reads of the clique it watches (the clique answers,
/// in `comm.rs`).
pub(crate) trait Watched: Send + Sync + 'static {
    fn watchdog(&self) -> &Watchdog;
    fn backend(&self) -> &dyn Backend;
    fn nranks(&self) -> u32;
    /// The communicator's identity, as tools see it.
    fn tool_id(&self) -> u64;
    fn wait_warn(&self) -> WaitWarn;
    /// The latest collective call `rank` published on the call board;
    /// `None` where calls are not checked.
    fn published(&self, rank: u32) -> Option<u64>;
}

/// A clique's watchdog: the watches of its ranks in this process, and its
/// thread, started at the first enqueued launch.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    ranks: parking_lot::Mutex<Vec<(u32, Arc<Watch>)>>,
    started: OnceLock<()>,
}

impl Watchdog {
    /// A watch for `rank`'s communicator, watched from now on.
    pub fn watch(&self, rank: u32) -> Arc<Watch> {
        let w = Arc::new(Watch::default());
        self.ranks.lock().push((rank, w.clone()));
        w
    }

    /// Starts the clique's thread, once (after the first enqueued launch
    /// of any of its ranks). A clique whose backend blocks needs none.
    pub fn start<C: Watched>(&self, clique: &Arc<C>) {
        if self.started.get().is_some() || clique.backend().blocking() {
            return;
        }
        self.started.get_or_init(|| {
            let weak = Arc::downgrade(clique);
            let tick = tick(clique.wait_warn());
            let spawned = std::thread::Builder::new()
                .name("oxccl-watchdog".into())
                .spawn(move || run(&weak, tick));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "oxccl: no watchdog thread: late ranks will not be named");
            }
        });
    }
}

/// How often the thread looks: a quarter of the shorter period, between
/// 5 ms and 1 s.
fn tick(w: WaitWarn) -> Duration {
    (w.first.min(w.every) / 4).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// What the thread keeps of one rank: launches known complete, and the
/// probe of the launches after them it is waiting on.
#[derive(Default)]
struct Track {
    done: u64,
    probe: Option<Probe>,
    /// The backend gave no completion handle: not watched.
    unsupported: bool,
}

struct Probe {
    completion: Box<dyn Completion>,
    seen: Seen,
    since: Instant,
    next_warn: Duration,
}

fn run<C: Watched>(clique: &Weak<C>, tick: Duration) {
    let mut tracks: Vec<(u32, Track)> = Vec::new();
    match clique.upgrade() {
        Some(cl) => cl.backend().watchdog_thread(),
        None => return,
    }
    loop {
        std::thread::sleep(tick);
        let Some(cl) = clique.upgrade() else { return };
        if cl.backend().failure().is_some() {
            return;
        }
        let watches: Vec<(u32, Arc<Watch>)> = cl.watchdog().ranks.lock().clone();
        if watches
            .iter()
            .all(|(_, w)| w.closed.load(Ordering::Acquire))
        {
            // Every communicator is gone; the clique goes with the last
            // handle to it (a buffer may still hold its backend).
            return;
        }
        for (rank, w) in &watches {
            if w.closed.load(Ordering::Acquire) {
                continue;
            }
            let t = match tracks.iter_mut().position(|(r, _)| r == rank) {
                Some(i) => &mut tracks[i].1,
                None => {
                    tracks.push((*rank, Track::default()));
                    &mut tracks.last_mut().expect("just pushed").1
                }
            };
            look(cl.as_ref(), *rank, w, &watches, t);
        }
    }
}

/// One look at `rank`: probe its launches not known complete, and warn
/// when a probe has waited past its period.
fn look(cl: &dyn Watched, rank: u32, w: &Watch, all: &[(u32, Arc<Watch>)], t: &mut Track) {
    if t.unsupported {
        return;
    }
    if t.probe.is_none() {
        let seen = w.seen();
        if seen.launched <= t.done {
            return;
        }
        match cl.backend().probe(rank) {
            // Not now (a graph capture): looked at again next tick.
            Ok(None) => {}
            Ok(Some(completion)) => {
                t.probe = Some(Probe {
                    completion,
                    seen,
                    since: Instant::now(),
                    next_warn: cl.wait_warn().first,
                });
            }
            Err(e) => {
                tracing::debug!(rank, error = %e, "oxccl: the watchdog cannot follow this rank's launches");
                t.unsupported = true;
            }
        }
        return;
    }
    let Some(p) = t.probe.as_mut() else { return };
    match p.completion.is_done() {
        // A failed query is the clique's failure, reported elsewhere.
        Ok(true) | Err(_) => {
            t.done = p.seen.launched;
            t.probe = None;
        }
        Ok(false) => {
            let waited = p.since.elapsed();
            if waited >= p.next_warn {
                p.next_warn = waited + cl.wait_warn().every;
                crate::debug::warn_loud(rank, &message(cl, rank, &p.seen, waited, all));
            }
        }
    }
}

/// The WARN line for `rank`'s launch `seen` pending for `waited`.
fn message(
    cl: &dyn Watched,
    rank: u32,
    seen: &Seen,
    waited: Duration,
    all: &[(u32, Arc<Watch>)],
) -> String {
    let what = match seen.what {
        Some(l) => format!("call #{} ({l})", seen.launched),
        None => format!("call #{}", seen.launched),
    };
    let mut parts = Vec::new();
    let p2p = matches!(seen.what, Some(Launched::Group { p2p_only: true, .. }));
    let local: Vec<u32> = all.iter().map(|(r, _)| *r).collect();
    if !p2p {
        // Ranks of this process that have not launched it.
        let absent: Vec<u32> = all
            .iter()
            .filter(|(r, w)| *r != rank && w.seen().common < seen.common)
            .map(|(r, _)| *r)
            .collect();
        if !absent.is_empty() {
            parts.push(ranks_with(
                &absent,
                ("has not launched it", "have not launched it"),
            ));
        }
    }
    let others: Vec<u32> = (0..cl.nranks()).filter(|r| !local.contains(r)).collect();
    if !others.is_empty() {
        let mine = cl.published(rank).unwrap_or(0);
        if mine > 0 && !p2p {
            let behind: Vec<u32> = others
                .iter()
                .copied()
                .filter(|&r| cl.published(r).unwrap_or(0) < mine)
                .collect();
            let ahead: Vec<u32> = others
                .iter()
                .copied()
                .filter(|r| !behind.contains(r))
                .collect();
            if !behind.is_empty() {
                parts.push(format!(
                    "{} of other processes {} call #{mine} of the call check",
                    oxccl_core::ranks_named(&behind),
                    plural(&behind, "has not reached", "have not reached")
                ));
            }
            if !ahead.is_empty() {
                parts.push(format!(
                    "{} of other processes {} it on the host; whether {} cannot be read from this process",
                    oxccl_core::ranks_named(&ahead),
                    plural(&ahead, "has reached", "have reached"),
                    plural(&ahead, "its device has too", "their devices have too")
                ));
            }
        } else {
            parts.push(format!(
                "this rank waits for {} (other processes), whose progress cannot be read from this process",
                oxccl_core::ranks_named(&others)
            ));
        }
    }
    if parts.is_empty() {
        parts.push(
            "every rank of this process launched it; their devices have not finished it".into(),
        );
    }
    format!(
        "oxccl: rank {rank} of communicator {:#x} ({} ranks): {what} has not completed after {waited:.1?}: {}",
        cl.tool_id(),
        cl.nranks(),
        parts.join("; ")
    )
}

/// `one` for a single rank, else `many`.
fn plural<'a>(ranks: &[u32], one: &'a str, many: &'a str) -> &'a str {
    if ranks.len() == 1 {
        one
    } else {
        many
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::{CollKind, RedOp};

    #[test]
    fn a_watch_reads_back_its_last_launch_and_counts_common_ones() {
        let w = Watch::default();
        let c = Call::coll(CollKind::AllReduce, DataType::F32, 1024, RedOp::Sum, 0);
        w.note(Launched::Coll(c));
        w.note(Launched::Group {
            dtype: DataType::Bf16,
            p2p_only: true,
        });
        let s = w.seen();
        assert_eq!((s.launched, s.common), (2, 1));
        assert_eq!(
            s.what,
            Some(Launched::Group {
                dtype: DataType::Bf16,
                p2p_only: true
            })
        );
        w.note(Launched::Coll(c));
        assert_eq!(w.seen().what, Some(Launched::Coll(c)));
    }

    /// A clique of 4 ranks whose board holds `board[r]` for rank `r`.
    #[derive(Debug)]
    struct Fake {
        dog: Watchdog,
        backend: crate::backend::null::NullBackend,
        board: parking_lot::Mutex<Vec<u64>>,
    }

    impl Watched for Fake {
        fn watchdog(&self) -> &Watchdog {
            &self.dog
        }
        fn backend(&self) -> &dyn Backend {
            &self.backend
        }
        fn nranks(&self) -> u32 {
            4
        }
        fn tool_id(&self) -> u64 {
            0xab
        }
        fn wait_warn(&self) -> WaitWarn {
            WaitWarn::default()
        }
        fn published(&self, rank: u32) -> Option<u64> {
            self.board.lock().get(rank as usize).copied()
        }
    }

    /// Ranks not watched here stand for ranks of other processes: those
    /// behind on the board are named as not having reached the call, the
    /// others as unreadable; ranks watched here by their launches.
    #[test]
    fn the_warning_names_local_ranks_by_launches_and_others_by_the_board() {
        let cl = Fake {
            dog: Watchdog::default(),
            backend: crate::backend::null::NullBackend::new(4, 1 << 16),
            board: parking_lot::Mutex::new(vec![1, 1, 0, 1]),
        };
        let (w0, w1) = (cl.dog.watch(0), cl.dog.watch(1));
        let c = Call::coll(CollKind::AllReduce, DataType::F32, 8, RedOp::Sum, 0);
        w0.note(Launched::Coll(c));
        let all = cl.dog.ranks.lock().clone();
        let line = message(&cl, 0, &w0.seen(), Duration::from_secs(10), &all);
        assert!(line.contains("communicator 0xab (4 ranks)"), "{line}");
        assert!(
            line.contains("call #1 (allreduce(sum) of 8 x float)"),
            "{line}"
        );
        assert!(line.contains("rank 1 has not launched it"), "{line}");
        assert!(
            line.contains("rank 2 of other processes has not reached call #1 of the call check"),
            "{line}"
        );
        assert!(
            line.contains(
                "rank 3 of other processes has reached it on the host; whether its device"
            ),
            "{line}"
        );
        w1.note(Launched::Coll(c));
        cl.board.lock()[2] = 1;
        let line = message(&cl, 0, &w0.seen(), Duration::from_secs(10), &all);
        assert!(
            !line.contains("not launched") && !line.contains("not reached"),
            "{line}"
        );
        assert!(
            line.contains("ranks 2-3 of other processes have reached it"),
            "{line}"
        );
    }

    #[test]
    fn the_tick_is_a_quarter_period_within_bounds() {
        let w = |a, b| crate::config::branches::WaitWarn {
            first: Duration::from_millis(a),
            every: Duration::from_millis(b),
        };
        assert_eq!(tick(w(10_000, 60_000)), Duration::from_secs(1));
        assert_eq!(tick(w(40, 400)), Duration::from_millis(10));
        assert_eq!(tick(w(1, 1)), Duration::from_millis(5));
    }
}
