//! The fabric: everything the ranks of one communicator share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::sync::{Parker, Unparker};
use oxccl_bootstrap::Bootstrap;
use oxccl_core::plan::{Rank, RankPlan, Step};
use oxccl_core::{with_dtype, DataType, LoweredOp};
use parking_lot::{Mutex, RwLock};

use crate::compile::{compile, Scratch};
use crate::config::HostConfig;
use crate::error::HostError;
use crate::exec::{run, ExecStats};
use crate::fifo::Link;
use crate::procs::Procs;
use crate::shm::RankCtl;
use crate::HostBuf;

/// The shared state of one communicator's ranks on the host backend:
/// connections (created on first use, kept across calls), per-rank
/// wake-ups, scratch memory and published buffers, and the failure state.
#[derive(Debug)]
pub struct HostFabric {
    nranks: u32,
    cfg: HostConfig,
    links: RwLock<HashMap<(usize, Rank, Rank), Arc<Link>>>,
    ranks: Box<[RankSlot]>,
    /// Set once, by the first deadline, mismatch or abort.
    broken: AtomicBool,
    aborted: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Ranks currently inside `execute`.
    active: AtomicU32,
    /// The wait deadline in force, in nanoseconds ([`HostFabric::set_deadline`]).
    deadline_ns: AtomicU64,
    /// Ranks in several processes: the shared part (this process holds
    /// one rank, `procs.me`).
    procs: Option<Procs>,
}

#[derive(Debug)]
struct RankSlot {
    /// Held for the whole of a call: one call per rank at a time.
    state: Mutex<RankState>,
    unparker: Unparker,
    /// Calls this rank has started (its current call's number).
    joined: AtomicU64,
    /// Calls with semaphore steps this rank has started: what remote
    /// accesses are matched by. Only those calls publish buffers and only
    /// they may be touched by peers; Send/Recv between some of the ranks
    /// (no semaphores) do not count, so ranks left out of them stay in step.
    synced: AtomicU64,
    published: Mutex<Publication>,
}

#[derive(Debug)]
struct RankState {
    parker: Parker,
    scratch: Scratch,
}

/// A rank's call numbers: every call (`call`, for diagnoses), and calls
/// with semaphore steps (`synced`, 0 for a call without), which remote
/// steps are matched by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Calls {
    pub call: u64,
    pub synced: u64,
}

/// Whether a rank plan orders itself with peers through semaphores. Every
/// plan that reads or writes a peer's memory does, on every rank (the
/// checker's rules), so a plan without them is never accessed remotely.
fn synchronizes(plan: &RankPlan) -> bool {
    plan.channels
        .iter()
        .flat_map(|c| &c.steps)
        .any(|s| matches!(s, Step::Signal { .. } | Step::Wait { .. }))
}

/// A rank's buffers for one call, for peers' remote steps.
#[derive(Debug, Default)]
struct Publication {
    call: u64,
    bufs: Vec<(usize, usize)>,
}

/// Marks a rank in a call in its shared control words, until dropped.
struct SharedActive<'a>(&'a RankCtl);

impl<'a> SharedActive<'a> {
    fn enter(ctl: &'a RankCtl) -> Self {
        ctl.active.store(1, Ordering::Release);
        SharedActive(ctl)
    }
}

impl Drop for SharedActive<'_> {
    fn drop(&mut self) {
        self.0.active.store(0, Ordering::Release);
    }
}

/// Leaves the active count when a call ends, however it ends.
struct Active<'a>(&'a AtomicU32);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl HostFabric {
    /// A fabric for `nranks` ranks. Connections are made on first use.
    pub fn new(nranks: u32, cfg: HostConfig) -> Arc<HostFabric> {
        let ranks = (0..nranks)
            .map(|_| {
                let parker = Parker::new();
                RankSlot {
                    unparker: parker.unparker().clone(),
                    state: Mutex::new(RankState {
                        parker,
                        scratch: Scratch::new(),
                    }),
                    joined: AtomicU64::new(0),
                    synced: AtomicU64::new(0),
                    published: Mutex::new(Publication::default()),
                }
            })
            .collect();
        let deadline_ns = AtomicU64::new(nanos(cfg.deadline));
        Arc::new(HostFabric {
            nranks,
            cfg: cfg.sanitized(),
            deadline_ns,
            links: RwLock::new(HashMap::new()),
            ranks,
            broken: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            reason: Mutex::new(None),
            active: AtomicU32::new(0),
            procs: None,
        })
    }

