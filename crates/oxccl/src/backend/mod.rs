//! The backend trait: what a device family must provide so the facade can
//! run plans on it.
//!
//! One backend object serves every rank of a clique (the communicators made
//! by one `init_all`). The facade validates every argument, chooses and
//! generates the plan, and hands each rank's part to [`Backend::execute`]
//! with raw buffer addresses; the backend only has to run plan steps and
//! manage memory. Backends never see user slices or typed buffers.
//!
//! How the two backends map the facade's notions:
//!
//! | notion | host backend | CUDA backend |
//! | --- | --- | --- |
//! | [`RawBuf::addr`] | a host virtual address | a `CUdeviceptr` in the rank's context |
//! | `alloc` | zeroed host memory | `cuMemAlloc` (peer-accessible, "registered"), zeroed on the rank's stream |
//! | `free` | back to the allocator at once | pooled; reused once the rank's stream has passed the free |
//! | `execute` | runs the plan on the calling thread, returns when done | enqueues one launch on the rank's stream, returns at once |
//! | `synchronize` | nothing to wait for | waits for the rank's stream |
//! | a caller's stream ([`RawStream`]) | ignored | fork/join with events around the launch (`follow_stream`, `release_stream`) |
//! | external memory (`check_external`) | any memory of this process (ranks as threads) | device memory of the rank's device every rank's device may access |
//! | timer | `Instant` | CUDA events on the rank's stream |

pub mod cuda;
pub(crate) mod cuda_exports;
pub(crate) mod cuda_procs;
pub mod cuda_staged;
mod cuda_staged_capture;
mod cuda_staging;
mod cuda_trace;
pub mod host;
pub mod null;
pub mod placement;

use std::fmt::Debug;
use std::time::Duration;

use oxccl_core::plan::RankPlan;
use oxccl_core::{DataType, LoweredOp, Plan, Proto};

use crate::error::Error;

/// Which backend a clique runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// Ranks are threads of this process, memory is host memory.
    Host,
    /// Ranks are CUDA devices (round-robin over the visible ones; several
    /// ranks may share one GPU).
    Cuda,
    /// CUDA when a device is present, else host.
    #[default]
    Auto,
}

impl BackendKind {
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
            BackendKind::Auto => "auto",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "host" | "cpu" => Ok(BackendKind::Host),
            "cuda" | "gpu" => Ok(BackendKind::Cuda),
            "auto" => Ok(BackendKind::Auto),
            _ => Err(Error::Config {
                var: "backend".into(),
                value: s.into(),
                reason: "expected host, cuda or auto".into(),
            }),
        }
    }
}

/// A span of backend memory: an address in the rank's address space (host
/// pointer or device pointer) and a length in bytes. Plain data: it owns
/// nothing and is only meaningful to the backend that produced it (or, on
/// the host backend, to the user slice it was taken from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawBuf {
    pub addr: u64,
    pub bytes: usize,
}

impl RawBuf {
    /// No memory: stands for scratch buffers (the backend provides them)
    /// and zero-length buffers.
    pub const NULL: RawBuf = RawBuf { addr: 0, bytes: 0 };

    /// The sub-span starting `off` bytes in, `bytes` long.
    pub fn sub(self, off: usize, bytes: usize) -> RawBuf {
        debug_assert!(off + bytes <= self.bytes, "sub-span out of range");
        RawBuf {
            addr: self.addr + off as u64,
            bytes,
        }
    }

    /// One past the last byte.
    pub fn end(self) -> u64 {
        self.addr + self.bytes as u64
    }
}

/// A caller's stream, as the raw entry points take it
/// ([`crate::Communicator::collective_raw`]): on CUDA a `CUstream` (or
/// `cudaStream_t`, the same handle) of the rank's device's primary context,
/// where 0 is the legacy default stream; the host backend ignores it (its
/// calls complete before they return).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RawStream(pub u64);

