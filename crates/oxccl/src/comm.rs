//! The communicator: one rank's handle on a clique, and every collective.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use oxccl_core::gen;
use oxccl_core::plan::{BufRole, RankPlan};
use oxccl_core::{Algo, CollKind, Collective, CoreError, DataType, Element, RedOp};
use oxccl_topo::consts::is_direct;

use crate::backend::{self, Backend, BackendKind, Launch, RawBuf};
use crate::buffer::{Buffer, In, Out};
use crate::check::{Board, Call, CallSeq};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::plans::{PlanCache, PlanEntry, PlanKey};
use crate::recent::{CallShape, Recent, Resolved};
use crate::select::{self, Choice, Chooser, Transport};
use crate::sink::Sinks;
use crate::validate::{self, Checked, Owner};
use crate::watchdog::{Launched, Watched};

/// What a split round hands each rank: its communicator (or none).
pub(crate) type Outcome = std::result::Result<Vec<Option<Communicator>>, String>;

/// One split round of a thread clique (`split_threads` runs it).
#[derive(Debug, Default)]
pub(crate) struct Round {
    /// `(color or -1, key)` by rank, for the round being gathered.
    pub entries: Vec<Option<(i64, i32)>>,
    /// The finished round, until every rank has taken its part.
    pub done: Option<Outcome>,
    /// Ranks that still have to take their part of `done`.
    pub left: u32,
    /// Ranks of the round being gathered that gave up waiting (not the
    /// ones to blame for the wait).
    pub quit: Vec<bool>,
    /// Ranks the round being gathered waits for (set by its first rank).
    pub expected: Vec<bool>,
}

/// A thread clique's split rendezvous (defined with the clique that
/// holds it; `split_threads` runs it).
#[derive(Debug, Default)]
pub(crate) struct SplitBoard {
    pub round: parking_lot::Mutex<Round>,
    pub cv: parking_lot::Condvar,
}

/// What the communicators of one `init_all` share.
#[derive(Debug)]
pub(crate) struct Clique {
    pub id: u64,
    pub nranks: u32,
    pub backend: Arc<dyn Backend>,
    pub config: Config,
    pub chooser: Chooser,
    pub plans: PlanCache,
    /// Every rank's call fingerprints (see [`crate::check`]).
    pub board: Board,
    /// Ranks in several processes: how they reach each other (`split`).
    pub boot: Option<Arc<oxccl_bootstrap::Bootstrap>>,
    /// Ranks as threads: where `split` meets.
    pub split: SplitBoard,
    /// The step trace, when `OXCCL_TRACE` asks for one.
    pub trace: Option<crate::observe::Tracer>,
    /// Warns of enqueued calls that do not complete (`watchdog.rs`).
    pub watchdog: crate::watchdog::Watchdog,
    /// The first rank of this process whose call failed after the ranks
    /// agreed on it (see [`Communicator::fail_agreed`]): the rank its
    /// peers' failed waits blame.
    pub blame: parking_lot::Mutex<Option<Blame>>,
}

/// The step trace is written before the backend goes (fields drop after
/// this, in order): device stamps live in the backend's memory.
impl Drop for Clique {
    fn drop(&mut self) {
        if let Some(t) = &self.trace {
            t.finish();
        }
    }
}

static NEXT_CLIQUE: AtomicU64 = AtomicU64::new(1);

/// One rank of a set of ranks that run collectives together. Each rank's
/// thread calls the collectives on its own communicator, as with NCCL.
#[derive(Debug)]
pub struct Communicator {
    rank: u32,
    clique: Arc<Clique>,
    destroyed: AtomicBool,
    /// This rank's recent call shapes and its last choice (for reports);
    /// only this rank's thread takes the lock while calling.
    recent: parking_lot::Mutex<Recent>,
    /// This rank's collective sequence, locked for the whole of a call:
    /// calls from several threads on one communicator run one at a time.
    call: parking_lot::Mutex<CallSeq>,
    /// Memory bound where this rank ignores a buffer the caller passed
    /// unusable (see `sink.rs`).
    sinks: parking_lot::Mutex<Sinks>,
    /// Ranges of external memory this rank registered (`register.rs`).
    pub(crate) regs: parking_lot::RwLock<crate::registry::Registry>,
    /// This rank's context in the profiler plugin, if one is attached.
    pub(crate) prof: Option<std::sync::Arc<crate::observe::profiler::Ctx>>,
    /// This rank's launches, as the clique's watchdog reads them.
    watch: Arc<crate::watchdog::Watch>,
}

/// A dropped communicator, like a destroyed one, tells its peers (the
/// call check's board: threads, processes of one host, or over the
/// network) that it will publish no more calls: a peer waiting for it
/// fails at once naming it, instead of at its deadline.
impl Drop for Communicator {
    fn drop(&mut self) {
        self.watch.close();
        self.clique.board.leave(self.rank);
    }
}

/// Creates `n` communicators, ranks `0..n` of one clique in this process,
/// configured from the environment (see [`crate::config`]).
pub fn init_all(n: u32) -> Result<Vec<Communicator>> {
    init_all_with(n, Config::from_env()?)
}