    /// The fabric of one rank of a communicator whose ranks are processes
    /// of this host, met through `boot`: every rank's FIFOs, control words
    /// and heap live in shared segments (see `shm`), and a watcher thread
    /// fails the fabric, naming the peer, when a peer's process dies.
    /// Every rank must call it, with equal `cfg`.
    pub fn across_processes(
        boot: &Bootstrap,
        cfg: HostConfig,
    ) -> Result<Arc<HostFabric>, HostError> {
        let cfg = cfg.sanitized();
        let procs = Procs::new(boot, &cfg)?;
        let mut fab = HostFabric::new(boot.nranks(), cfg);
        Arc::get_mut(&mut fab)
            .expect("a new fabric is not shared")
            .procs = Some(procs);
        let p = fab.procs.as_ref().expect("just set");
        p.watch(Arc::downgrade(&fab))?;
        Ok(fab)
    }

    /// The rank this process holds, when ranks are processes.
    pub fn process_rank(&self) -> Option<Rank> {
        self.procs.as_ref().map(|p| p.me)
    }

    /// `bytes` of memory peers can address (ranks as processes: from this
    /// rank's shared heap; as threads: any memory is, so this is the
    /// caller's job and the call fails).
    pub fn alloc_shared(&self, bytes: usize) -> Result<*mut u8, HostError> {
        match &self.procs {
            Some(p) => p.alloc(bytes).map(|a| a as *mut u8),
            None => Err(HostError::Shm(
                "ranks are threads: allocate ordinary memory".into(),
            )),
        }
    }

    /// Frees memory from [`HostFabric::alloc_shared`].
    pub fn free_shared(&self, ptr: *mut u8) {
        if let Some(p) = &self.procs {
            p.free(ptr as usize);
        }
    }

    /// Most channels a plan may have on this fabric.
    pub(crate) fn max_channels(&self) -> usize {
        if self.procs.is_some() {
            crate::shm::MAX_CHANNELS
        } else {
            usize::MAX
        }
    }

    /// A peer's process is gone (the watcher saw its pidfd). Not a failure
    /// by itself (a peer that finished its last call exits normally, and
    /// what it sent is still in our FIFOs): this rank fails once it waits
    /// on that peer ([`HostFabric::dead_peer_error`]).
    pub(crate) fn peer_lost(&self, peer: Rank, pid: u32) {
        if let Some(p) = &self.procs {
            p.mark_dead(peer);
            tracing::debug!(peer, pid, "oxccl host: a peer process exited");
            p.wake(p.me);
        }
    }

    /// The error for rank `me`, blocked on `peer`, if `peer`'s process is
    /// gone: the fabric fails, naming it.
    pub(crate) fn dead_peer_error(&self, me: Rank, peer: Rank) -> Option<HostError> {
        let p = self.procs.as_ref()?;
        if !p.is_dead(peer) {
            return None;
        }
        let err = HostError::PeerLost {
            rank: me,
            peer,
            pid: p.pid(peer),
        };
        tracing::error!(%err, "oxccl host: waiting on a dead peer");
        self.fail(err.to_string());
        Some(err)
    }

    /// Before looking for work: what [`HostFabric::park`] compares against.
    pub(crate) fn arm(&self) -> u32 {
        self.procs.as_ref().map_or(0, Procs::arm)
    }

    /// Sleeps until a peer may have unblocked this rank, or `timeout`.
    pub(crate) fn park(&self, parker: &Parker, seen: u32, timeout: Duration) {
        match &self.procs {
            Some(p) => p.park(seen, timeout),
            None => parker.park_timeout(timeout),
        }
    }