impl RawStream {
    /// The legacy default stream (`0`, NCCL's "stream 0").
    pub const DEFAULT: RawStream = RawStream(0);

    /// From a C handle (`cudaStream_t`, `CUstream`).
    pub fn from_ptr(p: *mut std::ffi::c_void) -> RawStream {
        RawStream(p as usize as u64)
    }

    /// As a C handle.
    pub fn as_ptr(self) -> *mut std::ffi::c_void {
        self.0 as usize as *mut std::ffi::c_void
    }
}

/// One rank's share of one operation (or one group), as the facade hands
/// it to [`Backend::execute`].
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    pub rank: u32,
    pub plan: &'a RankPlan,
    /// One entry per `plan.bufs` entry (see [`Backend`] for the contract).
    pub bufs: &'a [RawBuf],
    pub dtype: DataType,
    pub op: &'a LoweredOp,
    /// Wire protocol for FIFO connections, one of [`Backend::protocols`].
    pub proto: Proto,
    /// What [`Backend::prepare_plan`] returned for the plan this rank
    /// plan belongs to (`None` for plans made per call, e.g. groups).
    pub handle: Option<&'a PlanHandle>,
    /// A plan of Send/Recv only: launched by the ranks it exchanges with,
    /// not by every rank (a backend that matches launches across ranks
    /// needs to know; a collective, or a group holding one, is `false`).
    pub p2p_only: bool,
    /// Where a backend that records steps appends a record of each step
    /// run, when a step trace is asked for.
    pub steps: Option<&'a StepSink>,
}

/// What [`Backend::launch_counts`] reports: how calls ran on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchCounts {
    /// Plans the executor ran: kernels launched on a GPU, plans run by
    /// the host backend's ranks (this process's).
    pub kernels: u64,
    /// Calls run as copies on the copy engines, with no kernel (no SM).
    pub copy_engine_calls: u64,
    /// AllReduce calls run on the one-step LL path
    /// ([`Backend::oneshot_ll_bytes`]); on a GPU each is one of `kernels`.
    pub oneshot_ll_calls: u64,
}

/// A step record the device is still writing: read when the trace is
/// written (every traced call launched by then).
pub type LaterSteps = Box<dyn FnOnce() -> Vec<oxccl_core::trace::StepRecord> + Send>;

/// Where a traced call's step records go: at once (the host backend), or
/// later (CUDA: the kernel's stamps, read without draining its stream,
/// which a caller driving several ranks from one thread could not do
/// before launching the others).
#[derive(Default)]
pub struct StepSink {
    pub now: parking_lot::Mutex<Vec<oxccl_core::trace::StepRecord>>,
    pub later: parking_lot::Mutex<Vec<LaterSteps>>,
}

impl std::fmt::Debug for StepSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepSink")
            .field("now", &self.now.lock().len())
            .field("later", &self.later.lock().len())
            .finish()
    }
}

/// A backend's state for one plan on every rank (device uploads), made
/// once by [`Backend::prepare_plan`] and handed back on every launch.
pub type PlanHandle = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// What [`Backend::prepare_plan`] returns: the plan's handle, `None` when
/// the backend keeps nothing for it.
pub type PreparedPlan = Result<Option<PlanHandle>, Error>;

/// What a backend is told when a clique is created.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    pub nranks: u32,
    /// Every wait gives up after this long with an error naming rank,
    /// peer, channel and step.
    pub deadline: Duration,
    /// When a wait for absent peers warns (first, then every period).
    pub wait_warn: crate::config::branches::WaitWarn,
    /// Largest AllReduce payload per rank, in bytes, the one-step LL path
    /// serves (0: none); see [`Backend::oneshot_ll_bytes`].
    pub ll1_bytes: usize,
    /// The host backend's branch of the settings.
    pub host: crate::config::branches::HostSettings,
    /// The CUDA backend's branch of the settings.
    pub cuda: crate::config::branches::CudaSettings,
}