/// Creates `n` communicators with an explicit configuration (the
/// environment is not read).
pub fn init_all_with(n: u32, config: Config) -> Result<Vec<Communicator>> {
    let _nvtx = crate::observe::range(crate::observe::Func::CommInitAll, || crate::observe::Args {
        nranks: n,
        ..Default::default()
    });
    if n == 0 {
        return Err(Error::InvalidUsage(
            "init_all needs at least one rank".into(),
        ));
    }
    crate::debug::init(config.debug, config.debug_subsys);
    let opts = config.backend_options(n);
    let backend = match config.backend {
        BackendKind::Host => backend::host::create(&opts)?,
        BackendKind::Cuda => backend::cuda::create(&opts)?,
        BackendKind::Auto if backend::cuda::available() => backend::cuda::create(&opts)?,
        BackendKind::Auto => backend::host::create(&opts)?,
    };
    init_all_on(n, backend, config)
}

/// As [`init_all_with`], rank `r` on CUDA device `devices[r]` (NCCL's
/// `ncclCommInitAll` device list; a device may repeat: several ranks on
/// one GPU). A device the process does not see is refused, naming the
/// rank. The host backend (and `Auto` without a GPU) ignores the devices.
pub fn init_all_on_devices(devices: &[i32], config: Config) -> Result<Vec<Communicator>> {
    let _nvtx = crate::observe::range(crate::observe::Func::CommInitAll, Default::default);
    let n = u32::try_from(devices.len())
        .map_err(|_| Error::InvalidUsage(format!("{} devices", devices.len())))?;
    let cuda = match config.backend {
        BackendKind::Cuda => true,
        BackendKind::Auto => backend::cuda::available(),
        BackendKind::Host => false,
    };
    if !cuda || n == 0 {
        return init_all_with(n, config);
    }
    crate::debug::init(config.debug, config.debug_subsys);
    let visible = oxccl_cuda::available()
        .map_err(|e| Error::BackendUnavailable(e.to_string()))?
        .devices
        .len() as i32;
    let asks: Vec<backend::placement::Ask<'_>> = devices
        .iter()
        .map(|&d| backend::placement::Ask {
            host: "",
            device: Some(d),
        })
        .collect();
    let places = backend::placement::place(&asks, visible)?;
    let opts = config.backend_options(n);
    let backend = backend::cuda::create_on(&opts, places.iter().map(|p| p.device).collect())?;
    init_all_on(n, backend, config)
}

/// Creates `n` communicators on a backend the caller made (an
/// implementation of [`Backend`] for `n` ranks; `config.backend` is not
/// consulted). For backends outside this crate and for measuring the
/// facade alone on a backend that does nothing.
pub fn init_all_on(n: u32, backend: Arc<dyn Backend>, config: Config) -> Result<Vec<Communicator>> {
    let _nvtx = crate::observe::range(crate::observe::Func::CommInitAll, || crate::observe::Args {
        nranks: n,
        ..Default::default()
    });
    if n == 0 {
        return Err(Error::InvalidUsage(
            "init_all needs at least one rank".into(),
        ));
    }
    let clique = Clique::new(n, backend, config, None)?;
    Ok((0..n)
        .map(|rank| Communicator::in_clique(rank, clique.clone()))
        .collect())
}

/// A PreMulSum op's scalar as the call check carries it (0 otherwise).
pub(crate) fn scalar_bits(op: RedOp) -> u64 {
    match op {
        RedOp::PreMulSum(s) => s.to_bits(),
        _ => 0,
    }
}

/// What the watchdog of enqueued calls reads of its clique.
impl Watched for Clique {
    fn watchdog(&self) -> &crate::watchdog::Watchdog {
        &self.watchdog
    }
    fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }
    fn nranks(&self) -> u32 {
        self.nranks
    }
    fn tool_id(&self) -> u64 {
        Clique::tool_id(self)
    }
    fn wait_warn(&self) -> crate::config::branches::WaitWarn {
        self.config.wait_warn
    }
    fn published(&self, rank: u32) -> Option<u64> {
        (self.nranks > 1 && self.config.check_calls).then(|| self.board.published(rank))
    }
}

impl Clique {
    /// The communicator's identity for tools: the bootstrap's magic where
    /// ranks are processes (equal in every process), else the clique's
    /// number.
    pub(crate) fn tool_id(&self) -> u64 {
        self.boot.as_ref().map_or(self.id, |b| b.magic())
    }

    /// A clique of `n` ranks on `backend` (`boot`: when ranks are processes).
    pub(crate) fn new(
        n: u32,
        backend: Arc<dyn Backend>,
        config: Config,
        boot: Option<Arc<oxccl_bootstrap::Bootstrap>>,
    ) -> Result<Arc<Clique>> {
        crate::debug::init(config.debug, config.debug_subsys);
        // First, so that ranks failing later below fail alike, after it.
        let board = match &boot {
            Some(b) if config.check_calls && n > 1 && config.check_calls_across_hosts => {
                Board::mirrored(b)?
            }
            Some(b) if config.check_calls && n > 1 => Board::shared(b)?,
            _ => Board::new(n),
        };
        tracing::info!(target: "oxccl::init", nranks = n, backend = %backend.describe(), "oxccl: communicators created");
        check_algorithms(&config)?;
        let chooser = Chooser::new(&config, backend.as_ref(), n)?;
        let rings = chooser.rings();
        log_rings(&rings);
        let plans = PlanCache::new(rings, chooser.hosts()).with_push_group(config.push_group);
        let trace = config
            .trace
            .as_ref()
            .map(|t| crate::observe::Tracer::new(t, n, boot.as_ref().map(|b| b.rank())));
        Ok(Arc::new(Clique {
            trace,
            id: NEXT_CLIQUE.fetch_add(1, Ordering::Relaxed),
            nranks: n,
            backend,
            config,
            chooser,
            plans,
            board,
            boot,
            split: Default::default(),
            watchdog: Default::default(),
            blame: Default::default(),
        }))
    }
}