    /// The configuration the fabric was made with (after clamping `slots`
    /// to at least `MIN_FIFO_DEPTH`); the deadline in force is
    /// [`HostFabric::deadline`].
    pub fn config(&self) -> &HostConfig {
        &self.cfg
    }

    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// Runs `plan` (the part of rank `plan.rank`) on `bufs`, blocking until
    /// it is done. Called concurrently from one thread per rank, each with
    /// its own `RankPlan` of the same `Plan` (or group plan); every rank
    /// must make the same sequence of calls, as NCCL requires.
    ///
    /// `bufs` holds one entry per entry of `plan.bufs` except scratch
    /// buffers, which the fabric provides (and reuses between calls).
    ///
    /// On a deadline or a mismatch the fabric fails for good: every rank's
    /// pending call stops promptly, and later calls return
    /// [`HostError::Failed`]. Before an error returns, every rank inside a
    /// call has left it, so no peer still touches this rank's buffers.
    ///
    /// # Safety
    /// Each `HostBuf` points to `bytes` valid bytes for the whole call,
    /// aligned for `dtype`. Output buffers are not read or written by
    /// anyone else during the call (except peers through this fabric);
    /// input buffers are not written during the call. An input may alias an
    /// output (in-place calls).
    pub unsafe fn execute(
        &self,
        plan: &RankPlan,
        bufs: &[HostBuf],
        dtype: DataType,
        op: &LoweredOp,
    ) -> Result<ExecStats, HostError> {
        let me = plan.rank;
        let slot = self.ranks.get(me as usize).ok_or_else(|| {
            HostError::InvalidPlan(format!(
                "rank {me} out of range for a fabric of {} ranks",
                self.nranks
            ))
        })?;
        self.active.fetch_add(1, Ordering::AcqRel);
        let active = Active(&self.active);
        if let Some(e) = self.stop_error(me) {
            return Err(e);
        }
        if self.procs.as_ref().is_some_and(|p| p.me != me) {
            return Err(HostError::InvalidPlan(format!(
                "rank {me} is not this process's rank {}",
                self.procs.as_ref().map_or(0, |p| p.me)
            )));
        }
        let _shared_active = self.procs.as_ref().map(|p| SharedActive::enter(p.rank(me)));
        let mut state = slot.state.try_lock().ok_or_else(|| {
            HostError::InvalidPlan(format!("rank {me} is already executing on this fabric"))
        })?;
        let state = &mut *state;
        let prog = compile(self, plan, bufs, dtype.size(), &mut state.scratch)?;
        let call = slot.joined.fetch_add(1, Ordering::AcqRel) + 1;
        let synced = if synchronizes(plan) {
            let synced = slot.synced.fetch_add(1, Ordering::AcqRel) + 1;
            if let Some(p) = &self.procs {
                p.publish(synced, &prog.bufs, dtype.size());
            } else {
                *slot.published.lock() = Publication {
                    call: synced,
                    bufs: prog.bufs.clone(),
                };
            }
            synced
        } else {
            0
        };
        if let Some(p) = &self.procs {
            p.rank(me).joined.store(call, Ordering::Release);
        }
        let calls = Calls { call, synced };
        let res = with_dtype!(dtype, T => run::<T>(self, me, calls, &prog, op, &state.parker));
        if res.is_err() {
            drop(active);
            drop(_shared_active);
            self.quiesce();
        }
        res
    }

