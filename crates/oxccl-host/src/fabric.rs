//! The fabric: everything the ranks of one communicator share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::sync::{Parker, Unparker};
use oxccl_bootstrap::Bootstrap;
use oxccl_core::plan::{Rank, RankPlan, Step};
use oxccl_core::{with_dtype, Awaited, DataType, FaultCause, LoweredOp, WaitFault};
use parking_lot::{Mutex, RwLock};

use crate::compile::Scratch;
use crate::config::HostConfig;
use crate::error::HostError;
use crate::exec::{run, ExecStats};
use crate::fifo::Link;
use crate::landing::landings;
use crate::net::NetPart;
use crate::procs::Procs;
use crate::program_cache::ProgramCache;
use crate::remote::{RemoteAccess, RemoteFault};
use crate::shm::RankCtl;
use crate::view::{BlockedAt, Calls};
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
    /// Set once by [`HostFabric::abort`]: its reason, published with the
    /// flag itself, so no rank sees the abort without why.
    aborted: std::sync::OnceLock<String>,
    reason: Mutex<Option<String>>,
    /// Ranks currently inside `execute`.
    active: AtomicU32,
    /// The wait deadline in force, in nanoseconds ([`HostFabric::set_deadline`]).
    deadline_ns: AtomicU64,
    /// Ranks in several processes: the shared part (this process holds
    /// one rank, `procs.me`).
    procs: Option<Procs>,
    /// Ranks in several processes over the network (this process holds
    /// one rank, `net.me`). Last, so it drops after `links`: its proxy
    /// closes every connection before letting go of the links it serves.
    net: Option<NetPart>,
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
    programs: ProgramCache,
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
                        programs: ProgramCache::default(),
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
            aborted: std::sync::OnceLock::new(),
            reason: Mutex::new(None),
            active: AtomicU32::new(0),
            procs: None,
            net: None,
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
        if Self::over_network(boot, &cfg)? {
            let mut fab = HostFabric::new(boot.nranks(), cfg);
            let me = fab
                .ranks
                .get(boot.rank() as usize)
                .ok_or_else(|| HostError::Net(format!("rank {} out of range", boot.rank())))?
                .unparker
                .clone();
            let net = NetPart::new(boot, &fab.cfg, me)?;
            Arc::get_mut(&mut fab)
                .expect("a new fabric is not shared")
                .net = Some(net);
            if boot.nranks() > 1 {
                let hop = crate::net::hop::measure(fab.as_ref(), boot)?;
                tracing::info!("oxccl-host: one network hop takes {hop:.1} us (measured at setup)");
                if let Some(n) = &fab.net {
                    let _ = n.hop_us.set(hop);
                }
            }
            return Ok(fab);
        }
        let procs = Procs::new(boot, &cfg)?;
        let mut fab = HostFabric::new(boot.nranks(), cfg);
        Arc::get_mut(&mut fab)
            .expect("a new fabric is not shared")
            .procs = Some(procs);
        let p = fab.procs.as_ref().expect("just set");
        let weak = Arc::downgrade(&fab);
        p.watch(move |r, pid| {
            if let Some(fab) = weak.upgrade() {
                fab.peer_lost(r, pid);
            }
        })?;
        Ok(fab)
    }

    /// Whether this rank talks to its peers over the network: ranks on
    /// different hosts, or forced by `cfg.force_network` (which the facade
    /// sets from `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`, or `OXCCL_`
    /// twins). Every rank must agree (checked).
    fn over_network(boot: &Bootstrap, cfg: &HostConfig) -> Result<bool, HostError> {
        let mine = Self::network_wanted(boot, cfg.force_network);
        for (r, v) in boot.all_gather(&[mine as u8])?.iter().enumerate() {
            if v.as_slice() != [mine as u8] {
                return Err(HostError::Net(format!(
                    "rank {r} {} the network, rank {} {}: set NCCL_P2P_DISABLE and NCCL_SHM_DISABLE alike on every rank",
                    if mine { "does not use" } else { "uses" },
                    boot.rank(),
                    if mine { "does" } else { "does not" },
                )));
            }
        }
        Ok(mine)
    }

    /// Whether this rank asks for the network (before the ranks agree, as
    /// [`HostFabric::across_processes`] makes them): some rank is on
    /// another host, or `forced` ([`HostConfig::force_network`], which
    /// `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1` set). Backends that stage
    /// their data through this fabric (CUDA ranks as processes) ask it
    /// before choosing a path that would bypass the network.
    pub fn network_wanted(boot: &Bootstrap, forced: bool) -> bool {
        forced || !boot.all_local()
    }

    /// The rank this process holds, when ranks are processes.
    pub fn process_rank(&self) -> Option<Rank> {
        self.procs
            .as_ref()
            .map(|p| p.me)
            .or(self.net.as_ref().map(|n| n.me))
    }

    /// The transport between this process's rank and its peers when it is
    /// the network (as NCCL logs it: `NET/Socket/0`), else `None`.
    pub fn network(&self) -> Option<&str> {
        self.net.as_ref().map(|n| n.via.as_str())
    }

    /// Over the network: every connection's layout as the ranks agreed it,
    /// `(threads, sockets per thread)`; `None` otherwise (or over a
    /// network plugin, which lays out its own connections).
    pub fn network_sockets(&self) -> Option<(usize, usize)> {
        self.net.as_ref().and_then(|n| n.sockets)
    }

    /// Over the network: the bandwidth per host every rank agreed on at
    /// setup for the cost model, GB/s (0 where unknown); `None` otherwise.
    pub fn network_bandwidth(&self) -> Option<f64> {
        self.net.as_ref().map(|n| n.bw_gbps)
    }

    /// Over the network: the device the chosen network runs on, as its
    /// transport states it (a plugin's `properties`, the built-in TCP's
    /// interface); `None` otherwise.
    pub fn network_device(&self) -> Option<&oxccl_net::Properties> {
        self.net.as_ref().and_then(|n| n.device.as_ref())
    }

    /// Over the network: the latency the network's device states, µs, the
    /// largest of every rank's (so every rank's model prices it alike); 0
    /// where none states one, `None` off the network.
    pub fn network_device_latency_us(&self) -> Option<f64> {
        self.net.as_ref().map(|n| n.device_latency_us)
    }

    /// Over the network: one hop's latency in µs (a message from one
    /// rank's executor to the next one's, through both proxies and the
    /// transport), measured at setup and agreed by every rank; `None`
    /// otherwise. The cost model takes at least the device's stated
    /// latency ([`HostFabric::network_device_latency_us`]) on top of it
    /// (`oxccl_topo::NetPlacement::hop_latency_us`).
    pub fn network_hop_us(&self) -> Option<f64> {
        self.net.as_ref().and_then(|n| n.hop_us.get().copied())
    }

    /// Over the network: the throughput in GB/s of one plain TCP stream
    /// of `bytes` bytes on this rank's interface, measured now (the
    /// transport's ceiling per connection); `None` otherwise.
    pub fn stream_bandwidth(&self, bytes: usize) -> Option<Result<f64, HostError>> {
        let n = self.net.as_ref()?;
        Some(
            oxccl_net::stream_throughput(n.ip, bytes, 5, self.deadline())
                .map_err(|e| HostError::Net(e.to_string())),
        )
    }

    /// Over the network: GB/s of each of two TCP streams of `bytes` bytes
    /// on this rank's interface run at once, measured now
    /// ([`oxccl_net::streams_throughput`]); `None` otherwise.
    pub fn duplex_bandwidth(&self, bytes: usize) -> Option<Result<f64, HostError>> {
        let n = self.net.as_ref()?;
        Some(
            oxccl_net::streams_throughput(n.ip, bytes, 2, 5, self.deadline())
                .map_err(|e| HostError::Net(e.to_string())),
        )
    }

    /// Whether scratch and `alloc` memory come from a heap peers map.
    pub(crate) fn shared_heap(&self) -> bool {
        self.procs.is_some()
    }

    /// `bytes` of memory peers can address (ranks as processes: from this
    /// rank's shared heap; as threads: any memory is, so this is the
    /// caller's job and the call fails).
    pub fn alloc_shared(&self, bytes: usize) -> Result<*mut u8, HostError> {
        match &self.procs {
            Some(p) => p.alloc(bytes).map(|a| a as *mut u8),
            None => Err(HostError::Shm(
                "ranks are threads or talk over the network: allocate ordinary memory".into(),
            )),
        }
    }

    /// Frees memory from [`HostFabric::alloc_shared`].
    pub fn free_shared(&self, ptr: *mut u8) {
        if let Some(p) = &self.procs {
            p.free(ptr as usize);
        }
    }

    /// Most channels a plan may have on this fabric (over the network: the
    /// channels connected at setup).
    pub fn max_channels(&self) -> usize {
        if let Some(n) = &self.net {
            n.channels
        } else if self.procs.is_some() {
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
    pub(crate) fn dead_peer_error(&self, at: BlockedAt) -> Option<HostError> {
        let BlockedAt {
            me,
            peer,
            channel,
            step,
        } = at;
        if let Some(n) = &self.net {
            // Only the peer waited on: a peer that finished and exited
            // closes its connections too, which is no failure until
            // someone waits on it (as with the shared-memory watcher).
            // The rank named is the one that died, where `peer` failed
            // because of it (a forwarded reason): the survivors name it.
            let (peer, detail) = n.lost(peer)?;
            let err = HostError::NetLost {
                rank: me,
                peer,
                channel,
                step,
                detail,
            };
            tracing::error!(%err, "oxccl host: a network peer is lost");
            self.fail(err.to_string());
            return Some(err);
        }
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
        match (&self.procs, &self.net) {
            (Some(p), _) => p.park(seen, timeout),
            (None, Some(n)) => n.park(|| parker.park_timeout(timeout)),
            (None, None) => parker.park_timeout(timeout),
        }
    }

    /// Idle rounds a rank spins before it parks: [`HostConfig::spin`], but
    /// none over the network, where a message takes far longer than a
    /// park and the transport wakes the rank at every completion; there each
    /// yield of a spinning rank is a context switch taken from the socket
    /// threads it waits for (on 2 cores, half of all switches).
    pub(crate) fn spin(&self) -> u32 {
        if self.net.is_some() {
            0
        } else {
            self.cfg.spin
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

    /// Programs `rank` has compiled so far (calls that could not reuse
    /// its last one).
    #[cfg(test)]
    pub(crate) fn programs_compiled(&self, rank: Rank) -> u64 {
        self.ranks[rank as usize].state.lock().programs.compiles()
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
        // SAFETY: the caller keeps this function's contract, the same.
        unsafe { self.execute_observed(plan, bufs, dtype, op, None, None) }
    }

    /// As [`HostFabric::execute`], appending a record of every step run
    /// to `trace` when given (the step trace, `OXCCL_TRACE`), and reporting
    /// the proxy's work on this call's network links to `proxy` when given
    /// (NCCL's proxy operation and step events; see
    /// [`crate::ProxyEvents`]). Without a network there is nothing to
    /// report.
    ///
    /// # Safety
    /// As [`HostFabric::execute`].
    pub unsafe fn execute_observed(
        &self,
        plan: &RankPlan,
        bufs: &[HostBuf],
        dtype: DataType,
        op: &LoweredOp,
        trace: Option<&mut Vec<oxccl_core::trace::StepRecord>>,
        proxy: Option<&Arc<dyn crate::ProxyEvents>>,
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
        if let Some(mine) = self.process_rank().filter(|&p| p != me) {
            return Err(HostError::InvalidPlan(format!(
                "rank {me} is not this process's rank {mine}"
            )));
        }
        let _shared_active = self.procs.as_ref().map(|p| SharedActive::enter(p.rank(me)));
        let mut state = slot.state.try_lock().ok_or_else(|| {
            HostError::InvalidPlan(format!("rank {me} is already executing on this fabric"))
        })?;
        let state = &mut *state;
        let prog = state
            .programs
            .get(self, plan, bufs, dtype.size(), &mut state.scratch)?;
        if self.net.is_some() {
            // Before any step runs: the proxy may land this call's
            // messages as soon as they arrive.
            for l in landings(prog, dtype.size(), |k| prog.links[k].lands()) {
                let link = &prog.links[l.link];
                link.expect_landing(link.counters()[1] + l.nth, l.addr, l.bytes);
            }
        }
        // Observed: the proxy's operations open before any step runs and
        // close once the call is over (`Windows` drops on every return).
        let _windows = match (proxy, &self.net) {
            (Some(ev), Some(net)) => {
                net.open_windows(ev, &messages_per_link(prog));
                Some(Windows(net))
            }
            _ => None,
        };
        let call = slot.joined.fetch_add(1, Ordering::AcqRel) + 1;
        let synced = if synchronizes(plan) {
            let synced = slot.synced.fetch_add(1, Ordering::AcqRel) + 1;
            if let Some(p) = &self.procs {
                p.publish(synced, &prog.bufs, dtype.size());
            } else {
                // In place: the list's memory is reused from call to call.
                let mut publication = slot.published.lock();
                publication.call = synced;
                publication.bufs.clear();
                publication.bufs.extend_from_slice(&prog.bufs);
            }
            synced
        } else {
            0
        };
        if let Some(p) = &self.procs {
            p.rank(me).joined.store(call, Ordering::Release);
        }
        let calls = Calls { call, synced };
        let mut res =
            with_dtype!(dtype, T => run::<T>(self, me, calls, prog, op, &state.parker, trace));
        if res.is_ok() && self.net.is_some() {
            res = self.flush(me, &state.parker).and(res);
        }
        if let Err(e) = &res {
            // Over the network, the proxy may still be sending from this
            // call's buffers (messages by reference): failing the fabric
            // closes every connection, joining the threads that read them,
            // before the caller gets its buffers back. (Every error of a
            // run already failed it; this waits for the close to finish.)
            if self.net.is_some() {
                self.fail(e.to_string());
            }
            drop(active);
            drop(_shared_active);
            self.quiesce();
        }
        res
    }

    /// Ranks over the network: waits until every message this rank
    /// published has left (its proxy sent it), so a process may exit once
    /// its call returns. Bounded by the deadline; a lost peer fails it.
    fn flush(&self, me: Rank, parker: &Parker) -> Result<(), HostError> {
        let start = Instant::now();
        loop {
            let seen = self.arm();
            let pending = self
                .links
                .read()
                .iter()
                .find(|((_, from, to), l)| {
                    *from == me && *to != me && {
                        let [tail, head, ..] = l.counters();
                        tail != head
                    }
                })
                .map(|(&(c, _, to), l)| (c, to, l.counters()[1]));
            let Some((channel, peer, head)) = pending else {
                return Ok(());
            };
            if let Some(e) = self.stop_error(me) {
                return Err(e);
            }
            let at = BlockedAt {
                me,
                peer,
                channel,
                step: head as usize,
            };
            if let Some(e) = self.dead_peer_error(at) {
                return Err(e);
            }
            let waited = start.elapsed();
            if waited >= self.deadline() {
                let err = HostError::Deadline(WaitFault {
                    cause: FaultCause::Deadline,
                    rank: me,
                    peer,
                    channel: channel as u32,
                    step: head as u32,
                    awaited: Awaited::Slot,
                    waited,
                    absent: Vec::new(),
                });
                self.fail(err.to_string());
                return Err(err);
            }
            self.park(parker, seen, Duration::from_millis(50));
        }
    }

    /// Fails every rank's pending and future call promptly with
    /// [`HostError::Aborted`], which tells `why` (who aborted, and for
    /// what). The fabric stays unusable.
    pub fn abort(&self, why: &str) {
        // The first abort's reason is the flag: a flag set before its
        // reason let a woken peer report "aborted ()".
        let _ = self.aborted.set(why.to_string());
        self.fail(why.to_string());
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
                let l = Arc::new(match &self.procs {
                    Some(p) => p
                        .link(channel, from, to)
                        .expect("compile checked the channel count"),
                    None => Link::new(self.cfg.slots, self.cfg.slot_bytes),
                });
                if let Some(n) = &self.net {
                    n.attach(&l, channel, from, to);
                } else if self.procs.is_some() {
                    tracing::info!("oxccl-host: Channel {channel:02} : {from} -> {to} via SHM");
                }
                l
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
        match (&self.procs, &self.net) {
            (Some(p), _) => p.wake(rank),
            // A remote peer's FIFO end is this process's proxy.
            (None, Some(n)) if rank != n.me => n.kick(),
            _ => self.ranks[rank as usize].unparker.unpark(),
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
        // Over the network, peers learn of it when their connections to
        // this rank close.
        if let Some(n) = &self.net {
            n.shutdown(Some(&self.reason.lock().clone().unwrap_or_default()));
        }
    }

    /// The error rank `me` returns if the fabric is failed.
    pub(crate) fn stop_error(&self, me: Rank) -> Option<HostError> {
        if let Some(why) = self.aborted.get() {
            // The first failure's reason where one came before the abort.
            let why = self.reason.lock().clone().unwrap_or_else(|| why.clone());
            return Some(HostError::Aborted { rank: me, why });
        }
        self.failure()
    }

    /// Whether the fabric is failed (one Acquire load: checked every round).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire) || self.procs.as_ref().is_some_and(Procs::is_broken)
    }

    /// Ranks that have not started call number `call`.
    pub(crate) fn absent(&self, call: u64) -> Vec<Rank> {
        if self.net.is_some() {
            // Peers' call counters are in their processes, out of sight.
            return Vec::new();
        }
        (0..self.nranks)
            .filter(|&r| match &self.procs {
                Some(p) => p.rank(r).joined.load(Ordering::Acquire) < call,
                None => self.ranks[r as usize].joined.load(Ordering::Acquire) < call,
            })
            .collect()
    }

    /// The shared part of a fabric whose ranks are processes (tests).
    #[cfg(test)]
    pub(crate) fn procs(&self) -> Option<&Procs> {
        self.procs.as_ref()
    }

    /// Address of `peer`'s elements that `a` names, or why not.
    pub(crate) fn remote(&self, peer: Rank, a: &RemoteAccess) -> Result<usize, RemoteFault> {
        if let Some(procs) = &self.procs {
            return procs.remote(peer, a);
        }
        if self.net.is_some() {
            return Err(RemoteFault::Plan(
                "a direct step reads or writes a peer's memory, which ranks talking over the network cannot: run FIFO plans".into(),
            ));
        }
        let p = self.ranks[peer as usize].published.lock();
        a.resolve(p.call, || {
            p.bufs
                .get(a.buf)
                .copied()
                .ok_or_else(|| RemoteFault::Plan(a.out_of_range()))
        })
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

/// Closes an observed call's proxy operations when dropped.
struct Windows<'a>(&'a NetPart);

impl Drop for Windows<'_> {
    fn drop(&mut self) {
        self.0.close_windows();
    }
}

/// Each link of `prog` with the count of messages the program moves on
/// it (one per step that receives from it or sends on it).
fn messages_per_link(prog: &crate::compile::Program) -> Vec<(Arc<Link>, u64)> {
    use crate::compile::{ODst, OSrc, Op};
    let mut n = vec![0u64; prog.links.len()];
    for op in prog.channels.iter().flatten() {
        let Op::Xfer(x) = op else { continue };
        for s in &x.srcs {
            if let OSrc::Recv { link, .. } = *s {
                n[link] += 1;
            }
        }
        for d in &x.dsts {
            if let ODst::Send { link, .. } = *d {
                n[link] += 1;
            }
        }
    }
    prog.links.iter().cloned().zip(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank polling for the stop reads the abort's reason whenever it
    /// sees the abort (it once read an empty one between the flag and
    /// the reason: "the communicator was aborted ()"; now the reason is
    /// the flag, and this checks it under racing threads).
    #[test]
    fn an_abort_is_never_seen_without_its_reason() {
        for _ in 0..300 {
            let fab = HostFabric::new(2, HostConfig::default());
            let seen = std::thread::scope(|s| {
                let watcher = s.spawn(|| loop {
                    if let Some(e) = fab.stop_error(1) {
                        return e.to_string();
                    }
                    std::hint::spin_loop();
                });
                fab.abort("rank 0 gave up");
                watcher.join().unwrap()
            });
            assert!(seen.contains("rank 0 gave up"), "{seen}");
        }
    }
}