/// A checked collective of `dtype` and the choice it runs with, as the
/// profiler plugin hears of it.
pub(crate) fn profiler_part(
    c: &Checked,
    dtype: DataType,
    choice: &Choice,
) -> crate::observe::profiler::Part {
    crate::observe::profiler::Part::Coll {
        kind: c.coll.kind,
        count: c.coll.count,
        root: c.coll.root,
        dtype,
        send: c.send.addr,
        recv: c.recv.addr,
        algo: choice.algo,
        proto: choice.proto,
        channels: choice.channels,
    }
}

/// The channels' rings at init: under INIT one line per distinct order
/// (its first channel, and how many channels share it), every channel's
/// under GRAPH, as NCCL logs them.
fn log_rings(rings: &[Vec<u32>]) {
    let order = |r: &Vec<u32>| r.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    let mut distinct: Vec<(usize, &Vec<u32>, usize)> = Vec::new();
    for (c, ring) in rings.iter().enumerate() {
        match distinct.iter_mut().find(|(_, r, _)| *r == ring) {
            Some((_, _, n)) => *n += 1,
            None => distinct.push((c, ring, 1)),
        }
        tracing::info!(target: "oxccl::graph", "oxccl: Ring {c:02} : {}", order(ring));
    }
    for (c, ring, n) in distinct {
        tracing::info!(
            target: "oxccl::init",
            "oxccl: Ring {c:02} : {} ({n} of {} channels in this order)",
            order(ring),
            rings.len()
        );
    }
}

/// Refuses, at init, a per-collective algorithm rule (`allgather:tree`)
/// that leaves its collective without any algorithm that has a generator
/// (as a protocol filter that leaves none is refused), rather than at
/// that collective's first call. A plain list (`NCCL_ALGO=chain`) is
/// meant for the collectives it serves: the others report
/// [`Error::NoAlgorithm`] when called (on every rank alike).
fn check_algorithms(config: &Config) -> Result<()> {
    for (kind, rule) in &config.algo.per_coll {
        if *kind != CollKind::SendRecv && select::allowed_algos(config, *kind).is_empty() {
            let names: Vec<&str> = rule.names.iter().map(|a| a.name()).collect();
            let not = if rule.exclude { "all but " } else { "" };
            // With deterministic reductions the switch may be what left
            // nothing: say what it admits.
            let allowed = if config.deterministic {
                select::describe_filter(config, *kind)
            } else {
                format!("{not}{}", names.join(","))
            };
            return Err(Error::NoAlgorithm {
                coll: *kind,
                allowed,
            });
        }
    }
    Ok(())
}

/// Bytes per FIFO message: the configured chunk, never above the backend's
/// slot (a larger message could not be sent).
pub(crate) fn fifo_bytes(config: &Config, slot: usize) -> usize {
    config.chunk_bytes.map_or(slot, |c| c.min(slot))
}

/// Piece size in elements for a plan of `algo`: registered direct plans
/// (one-shot, two-shot, all-pairs on registered buffers) move no FIFO
/// message, and each piece costs synchronisation steps, so their pieces
/// are [`DIRECT_PIECE_BYTES`] (unless the configuration sets a chunk);
/// everything else is bounded by the FIFO message (`fifo_chunk`).
fn piece_elems(
    algo: Algo,
    registered: bool,
    fifo_chunk: usize,
    elem_size: usize,
    config: &Config,
) -> usize {
    if registered && is_direct(algo) && config.chunk_bytes.is_none() {
        (DIRECT_PIECE_BYTES / elem_size).max(fifo_chunk)
    } else {
        fifo_chunk
    }
}

/// Bytes per piece of registered direct plans: 4 MiB keeps a 256 MiB call
/// at 4 pieces per channel on 16 channels. In-place AllToAll's swap caps
/// its own pieces lower (`SWAP_PIECE` in `oxccl-core`'s generator) so its
/// one piece of scratch per channel stays in the GPU's L2.
pub(crate) const DIRECT_PIECE_BYTES: usize = 4 << 20;

/// Plan buffers bound on the stack per call (a collective's plan has at
/// most input, output and scratch).
const INLINE_BUFS: usize = 4;

/// The call's memory for a plan buffer of `role` (scratch is the backend's).
fn bound(role: BufRole, send: RawBuf, recv: RawBuf) -> RawBuf {
    match role {
        BufRole::Input => send,
        BufRole::Output => recv,
        BufRole::Scratch => RawBuf::NULL,
    }
}

/// Every buffer of `rp` bound to the call's memory.
fn bind_all(rp: &RankPlan, send: RawBuf, recv: RawBuf) -> Vec<RawBuf> {
    rp.bufs.iter().map(|b| bound(b.role, send, recv)).collect()
}

/// One rank's share of an operation, ready for the backend.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub plan: PlanRef,
    pub bufs: Vec<RawBuf>,
}