/// Elapsed-time measurement on one rank, in the rank's execution order:
/// `start` marks the point after everything already issued, `lap` marks
/// the point after everything issued since the previous mark (never
/// waiting), `stop` marks the last point, waits for it and returns the
/// time since `start`; [`Timer::laps`] then holds the time between each
/// pair of consecutive marks. Call `lap` between the timed calls, not
/// after the last one (`stop` ends the last lap).
pub trait Timer: Send + Debug {
    fn start(&mut self) -> Result<(), Error>;
    fn lap(&mut self) -> Result<(), Error>;
    fn stop(&mut self) -> Result<Duration, Error>;
    /// The laps of the last measurement `stop` ended, in order (one lap,
    /// the whole of it, when `lap` was never called).
    fn laps(&self) -> &[Duration];
    /// Makes what `laps` marks will need now, so that a timed region
    /// allocates nothing (CUDA events); backends with nothing to make
    /// return at once.
    fn reserve(&mut self, _laps: usize) -> Result<(), Error> {
        Ok(())
    }
}

/// Host-clock marks: what the host and null backends time with (their
/// calls complete on return, so the host's clock is their order).
#[derive(Debug, Default)]
pub struct WallTimer {
    marks: Vec<std::time::Instant>,
    laps: Vec<Duration>,
}

impl Timer for WallTimer {
    fn start(&mut self) -> Result<(), Error> {
        self.marks.clear();
        self.laps.clear();
        self.marks.push(std::time::Instant::now());
        Ok(())
    }
    fn lap(&mut self) -> Result<(), Error> {
        if self.marks.is_empty() {
            return Err(not_started());
        }
        self.marks.push(std::time::Instant::now());
        Ok(())
    }
    fn stop(&mut self) -> Result<Duration, Error> {
        let Some(&first) = self.marks.first() else {
            return Err(not_started());
        };
        let last = std::time::Instant::now();
        self.marks.push(last);
        self.laps = self.marks.windows(2).map(|w| w[1] - w[0]).collect();
        self.marks.clear();
        Ok(last - first)
    }
    fn laps(&self) -> &[Duration] {
        &self.laps
    }
}

/// The error of a `lap` or `stop` with no `start` before it.
pub(crate) fn not_started() -> Error {
    Error::InvalidUsage("timer lap or stop before it was started".into())
}

/// Completion of the work one rank had issued when it was made (the
/// facade's per-call [`crate::Completion`] handles).
pub trait Completion: Send + Debug {
    /// Whether that work has completed (never waits).
    fn is_done(&mut self) -> Result<bool, Error>;
    /// Waits until that work has completed.
    fn wait(&mut self) -> Result<(), Error>;
}

/// The completion of a blocking backend: its work is done on return.
#[derive(Debug)]
pub struct Done;

impl Completion for Done {
    fn is_done(&mut self) -> Result<bool, Error> {
        Ok(true)
    }
    fn wait(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// A peer's exported window as it reaches a rank: the descriptor the
/// peer passed over the mailbox and the record it all-gathered
/// ([`Backend::window_export`]'s two parts).
#[derive(Clone, Copy, Debug)]
pub struct PeerWindow<'a> {
    pub peer: u32,
    pub fd: &'a std::os::fd::OwnedFd,
    pub record: &'a [u8],
}

/// A device family. One object per clique, shared by its ranks' threads.
///
/// Contract for [`Backend::execute`]: `launch.bufs` has one entry per
/// `plan.bufs` entry, in order; entries for [`oxccl_core::plan::BufRole::Scratch`]
/// buffers are [`RawBuf::NULL`] (the backend provides scratch). The facade
/// has checked lengths, bounds and aliasing, so each non-scratch entry holds
/// at least `plan.bufs[i].len * dtype.size()` bytes. Input and output may
/// overlap exactly as the plan's in-place convention says.
pub trait Backend: Send + Sync + Debug {
    /// Which backend this is (`Host` or `Cuda`, never `Auto`).
    fn kind(&self) -> BackendKind;