    /// Fails every rank's pending and future call promptly with
    /// [`HostError::Aborted`]. The fabric stays unusable.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        match &self.procs {
            Some(p) => self.fail(format!(
                "rank {} aborted the communicator; rebuild it",
                p.me
            )),
            None => self.fail("the communicator was aborted; rebuild it".into()),
        }
    }

    /// Why the fabric is unusable, once it is: a [`HostError::Failed`]
    /// naming the first failure and saying to rebuild the communicator.
    pub fn failure(&self) -> Option<HostError> {
        if !self.is_broken() {
            return None;
        }
        let reason = match &self.procs {
            Some(p) => p.reason(),
            None => self.reason.lock().clone().unwrap_or_default(),
        };
        Some(HostError::Failed(format!(
            "communicator failed earlier: {reason}"
        )))
    }

    /// The connection `(channel, from, to)`, created on first use.
    pub(crate) fn link(&self, channel: usize, from: Rank, to: Rank) -> Arc<Link> {
        let key = (channel, from, to);
        if let Some(l) = self.links.read().get(&key) {
            return l.clone();
        }
        self.links
            .write()
            .entry(key)
            .or_insert_with(|| {
                Arc::new(match &self.procs {
                    Some(p) => p
                        .link(channel, from, to)
                        .expect("compile checked the channel count"),
                    None => Link::new(self.cfg.slots, self.cfg.slot_bytes),
                })
            })
            .clone()
    }

    /// The longest any wait may last from now on.
    pub fn deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline_ns.load(Ordering::Acquire))
    }

    /// Changes the deadline of every pending and future wait (measured, as
    /// always, from when the wait began) and wakes every rank so a shorter
    /// one takes effect at once. Lets a caller that has seen every rank it
    /// expects arrive ([`HostFabric::calls_started`]) end the wait for the
    /// others without guessing how long arriving takes.
    pub fn set_deadline(&self, deadline: Duration) {
        self.deadline_ns.store(nanos(deadline), Ordering::Release);
        for r in self.ranks.iter() {
            r.unparker.unpark();
        }
    }

    /// How many calls `rank` has started on this fabric (`None` for a rank
    /// out of range): for tests and diagnostics, which rank has arrived.
    pub fn calls_started(&self, rank: Rank) -> Option<u64> {
        self.ranks
            .get(rank as usize)
            .map(|r| r.joined.load(Ordering::Acquire))
    }

    /// Counters `[tail, head, posted, consumed]` of a connection, if it
    /// exists: for tests and diagnostics.
    pub fn link_counters(&self, channel: usize, from: Rank, to: Rank) -> Option<[u64; 4]> {
        self.links
            .read()
            .get(&(channel, from, to))
            .map(|l| l.counters())
    }

    /// Wakes `rank` if it is parked (or makes its next park return).
    pub(crate) fn wake(&self, rank: Rank) {
        match &self.procs {
            Some(p) => p.wake(rank),
            None => self.ranks[rank as usize].unparker.unpark(),
        }
    }

    /// Marks the fabric failed (first reason wins) and wakes everyone.
    pub(crate) fn fail(&self, reason: String) {
        if let Some(p) = &self.procs {
            p.fail(&reason);
        }
        self.reason.lock().get_or_insert(reason);
        self.broken.store(true, Ordering::Release);
        for r in self.ranks.iter() {
            r.unparker.unpark();
        }
    }

    /// The error rank `me` returns if the fabric is failed.
    pub(crate) fn stop_error(&self, me: Rank) -> Option<HostError> {
        if self.aborted.load(Ordering::Acquire) {
            return Some(HostError::Aborted { rank: me });
        }
        self.failure()
    }

    /// Whether the fabric is failed (one Acquire load: checked every round).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire) || self.procs.as_ref().is_some_and(Procs::is_broken)
    }

    /// Ranks that have not started call number `call`.
    pub(crate) fn absent(&self, call: u64) -> Vec<Rank> {
        (0..self.nranks)
            .filter(|&r| match &self.procs {
                Some(p) => p.rank(r).joined.load(Ordering::Acquire) < call,
                None => self.ranks[r as usize].joined.load(Ordering::Acquire) < call,
            })
            .collect()
    }

    /// Address of `len` elements at `off` of `peer`'s buffer `buf` in call
    /// `call`, or why not.
    pub(crate) fn remote(
        &self,
        peer: Rank,
        call: u64,
        buf: usize,
        off: usize,
        len: usize,
        elem: usize,
    ) -> Result<usize, String> {
        if let Some(procs) = &self.procs {
            return procs.remote(peer, call, buf, off, len, elem);
        }
        let p = self.ranks[peer as usize].published.lock();
        if p.call != call {
            return Err(format!(
                "remote access to a peer in call {} from call {call}: the plan lacks a signal/wait before it",
                p.call
            ));
        }
        match p.bufs.get(buf) {
            Some(&(addr, blen)) if off.checked_add(len).is_some_and(|e| e <= blen) => {
                Ok(addr + off * elem)
            }
            _ => Err(format!("remote buffer {buf} has no elements {off}..+{len}")),
        }
    }

    /// Waits (bounded by the deadline) until no rank is inside a call, so
    /// that once an error returns no peer touches the caller's buffers.
    /// Every rank in a call sees the failure within a step, so this is
    /// short.
    fn quiesce(&self) {
        let start = Instant::now();
        let busy = || match &self.procs {
            // Peers known dead never leave their call.
            Some(p) => (0..self.nranks)
                .any(|r| !p.is_dead(r) && p.rank(r).active.load(Ordering::Acquire) != 0),
            None => self.active.load(Ordering::Acquire) > 0,
        };
        while busy() && start.elapsed() < self.deadline() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A duration in nanoseconds, saturating (a deadline of centuries is "never").
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