/// How one rank plan runs: element type, op, wire protocol, and whether
/// only the ranks its Send/Recv name launch it ([`Launch::p2p_only`]).
#[derive(Clone, Copy, Debug)]
struct RunAs {
    /// What runs, as the step trace names it.
    name: &'static str,
    dtype: DataType,
    op: RedOp,
    proto: oxccl_core::Proto,
    p2p_only: bool,
    /// A single collective's fingerprint (`None`: a group's launch).
    call: Option<Call>,
}

/// The rank plan of a [`Prepared`]: a rank of a cached plan (nothing
/// copied per call) or one made for this call (groups).
#[derive(Debug)]
pub(crate) enum PlanRef {
    Cached { entry: Arc<PlanEntry>, rank: usize },
    Own(RankPlan),
}

impl PlanRef {
    pub fn rank_plan(&self) -> &RankPlan {
        match self {
            PlanRef::Cached { entry, rank } => &entry.plan.ranks[*rank],
            PlanRef::Own(rp) => rp,
        }
    }

    /// An owned copy (groups merge parts into one plan).
    pub fn into_owned(self) -> RankPlan {
        match self {
            PlanRef::Cached { entry, rank } => entry.plan.ranks[rank].clone(),
            PlanRef::Own(rp) => rp,
        }
    }
}

impl Communicator {
    /// Rank `rank`'s handle on `clique`.
    pub(crate) fn in_clique(rank: u32, clique: Arc<Clique>) -> Communicator {
        Communicator {
            rank,
            prof: crate::observe::profiler_ctx(clique.tool_id(), clique.nranks, rank)
                .map(std::sync::Arc::new),
            sinks: parking_lot::Mutex::new(Sinks::new(clique.backend.clone(), rank)),
            watch: clique.watchdog.watch(rank),
            clique,
            destroyed: AtomicBool::new(false),
            recent: parking_lot::Mutex::default(),
            call: parking_lot::Mutex::default(),
            regs: parking_lot::RwLock::default(),
        }
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// This communicator as tools (NVTX, profiler plugins) name it:
    /// identity, rank and rank count, no call yet.
    pub fn tool_args(&self) -> crate::observe::Args {
        crate::observe::Args {
            comm: self.clique.tool_id(),
            rank: self.rank,
            nranks: self.clique.nranks,
            ..Default::default()
        }
    }

    /// The NVTX range of a checked collective call on this rank (shared
    /// by single calls and groups' operations).
    pub(crate) fn coll_range(
        &self,
        checked: &crate::validate::Checked,
        dtype: oxccl_core::DataType,
        op: RedOp,
    ) -> crate::observe::Range {
        let c = &checked.coll;
        crate::observe::range(crate::observe::Func::Coll(c.kind), || {
            crate::observe::Args::coll(self.tool_args(), c.kind, c.count, dtype, op, c.root)
        })
    }

    pub fn nranks(&self) -> u32 {
        self.clique.nranks
    }

    /// The CUDA device ordinal this rank runs on (NCCL's
    /// `ncclCommCuDevice`); `None` on the host backend.
    pub fn cuda_device(&self) -> Option<i32> {
        self.clique.backend.device_of(self.rank)
    }

    /// Device memory, in bytes, that this communicator's clique holds now
    /// (the ranks of one process share a clique and its memory: links,
    /// scratch, pools and `alloc` buffers); 0 on the host backend. What
    /// NCCL's `ncclCommMemStats` reports.
    pub fn device_memory_bytes(&self) -> u64 {
        self.clique.backend.device_bytes()
    }

    /// The backend this communicator runs on (`Host` or `Cuda`).
    pub fn backend(&self) -> BackendKind {
        self.clique.backend.kind()
    }

    /// A description of the backend (for logs and reports).
    pub fn describe_backend(&self) -> String {
        self.clique.backend.describe()
    }

    pub fn config(&self) -> &Config {
        &self.clique.config
    }

    pub(crate) fn clique(&self) -> &Arc<Clique> {
        &self.clique
    }

    /// This rank's call sequence, locked for the length of a call.
    pub(crate) fn call_lock(&self) -> parking_lot::MutexGuard<'_, CallSeq> {
        self.call.lock()
    }

    pub(crate) fn owner(&self) -> Owner {
        Owner {
            clique: self.clique.id,
            rank: self.rank,
            nranks: self.clique.nranks,
            backend: self.clique.backend.kind(),
        }
    }