    /// A short description for logs and the sweep's JSON (`"host, 4 threads"`,
    /// `"cuda, 1x NVIDIA H200"`).
    fn describe(&self) -> String;

    /// Whether `execute` blocks until the plan has run (host) rather than
    /// enqueueing it (CUDA). A thread driving several communicators in a
    /// group runs blocking backends' plans on scoped threads.
    fn blocking(&self) -> bool;

    /// Whether `execute` returns only once the other ranks of its device
    /// have executed the call too (CUDA with more ranks on a GPU than it has
    /// hardware queues). A group then also runs each communicator's
    /// launches on a thread of its own.
    fn launches_in_step(&self) -> bool {
        false
    }

    /// Who launches the ranks' kernels: threads of this process (the
    /// default), or a process per rank (the CUDA backend's process
    /// cliques), whose plans pay every sequential hop
    /// ([`oxccl_topo::consts::PROCESS_HOP_US`]).
    fn launcher(&self) -> oxccl_topo::Launcher {
        oxccl_topo::Launcher::OneProcess
    }

    /// Whether memory from [`Backend::alloc`] is registered, i.e. every rank
    /// can address every other rank's buffers, so plans with direct
    /// (remote get/put) steps may be used on it.
    fn registered_alloc(&self) -> bool;

    /// Whether memory registered with [`Backend::check_external`] may run
    /// direct plans (every rank reaches it). Not for ranks as processes:
    /// CUDA peers map each rank's `alloc` heap at creation, and the
    /// caller's allocations per call ([`Backend::share_external`]); host
    /// and staged CUDA peers reach only each other's heaps. Where it is
    /// false, a registration is accepted (as NCCL's is) and changes
    /// nothing.
    fn registered_external(&self) -> bool {
        true
    }

    /// Makes `buf`, memory the caller allocated on `rank`'s device and
    /// passed to a call about to be checked, reachable by every rank for
    /// that call where the backend can do so unasked; `false` where it
    /// cannot (the call then runs a FIFO plan unless `buf` is registered).
    /// CUDA ranks as processes share the allocation with their peer
    /// processes here. Only called with the call check on: a peer learns
    /// of the allocation before its launch through the check's ordering.
    fn share_external(&self, rank: u32, buf: RawBuf) -> bool {
        let _ = (rank, buf);
        false
    }

    /// Whether a window registered by rank processes is mapped into every
    /// peer at registration (`window.rs`): CUDA ranks as processes. The
    /// `window_*` methods below serve that exchange; the defaults refuse.
    fn maps_windows(&self) -> bool {
        false
    }

    /// The allocation holding `rank`'s window `buf`, exported for the
    /// peers: a descriptor to pass them and a record to publish; `None`
    /// where it cannot be (the window then runs as caller memory).
    fn window_export(
        &self,
        rank: u32,
        buf: RawBuf,
    ) -> Result<Option<(std::os::fd::OwnedFd, Vec<u8>)>, Error> {
        let _ = (rank, buf);
        Ok(None)
    }

    /// Maps a peer's exported window for `rank`.
    fn window_import(&self, rank: u32, window: PeerWindow<'_>) -> Result<(), Error> {
        let _ = (rank, window);
        Err(Error::InvalidUsage(format!(
            "{} does not map windows",
            self.describe()
        )))
    }

    /// Every peer mapped `rank`'s window of `record`: calls on it may now
    /// take the direct plans.
    fn window_publish(&self, rank: u32, record: &[u8]) -> Result<(), Error> {
        let _ = (rank, record);
        Ok(())
    }

    /// `rank`'s window at `buf` was deregistered: later calls on it no
    /// longer count as shared (peers keep their mappings, so calls
    /// already enqueued stay valid).
    fn window_retire(&self, rank: u32, buf: RawBuf) {
        let _ = (rank, buf);
    }

    /// Whether memory from [`Backend::alloc`] is host memory of this
    /// process that Rust code may read and write directly (zero-copy
    /// views of a `Buffer`). Only a backend that knows it says yes.
    fn host_addressable(&self) -> bool {
        false
    }

    /// Whether the backend reads a PreMulSum scalar from device memory
    /// itself when the call runs ([`RedOp::PreMulSumDevice`], ordered
    /// after the caller's earlier work, at every replay of a captured
    /// graph): CUDA kernels read it, the staged CUDA path copies it in
    /// with the buffers; the host backend is handed the value instead.
    ///
    /// [`RedOp::PreMulSumDevice`]: oxccl_core::RedOp::PreMulSumDevice
    fn reads_device_scalars(&self) -> bool {
        false
    }

    /// Largest FIFO message in bytes: generators pipeline in pieces of at
    /// most `chunk_bytes / elem_size` elements.
    fn chunk_bytes(&self) -> usize;

    /// Largest number of channels a plan may have.
    fn max_channels(&self) -> u32;

    /// What FIFO connections take of device memory and may take, where
    /// that bounds the plans (`None`: it does not).
    fn link_memory(&self) -> Option<oxccl_topo::policy::LinkMemory> {
        None
    }

    /// Wire protocols `execute` implements for FIFO connections; the
    /// selector picks only among these (intersected with `NCCL_PROTO`).
    /// Both executors run Simple only today, so that is the default; a
    /// backend that builds LL or LL128 lists them here.
    fn protocols(&self) -> &'static [Proto] {
        &[Proto::Simple]
    }

    /// Makes whatever every rank needs to launch `plan` with `proto` on
    /// `elem_size`-byte elements (device uploads, connections, scratch),
    /// once per plan, when it is first used, so launches only enqueue.
    /// The facade calls it from one rank's thread, before any rank launches
    /// the plan. The default keeps nothing.
    fn prepare_plan(&self, plan: &Plan, elem_size: usize, proto: Proto) -> PreparedPlan {
        let _ = (plan, elem_size, proto);
        Ok(None)
    }

    /// Runs (host) or enqueues (CUDA) one rank's part of a plan.
    ///
    /// # Safety
    /// Every non-null entry of `launch.bufs` must be memory of
    /// `launch.rank` that is valid for reads and writes of its length for
    /// the duration of the call (host) or until the enqueued work completes
    /// (CUDA: memory from [`Backend::alloc`] is, even if freed meanwhile,
    /// see [`Backend::free`]), and not accessed by anything else meanwhile
    /// except as the plan's in-place aliasing says.
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error>;

    /// Allocates `bytes` bytes of zeroed memory for `rank`. The zeros are
    /// there for everything later issued on `rank` (its `execute`, `write`,
    /// `read`, and the peers' accesses inside those operations); on CUDA
    /// the zeroing is enqueued on the rank's stream and the call returns
    /// at once.
    fn alloc(&self, rank: u32, bytes: usize) -> Result<RawBuf, Error>;

    /// Frees memory from [`Backend::alloc`]. The call returns at once, and
    /// the memory is handed out again only after every operation issued
    /// on `rank` before the free has completed: the rank's own work on it
    /// and, inside those operations, every peer's access to it as
    /// registered memory (a plan's owner finishes only after its peers'
    /// last remote access to its buffers). So dropping a buffer right
    /// after enqueuing a collective on it is sound: the collective still
    /// runs on the old memory, and no later allocation sees its writes.
    ///
    /// # Safety
    /// `buf` must come from `alloc` on this backend for `rank` and not be
    /// used by anything issued after this call.
    unsafe fn free(&self, rank: u32, buf: RawBuf);