    /// Errors if the communicator was destroyed or its clique failed.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.check_not_destroyed()?;
        if let Some(e) = self.clique.backend.failure() {
            // A peer's failure after agreement stays that peer's fault for
            // every later call, not an anonymous "failed earlier".
            let failed = Error::Failed {
                rank: self.rank,
                cause: e.root_cause(),
            };
            return Err(self.clique.blamed(self.rank, failed));
        }
        Ok(())
    }

    /// Whether the handle is still live (a failed clique may still be
    /// shrunk: `shrink` checks only this).
    pub(crate) fn check_not_destroyed(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Err(Error::Destroyed { rank: self.rank });
        }
        Ok(())
    }

    /// Allocates `len` zeroed elements of this rank's memory (host memory
    /// on the host backend, registered device memory on CUDA).
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T>> {
        self.check_usable()?;
        Buffer::new(self.clique.backend.clone(), self.clique.id, self.rank, len)
    }

    /// Waits until every operation issued on this rank has completed
    /// (a no-op on the host backend, where calls complete on return).
    pub fn synchronize(&self) -> Result<()> {
        self.check_usable()?;
        self.clique
            .backend
            .synchronize(self.rank)
            .map_err(|e| self.blamed(e))
    }

    /// Marks the communicator unusable: later calls return
    /// [`Error::Destroyed`]. Buffers stay valid until dropped.
    pub fn destroy(&self) {
        let _nvtx = crate::observe::range(crate::observe::Func::CommDestroy, || self.tool_args());
        self.destroyed.store(true, Ordering::Release);
        self.watch.close();
        self.clique.board.leave(self.rank);
    }

    /// Aborts the whole clique: every rank's pending and later operations
    /// fail promptly ([`Error::Aborted`], then [`Error::Failed`]).
    pub fn abort(&self) {
        let _nvtx = crate::observe::range(crate::observe::Func::CommAbort, || self.tool_args());
        let why = format!("rank {} aborted the communicator", self.rank);
        self.clique.backend.abort(&why);
        self.clique.board.abort(self.rank);
    }

    /// The clique's failure, if it failed (NCCL's `ncclCommGetAsyncError`):
    /// [`Error::PeerFailed`] naming the rank of this process whose call
    /// failed after its peers agreed on it, where one did; else, once a
    /// call of this process found a peer lost before any data moved (its
    /// process exited, it aborted, or its communicator is gone: the
    /// communicators are unusable), that call's [`Error::Aborted`].
    pub fn async_error(&self) -> Option<Error> {
        self.clique
            .backend
            .failure()
            .map(|e| self.blamed(e))
            .or_else(|| self.clique.board.peer_lost())
    }

    /// How this process's ranks of the clique ran their calls on the
    /// device so far: executor kernels launched and calls run as
    /// copy-engine copies with no kernel (`None` on the host backend).
    /// A diagnostic: it shows whether the copy-engine algorithm really
    /// kept its calls off the SMs.
    pub fn launch_counts(&self) -> Option<backend::LaunchCounts> {
        self.clique.backend.launch_counts()
    }

    /// Algorithm, protocol and channels of the last collective this rank ran.
    pub fn last_choice(&self) -> Option<Choice> {
        self.recent.lock().last_choice
    }

    /// What a collective of `kind` on `count` elements of `dtype` (the
    /// count a call would pass, see [`oxccl_core::Collective`]) on buffers
    /// from [`Communicator::alloc`] would choose: the selector's pick under
    /// this communicator's configuration. Nothing runs; every rank gets the
    /// same answer.
    pub fn choice_for(&self, kind: CollKind, count: usize, dtype: DataType) -> Result<Choice> {
        let coll = Collective::new(kind, count, 0);
        let cl = &self.clique;
        let bytes = coll.bytes(cl.nranks, dtype.size());
        cl.chooser
            .choose(&cl.config, kind, bytes, cl.backend.registered_alloc())
    }

    /// Most channels a plan of this communicator runs on. On a GPU every
    /// rank's blocks spin on each other and must all be resident, so this
    /// is the device's SMs over the ranks sharing it: its own ranks, or,
    /// for a communicator split or shrunk from another, the parent's
    /// ranks there (its siblings run beside it), whichever is more.
    pub fn max_channels(&self) -> u32 {
        self.clique.chooser.max_channels()
    }

    /// Number of distinct plans generated so far by this clique.
    pub fn cached_plans(&self) -> usize {
        self.clique.plans.len()
    }

    /// A backend timer ordered with this rank's work (for benchmarks).
    pub fn timer(&self) -> Result<Box<dyn backend::Timer>> {
        self.clique.backend.timer(self.rank)
    }

    /// Ranks of this clique whose buffers live in the busiest memory (all
    /// of them when every rank shares one GPU or the host).
    pub fn ranks_on_busiest_memory(&self) -> u32 {
        self.clique
            .backend
            .busiest_memory_ranks()
            .unwrap_or(self.clique.nranks)
    }

    /// The backend's copy-bandwidth ceiling in GB/s, measured on `bytes`.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        self.clique.backend.copy_bandwidth(bytes)
    }

    /// Ranks over the network: one plain TCP stream's throughput in GB/s
    /// on this rank's interface, measured on `bytes` (the transport's
    /// ceiling per connection); `None` when the ranks do not talk over the
    /// network.
    pub fn stream_bandwidth(&self, bytes: usize) -> Option<Result<f64>> {
        self.clique.backend.stream_bandwidth(bytes)
    }

    /// Over the network: GB/s of each of two such streams at once (both
    /// directions of an exchange sharing this host's cores); `None` when
    /// the ranks do not talk over the network or the backend does not
    /// measure it (staged CUDA ranks).
    pub fn duplex_bandwidth(&self, bytes: usize) -> Option<Result<f64>> {
        self.clique.backend.duplex_bandwidth(bytes)
    }

    /// Any collective, by kind: the generic entry point the typed methods,
    /// the sweep and the tests share. Counts come from the buffers (see
    /// [`oxccl_core::Collective`] for each collective's layout); `op` is
    /// ignored by non-reductions and `root` by rootless collectives.
    pub fn collective<'a, T: Element>(
        &self,
        kind: CollKind,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        op: RedOp,
        root: u32,
    ) -> Result<()> {
        let _span = tracing::debug_span!("oxccl.collective", rank = self.rank, %kind).entered();
        let (checked, op) = self
            .check_collective(kind, send.into(), recv.into(), op, root)
            .map_err(|e| self.refuse_call(e))?;
        let _nvtx = self.coll_range(&checked, T::DTYPE, op);
        self.run_checked(checked, T::DTYPE, op)
    }

    /// One rank in place: the output is the input, which every op but
    /// PreMulSum leaves as it is (the sum, product, extreme or average of
    /// one value is that value), so no plan runs. A plan would copy the
    /// buffer onto itself (256 MiB took 7.1 ms through PyTorch on an H100,
    /// where NCCL returns at once).
    pub(crate) fn nothing_to_move(&self, checked: &Checked, op: RedOp) -> bool {
        self.nranks() == 1
            && checked.in_place
            && !matches!(op, RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_))
    }

    /// Runs a collective whose arguments passed `check_collective`: the
    /// lone call past its checks (also a group's lone collective, which is
    /// that call: see `Group::end`).
    pub(crate) fn run_checked(
        &self,
        mut checked: Checked,
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        let kind = checked.coll.kind;
        if checked.coll.count == 0 {
            return Ok(());
        }
        let mut seq = self.call.lock();
        if self.checking() {
            let c = &checked.coll;
            let call = Call::coll(c.kind, dtype, c.count, op, c.root);
            let agreed = self.agree(&mut seq, call, checked.backend_memory, scalar_bits(op))?;
            checked.backend_memory = agreed.registered;
        } else if matches!(op, RedOp::PreMulSum(_)) {
            // Unchecked, the ranks' scalars are unknown: FIFO plans scale
            // each input by its owner's (see `check::calls`).
            checked.backend_memory = false;
        }
        let call = Call::coll(kind, dtype, checked.coll.count, op, checked.coll.root);
        if self.nothing_to_move(&checked, op) {
            if tracing::enabled!(target: "oxccl::coll", tracing::Level::INFO) {
                tracing::info!(
                    target: "oxccl::coll",
                    rank = self.rank,
                    in_place = true,
                    "oxccl: {call}: nothing to move (one rank, in place)"
                );
            }
            return Ok(());
        }
        // Past the agreement, the peers are committed to the call: a plan
        // this rank alone cannot make fails the communicator, naming it.
        // No algorithm allowed is every rank's answer alike.
        let r = self.resolve(&checked, dtype.size()).map_err(|e| match e {
            e @ Error::NoAlgorithm { .. } => e,
            e => self.fail_agreed(&call.to_string(), e),
        })?;
        self.log(&checked, dtype, op, &r.choice);
        let rp = r.rank_plan(self.rank);
        // Collective plans have at most input, output and scratch: bind
        // them on the stack; only an unusual plan allocates.
        let mut inline = [RawBuf::NULL; INLINE_BUFS];
        let heap: Vec<RawBuf>;
        let bufs = if rp.bufs.len() <= INLINE_BUFS {
            for (slot, b) in inline.iter_mut().zip(&rp.bufs) {
                *slot = bound(b.role, checked.send, checked.recv);
            }
            &inline[..rp.bufs.len()]
        } else {
            heap = bind_all(rp, checked.send, checked.recv);
            &heap[..]
        };
        let how = RunAs {
            name: kind.name(),
            dtype,
            op,
            proto: r.choice.proto,
            p2p_only: false,
            call: Some(call),
        };
        let _events = self.prof.as_ref().map(|p| {
            let part = profiler_part(&checked, dtype, &r.choice);
            crate::observe::profiler::Launch::start(p, &[part])
        });
        self.run(rp, bufs, r.handle.as_ref(), how)
    }

    /// The plan, choice and backend handle for a checked call: from this
    /// rank's recent calls when it ran the shape before (no shared lock or
    /// reference count), else chosen, generated or looked up, and prepared
    /// on the backend, then remembered.
    fn resolve(&self, c: &Checked, elem_size: usize) -> Result<Arc<Resolved>> {
        let shape = CallShape {
            coll: c.coll,
            elem_size,
            in_place: c.in_place,
            backend_memory: c.backend_memory,
        };
        {
            let mut recent = self.recent.lock();
            if let Some(r) = recent.find(&shape) {
                recent.last_choice = Some(r.choice);
                return Ok(r);
            }
        }
        let (entry, choice) = self.plan_for(c, elem_size)?;
        let handle = entry
            .handle(self.clique.backend.as_ref(), choice.proto)
            .map_err(|e| self.fail("preparing a plan", e))?;
        let r = Arc::new(Resolved {
            shape,
            entry,
            choice,
            handle,
        });
        let mut recent = self.recent.lock();
        recent.last_choice = Some(choice);
        recent.insert(r.clone());
        Ok(r)
    }

    /// Validates a collective call (shared by direct calls and groups);
    /// returns it with the op it runs (Sum for non-reductions).
    pub(crate) fn check_collective<T: Element>(
        &self,
        kind: CollKind,
        send: In<'_, T>,
        recv: Out<'_, T>,
        op: RedOp,
        root: u32,
    ) -> Result<(Checked, RedOp)> {
        if kind == CollKind::SendRecv {
            return Err(Error::InvalidUsage(
                "Send/Recv go through send(), recv() or a group".into(),
            ));
        }
        self.check_usable()?;
        let op = if kind.is_reduction() { op } else { RedOp::Sum };
        if matches!(op, RedOp::PreMulSumDevice(_))
            && !matches!(send.arg.space, crate::buffer::Space::External { .. })
        {
            // The kernel reads the address when the call runs: only the
            // raw entry points' `unsafe` contract keeps it valid that long.
            return Err(Error::InvalidUsage(
                "a PreMulSum scalar in device memory is taken only by the raw entry points \
                 (collective_raw), whose contract keeps it valid until the call completes"
                    .into(),
            ));
        }
        if matches!(op, RedOp::PreMulSumDevice(_)) && !self.clique().backend.reads_device_scalars()
        {
            return Err(Error::InvalidUsage(format!(
                "a PreMulSum scalar in device memory needs a backend whose kernels read it \
                 ({} does not): pass its value (RedOp::PreMulSum)",
                self.clique().backend.describe()
            )));
        }
        let owner = self.owner();
        let mut checked =
            validate::collective(kind, &send.arg, &recv.arg, root, op, T::DTYPE, &owner)?;
        if matches!(op, RedOp::PreMulSumDevice(_)) {
            // No rank knows its peers' scalars before the kernels read
            // them, so none may scale a peer's input with its own (direct
            // plans): FIFO plans scale each input by its owner's.
            checked.backend_memory = false;
        }
        if let Some((role, len)) = checked.sink {
            let raw = self.sinks.lock().get(len * T::DTYPE.size())?;
            match role {
                BufRole::Input => checked.send = raw,
                _ => checked.recv = raw,
            }
        }
        Ok((checked, op))
    }

    /// Chooses and fetches the plan for a checked call, bound to its
    /// buffers (groups, which merge parts into one plan).
    pub(crate) fn prepare(&self, c: &Checked, elem_size: usize) -> Result<(Prepared, Choice)> {
        let (entry, choice) = self.plan_for(c, elem_size)?;
        Ok((self.bind(entry, c.send, c.recv), choice))
    }

    /// Chooses and fetches (generating on first use) the shared plan for
    /// a checked call: the registered direct plan where the choice says
    /// [`Transport::Direct`], else the FIFO one (on registered buffers too,
    /// where the FIFO variant under LL was predicted faster).
    fn plan_for(&self, c: &Checked, elem_size: usize) -> Result<(Arc<PlanEntry>, Choice)> {
        let cl = &self.clique;
        let bytes = c.coll.bytes(cl.nranks, elem_size);
        let registered = c.backend_memory && cl.backend.registered_alloc();
        let mut choice = cl
            .chooser
            .choose(&cl.config, c.coll.kind, bytes, registered)?;
        let fifo_chunk = (fifo_bytes(&cl.config, cl.backend.chunk_bytes()) / elem_size).max(1);
        let mut last: Option<CoreError>;
        // The selector's pick, then (should its generator refuse this
        // shape) the other allowed algorithms in preference order; the
        // list is built only when the pick is refused.
        let mut others: Option<std::vec::IntoIter<Algo>> = None;
        let mut algo = choice.algo;
        loop {
            // The pick runs the variant it names; a fallback, the direct
            // plan where the buffers allow one.
            let direct = if algo == choice.algo {
                choice.is_direct()
            } else {
                registered && is_direct(algo)
            };
            // A fallback algorithm may need fewer channels to fit; one
            // whose single channel does not fit is refused like a shape
            // its generator does not serve.
            let max = cl.chooser.max_channels();
            // A staged copy-engine plan runs on the executor (see
            // `gen::copy_engine_staged`): on every channel it may use, as
            // the all-pairs swap it stands in for would, not on the one
            // channel the copy-engine model chose (8 blocks for 8 ranks
            // of a GPU: 12.7% of the floor at 256 MiB).
            let channels = if algo == Algo::CopyEngine
                && gen::copy_engine_staged(c.coll.kind, cl.nranks, c.in_place)
            {
                max
            } else {
                select::fit_channels(algo, choice.channels, max)
            };
            let key = PlanKey {
                coll: c.coll,
                elem_size,
                algo,
                channels,
                chunk: piece_elems(algo, direct, fifo_chunk, elem_size, &cl.config),
                fifo_chunk,
                in_place: c.in_place,
                registered: direct,
            };
            let got = if algo.plan_channels(channels) <= max {
                cl.plans.get(cl.nranks, key)
            } else {
                Err(CoreError::Unsupported {
                    algo: algo.name().into(),
                    coll: format!("{} on at most {max} channels", c.coll.kind),
                })
            };
            match got {
                Ok(entry) => {
                    choice.channels = channels;
                    if algo != choice.algo {
                        choice.algo = algo;
                        choice.transport = if direct {
                            Transport::Direct
                        } else {
                            Transport::Fifo
                        };
                        choice.predicted_us = None;
                    }
                    return Ok((entry, choice));
                }
                Err(e @ CoreError::Unsupported { .. }) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
            let first = choice.algo;
            let rest = others.get_or_insert_with(|| {
                select::allowed_algos(&cl.config, c.coll.kind)
                    .into_iter()
                    .filter(|&a| a != first)
                    .collect::<Vec<_>>()
                    .into_iter()
            });
            match rest.next() {
                Some(a) => algo = a,
                None => break,
            }
        }
        Err(match last {
            Some(e) => Error::NoAlgorithm {
                coll: c.coll.kind,
                allowed: e.to_string(),
            },
            None => Error::Internal("plan selection chose nothing".into()),
        })
    }

    /// This rank's part of a cached plan with the call's buffers attached
    /// (the plan itself is shared, not copied).
    fn bind(&self, entry: Arc<PlanEntry>, send: RawBuf, recv: RawBuf) -> Prepared {
        let rank = self.rank as usize;
        let bufs = bind_all(&entry.plan.ranks[rank], send, recv);
        Prepared {
            plan: PlanRef::Cached { entry, rank },
            bufs,
        }
    }

    /// Hands a prepared plan to the backend; a failure marks the clique.
    /// `p2p_only`: see [`Launch::p2p_only`].
    pub(crate) fn launch(
        &self,
        p: &Prepared,
        dtype: oxccl_core::DataType,
        op: RedOp,
        proto: oxccl_core::Proto,
        p2p_only: bool,
    ) -> Result<()> {
        let handle = match &p.plan {
            PlanRef::Cached { entry, .. } => entry
                .handle(self.clique.backend.as_ref(), proto)
                .map_err(|e| self.fail("preparing a plan", e))?,
            PlanRef::Own(_) => None,
        };
        let how = RunAs {
            name: if p2p_only { "sendrecv" } else { "group" },
            dtype,
            op,
            proto,
            p2p_only,
            call: None,
        };
        self.run(p.plan.rank_plan(), &p.bufs, handle.as_ref(), how)
    }

    /// Hands one rank plan with its bound buffers to the backend; a
    /// failure marks the clique.
    fn run(
        &self,
        plan: &RankPlan,
        bufs: &[RawBuf],
        handle: Option<&backend::PlanHandle>,
        how: RunAs,
    ) -> Result<()> {
        let RunAs {
            name,
            dtype,
            op,
            proto,
            p2p_only,
            call,
        } = how;
        let tracer = self.clique.trace.as_ref().filter(|t| t.wants(self.rank));
        let steps = tracer.map(|_| backend::StepSink::default());
        let start = std::time::Instant::now();
        let lowered = op.lower(dtype, self.clique.nranks);
        let launch = Launch {
            rank: self.rank,
            plan,
            bufs,
            dtype,
            op: &lowered,
            proto,
            handle,
            p2p_only,
            steps: steps.as_ref(),
        };
        // SAFETY: every buffer passed validation: it is this rank's backend
        // memory or a borrowed user slice (host backend only) of at least
        // the plan's length, alive for the whole call (the `In`/`Out`
        // borrows outlive it), and aliased only in the in-place layout.
        let r = unsafe { self.clique.backend.execute(&launch) };
        if let (Some(t), Some(steps)) = (tracer, steps) {
            t.record(
                self.rank,
                crate::observe::CallTrace {
                    name,
                    dtype,
                    start,
                    end: std::time::Instant::now(),
                    plan_steps: plan.channels.iter().map(|c| c.steps.len()).sum(),
                    steps: steps.now.into_inner(),
                    later: steps.later.into_inner(),
                },
            );
        }
        let launched = match call {
            Some(c) => Launched::Coll(c),
            None => Launched::Group { dtype, p2p_only },
        };
        match r {
            Ok(()) => {
                self.watch.note(launched);
                self.clique.watchdog.start(&self.clique);
                Ok(())
            }
            // This rank's own launch failed (not a wait a failure ended):
            // its peers are committed to the call.
            Err(e) if own_fault(&e) => Err(self.fail_agreed(&launched.to_string(), e)),
            Err(e) => {
                let e = self.blamed(e);
                Err(self.fail("an operation", e))
            }
        }
    }

    /// The INFO line of a call: what it is (op and root only where the
    /// collective has them) and the choice; on the host backend the
    /// prediction is marked as the host model's estimate, not GPU time.
    fn log(&self, c: &Checked, dtype: DataType, op: RedOp, ch: &Choice) {
        if !tracing::enabled!(target: "oxccl::coll", tracing::Level::INFO) {
            return;
        }
        let call = Call::coll(c.coll.kind, dtype, c.coll.count, op, c.coll.root);
        let host = if self.backend() == BackendKind::Host {
            " (host-model estimate, not GPU time)"
        } else {
            ""
        };
        tracing::info!(
            target: "oxccl::coll",
            rank = self.rank,
            in_place = c.in_place,
            "oxccl: {call}: {ch}{host}"
        );
    }
}

/// A rank whose call failed after its peers agreed on it: who, which
/// call, and why.
#[derive(Clone, Debug)]
pub(crate) struct Blame {
    pub rank: u32,
    pub call: String,
    pub reason: String,
}

/// How a failure after the agreement reads in the clique's failure: `rank
/// R failed CALL{AFTER_AGREEMENT}REASON` (peers read the call and reason
/// back from it, across processes too).
pub(crate) const AFTER_AGREEMENT: &str = ", a call its peers were committed to: ";

/// Whether `e` is a failure of this rank's own making, rather than a wait
/// that a deadline, an abort or a peer's failure ended.
pub(crate) fn own_fault(e: &Error) -> bool {
    !matches!(
        e,
        Error::Wait(_)
            | Error::Aborted(_)
            | Error::Failed { .. }
            | Error::Timeout(_)
            | Error::PeerFailed { .. }
            | Error::Destroyed { .. }
    )
}