    /// Copies `src` into backend memory at `dst` (ordered after work
    /// already issued on the rank; returns when the copy is done).
    ///
    /// # Safety
    /// `dst` must lie inside memory from `alloc` for `rank`, with at least
    /// `src.len()` bytes.
    unsafe fn write(&self, rank: u32, dst: RawBuf, src: &[u8]) -> Result<(), Error>;

    /// Copies backend memory at `src` into `dst` (ordered after work already
    /// issued on the rank).
    ///
    /// # Safety
    /// `src` must lie inside memory from `alloc` for `rank`, with at least
    /// `dst.len()` bytes.
    unsafe fn read(&self, rank: u32, src: RawBuf, dst: &mut [u8]) -> Result<(), Error>;

    /// Waits until everything issued on `rank` has completed.
    fn synchronize(&self, rank: u32) -> Result<(), Error>;

    /// Makes `rank`'s work issued after this call run after the work
    /// issued on the caller's `stream` before it, without a host wait
    /// (CUDA: an event on `stream` that the rank's stream waits for).
    /// Blocking backends ignore streams: the caller's earlier work is
    /// its own business, and their calls complete before returning.
    ///
    /// # Safety
    /// `stream` must be a live stream handle of this backend for `rank`
    /// (see [`RawStream`]).
    unsafe fn follow_stream(&self, rank: u32, stream: RawStream) -> Result<(), Error> {
        let _ = (rank, stream);
        self.ignores_streams()
    }

    /// Makes the caller's `stream`'s work issued after this call run after
    /// everything issued on `rank` before it, without a host wait.
    /// Blocking backends ignore streams.
    ///
    /// # Safety
    /// As [`Backend::follow_stream`].
    unsafe fn release_stream(&self, rank: u32, stream: RawStream) -> Result<(), Error> {
        let _ = (rank, stream);
        self.ignores_streams()
    }

    /// `Ok` for a blocking backend, which may ignore callers' streams;
    /// an error for one that enqueues and has no stream support.
    fn ignores_streams(&self) -> Result<(), Error> {
        if self.blocking() {
            Ok(())
        } else {
            Err(Error::InvalidUsage(format!(
                "{} does not run calls on a caller's stream",
                self.describe()
            )))
        }
    }

    /// Checks that memory the caller allocated (`buf`, of `rank`) can be
    /// registered: that it is memory of `rank`'s kind and place and, where
    /// [`Backend::registered_external`] says registered memory runs direct
    /// plans, that every rank of the clique may load and store it. Nothing
    /// is changed. The default refuses.
    fn check_external(&self, rank: u32, buf: RawBuf) -> Result<(), Error> {
        let _ = (rank, buf);
        Err(Error::InvalidUsage(format!(
            "{} cannot register memory it did not allocate",
            self.describe()
        )))
    }

    /// A completion for everything issued on `rank` so far. The default
    /// serves blocking backends (everything is done already); a
    /// backend that enqueues must record something it can query.
    fn completion(&self, rank: u32) -> Result<Box<dyn Completion>, Error> {
        let _ = rank;
        if self.blocking() {
            Ok(Box::new(Done))
        } else {
            Err(Error::Backend(format!(
                "{} has no per-call completion handles; use synchronize()",
                self.describe()
            )))
        }
    }

    /// A probe of everything issued on `rank` so far, for the watchdog of
    /// enqueued calls (`watchdog.rs`), taken from its own thread once a
    /// tick at most: `None` when the rank cannot be probed now (CUDA: its
    /// stream is being captured into a graph, whose work runs only when
    /// the graph is launched). The default is [`Backend::completion`].
    fn probe(&self, rank: u32) -> Result<Option<Box<dyn Completion>>, Error> {
        self.completion(rank).map(Some)
    }

    /// Readies the calling thread, the watchdog's, before its first probe
    /// (CUDA: relaxed capture mode, so its queries never break a graph
    /// capture another thread runs). The default does nothing.
    fn watchdog_thread(&self) {}

    /// Makes every rank's pending and future waits fail promptly, with
    /// errors that tell `why` (which rank aborted, and for what).
    fn abort(&self, why: &str);

    /// The first failure any rank of the clique hit, if any.
    fn failure(&self) -> Option<Error>;

    /// A timer ordered with `rank`'s work.
    fn timer(&self, rank: u32) -> Result<Box<dyn Timer>, Error>;

    /// Ranks whose data lives in the busiest memory (the GPU, or the host,
    /// holding the most ranks); `None` means every rank shares one. The
    /// sweep's floor ratio divides the bytes crossing that memory by its
    /// copy bandwidth.
    /// The device each rank runs on, by rank, where ranks have devices
    /// (`split` keeps a member on its parent rank's device).
    fn rank_devices(&self) -> Option<Vec<i32>> {
        None
    }

    /// The device `rank` runs on, where ranks have devices and this
    /// process knows it (a rank staged through host memory knows only its
    /// own).
    fn device_of(&self, rank: u32) -> Option<i32> {
        self.rank_devices()?.get(rank as usize).copied()
    }

    fn busiest_memory_ranks(&self) -> Option<u32> {
        None
    }

    /// Device memory this clique's backend holds now, in bytes (0 where
    /// it holds none: the host backend).
    fn device_bytes(&self) -> u64 {
        0
    }

    /// Whether plans of the copy-engine algorithm run on the copy
    /// engines with no kernel (so the selector times them and may pick
    /// them); `false` where they run as the backend's other plans.
    fn copy_engines(&self) -> bool {
        false
    }

    /// Largest AllReduce payload per rank, in bytes, that plans of
    /// [`oxccl_core::Algo::OneShotLl`] run on the backend's one-step LL
    /// path (0: it has none, and those plans run as the FIFO one-shot
    /// they are). The facade routes larger calls forced to `ll1` to the
    /// FIFO one-shot.
    fn oneshot_ll_bytes(&self) -> usize {
        0
    }

    /// Whether the selector may time the one-step LL path and pick it
    /// unforced (where [`Backend::oneshot_ll_bytes`] serves the call): a
    /// backend where it is a latency win says so; forcing `ll1` works
    /// wherever the path exists.
    fn oneshot_ll_priced(&self) -> bool {
        false
    }

    /// How the backend ran this process's calls so far, all ranks
    /// together: device kernels launched and calls run as copy-engine
    /// copies with no kernel (`None`: a backend without kernels).
    fn launch_counts(&self) -> Option<LaunchCounts> {
        None
    }

    /// Copy bandwidth ceiling in GB/s (bytes read + written counted once
    /// as `bytes`), measured by copying `bytes` bytes: host single-thread
    /// memcpy, CUDA `cuMemcpyDtoD`. The sweep's `--baseline`.
    fn copy_bandwidth(&self, bytes: usize) -> Result<f64, Error>;

    /// Ranks over the network: the transport's ceiling per connection,
    /// one plain TCP stream of `bytes` bytes on this rank's interface, in
    /// GB/s, measured now. `None` when the ranks do not talk over the
    /// network. The sweep's `--baseline` there.
    fn stream_bandwidth(&self, _bytes: usize) -> Option<Result<f64, Error>> {
        None
    }

    /// Ranks over the network: GB/s of each of two such streams run at
    /// once (what two ranks exchanging both ways can move each way when
    /// they share the host's cores, as over loopback). `None` when the
    /// ranks do not talk over the network or the backend does not measure
    /// it.
    fn duplex_bandwidth(&self, _bytes: usize) -> Option<Result<f64, Error>> {
        None
    }

    /// Ranks over the network: where they are (each rank's host) and what
    /// the network gives, for the cost model, rings and trees; `None`
    /// when the ranks do not talk over the network.
    fn net_placement(&self) -> Option<oxccl_topo::NetPlacement> {
        None
    }
}
