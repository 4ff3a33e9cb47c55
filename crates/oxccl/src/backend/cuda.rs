//! The CUDA backend: binds the facade's [`Backend`] trait to
//! `oxccl_cuda::World`. Ranks are placed round-robin on the visible GPUs
//! (several ranks may share one); each rank has its own non-blocking
//! stream, and `execute` enqueues one kernel launch there and returns.

use std::sync::Arc;
use std::time::Duration;

use oxccl_core::plan::BufRole;
use oxccl_core::{Plan, Proto};
use oxccl_cuda::driver::Event;
use oxccl_cuda::layout::MAX_BUFS;
use oxccl_cuda::{CudaError, Party, Prepared, World, WorldConfig};

use super::{
    Backend, BackendKind, BackendOptions, Completion, Launch, PeerWindow, PreparedPlan, RawBuf,
    RawStream, Timer,
};
use crate::error::Error;

/// Whether a CUDA device can be used in this process (never panics).
pub fn available() -> bool {
    oxccl_cuda::available().is_ok()
}

/// The device NCCL would run a rank initialised in the calling thread on:
/// the current context's device (`cudaSetDevice`'s), or 0 when no context
/// is current (the runtime's default).
pub fn current_device() -> Result<i32, Error> {
    oxccl_cuda::driver::current_device()
        .map(|d| d.unwrap_or(0))
        .map_err(|e| Error::Cuda(e.to_string()))
}

/// The guard of every GPU test and device example: skips (printing
/// `skipped: no CUDA device (<why>)`) only without a driver or device, and
/// fails instead under `OXCCL_REQUIRE_GPU=1` or on any other error (see
/// `oxccl_cuda::gpu_gate`).
pub use oxccl_cuda::device_or_skip;

/// Memory from the virtual memory management API in the calling thread's
/// current CUDA context, for the C ABI's `ncclMemAlloc` (NCCL's
/// allocation: exportable, peers granted access; `cuMemAlloc` memory on a
/// device without VMM). Any collective takes it as external memory, and
/// registration (windows included) accepts it.
pub use oxccl_cuda::vmm::SymMem;

/// See [`SymMem`].
pub fn alloc_symmetric(bytes: usize) -> Result<SymMem, Error> {
    oxccl_cuda::vmm::alloc_in_current_context(bytes).map_err(map_error)
}

/// Frees memory from [`alloc_symmetric`] once its context's work is done.
///
/// # Safety
/// Nothing touches the range afterwards, and no work that may still touch
/// it is pending on a stream of another context.
pub unsafe fn free_symmetric(m: SymMem) -> Result<(), Error> {
    // SAFETY: caller's contract.
    unsafe { m.free() }.map_err(map_error)
}

/// Asks for few hardware queues when this process first uses CUDA: a
/// process that drives no rank of a thread clique (a launcher, a test
/// spawning rank processes) leaves MPS room for its ranks' clients (with
/// the wide default, a parent plus 4 rank processes exhausted it on the
/// H200: `cuDevicePrimaryCtxRetain` failed with out of memory).
pub use oxccl_cuda::driver::prefer_process_rank_queues;

/// Creates the CUDA backend for a clique of `opts.nranks` ranks (ranks
/// round-robin over the visible devices).
pub fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>, Error> {
    let info = oxccl_cuda::available().map_err(|e| Error::BackendUnavailable(e.to_string()))?;
    let mut cfg = WorldConfig::round_robin(opts.nranks, info.devices.len() as i32, opts.deadline);
    opts.cuda.apply(&mut cfg);
    cfg.ll1_bytes = opts.ll1_bytes;
    create_with(cfg)
}

/// The CUDA backend of a thread clique whose rank `r` runs on device
/// `devices[r]` (a split keeps each member on its parent rank's device).
pub fn create_on(opts: &BackendOptions, devices: Vec<i32>) -> Result<Arc<dyn Backend>, Error> {
    let mut cfg = WorldConfig::round_robin(opts.nranks, 1, opts.deadline);
    opts.cuda.apply(&mut cfg);
    cfg.ll1_bytes = opts.ll1_bytes;
    cfg.devices = devices;
    create_with(cfg)
}

fn create_with(cfg: WorldConfig) -> Result<Arc<dyn Backend>, Error> {
    let world = World::new(cfg).map_err(map_error)?;
    Ok(Arc::new(CudaBackend {
        world,
        procs: None,
        why: Default::default(),
    }))
}

/// The CUDA backend of this process's rank of a process clique whose
/// kernels may wait on each other (MPS, or one rank per GPU): `devices`
/// has every rank's ordinal. Links and each rank's heap (`alloc`) are
/// shared by IPC (`World::across_processes`), so direct plans run as in
/// one process; a watcher aborts this rank's waits when a peer process
/// exits. Every rank fails alike if any cannot share.
pub(crate) fn create_procs(
    boot: &oxccl_bootstrap::Bootstrap,
    opts: &BackendOptions,
    devices: Vec<i32>,
) -> Result<Arc<dyn Backend>, Error> {
    let mut cfg = WorldConfig::round_robin(opts.nranks, 1, opts.deadline);
    opts.cuda.apply(&mut cfg);
    cfg.ll1_bytes = opts.ll1_bytes;
    cfg.devices = devices;
    cfg.heap_bytes = opts.cuda.heap_bytes;
    let me = boot.rank();
    let mut ex = |m: &[u8]| boot.all_gather(m).map_err(|e| e.to_string());
    let world = World::across_processes(cfg, me, &mut ex).map_err(map_error)?;
    let w = world.clone();
    let watch = oxccl_bootstrap::PeerWatch::start(boot, move |r, pid| {
        tracing::warn!(
            rank = me,
            lost = r,
            pid,
            "oxccl: a peer process exited; aborting"
        );
        w.abort();
    })
    .map_err(crate::error::map_bootstrap)?;
    let exports = super::cuda_exports::ExportBoard::new(boot)?;
    Ok(Arc::new(CudaBackend {
        world,
        procs: Some(Procs { me, watch, exports }),
        why: Default::default(),
    }))
}

/// What a rank of a process clique adds.
#[derive(Debug)]
struct Procs {
    me: u32,
    watch: oxccl_bootstrap::PeerWatch,
    /// The caller's allocations shared between the processes.
    exports: super::cuda_exports::ExportBoard,
}

/// Maps a CUDA backend error onto the facade's.
pub(crate) fn map_error(e: CudaError) -> Error {
    match e {
        e @ (CudaError::NoDriver(_) | CudaError::NoNvrtc(_) | CudaError::DriverTooOld { .. }) => {
            Error::BackendUnavailable(e.to_string())
        }
        CudaError::Wait(f) => Error::Wait(f),
        e @ CudaError::Aborted => Error::Aborted(e.to_string()),
        e @ (CudaError::Driver { .. } | CudaError::Compile { .. }) => Error::Cuda(e.to_string()),
        CudaError::Plan(m) => Error::Internal(m),
        CudaError::Invalid(m) => Error::Backend(m),
    }
}

/// Every rank's upload of one plan, by rank (a [`super::PlanHandle`]); ranks of
/// other processes have none.
#[derive(Debug)]
struct Uploads(Vec<Option<Arc<Prepared>>>);

/// The CUDA backend of one clique.
#[derive(Debug)]
pub struct CudaBackend {
    world: Arc<World>,
    /// Ranks as processes: this process's rank and its peer watcher.
    procs: Option<Procs>,
    /// Why this process aborted the clique (the first reason), for the
    /// errors of the waits it ends.
    why: parking_lot::Mutex<Option<String>>,
}

impl CudaBackend {
    /// A lost peer process, as the error every call now gets.
    fn lost(&self) -> Option<Error> {
        let (r, pid) = self.procs.as_ref()?.watch.lost()?;
        Some(Error::Aborted(format!(
            "rank {r} (pid {pid}) exited: its peers cannot complete collectives with it"
        )))
    }

    /// `e`, unless a peer process was lost (which explains it); an abort
    /// says why, where this process aborted.
    fn explain(&self, e: CudaError) -> Error {
        if let Some(lost) = self.lost() {
            return lost;
        }
        match (&e, self.why.lock().as_deref()) {
            (CudaError::Aborted, Some(why)) => Error::Aborted(format!("{e} ({why})")),
            _ => map_error(e),
        }
    }

    /// The rank whose stream serves whole-backend measurements.
    fn any_rank(&self) -> u32 {
        self.procs.as_ref().map_or(0, |p| p.me)
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn describe(&self) -> String {
        match &self.procs {
            Some(p) => format!(
                "cuda, rank {} of {} processes, links and heaps shared by IPC, {}",
                p.me,
                self.world.nranks(),
                self.world.describe()
            ),
            None => format!("cuda, {}", self.world.describe()),
        }
    }

    fn blocking(&self) -> bool {
        false
    }

    fn launches_in_step(&self) -> bool {
        self.world.launches_in_step()
    }

    fn launcher(&self) -> oxccl_topo::Launcher {
        match self.procs {
            Some(_) => oxccl_topo::Launcher::ProcessPerRank,
            None => oxccl_topo::Launcher::OneProcess,
        }
    }

    fn reads_device_scalars(&self) -> bool {
        true
    }

    fn registered_alloc(&self) -> bool {
        // `alloc` is cuMemAlloc in a context with peer access to every
        // other rank's device (or the same device): peers can load/store it.
        // Across processes it is part of the rank's heap, which every peer
        // process maps (kernels translate published addresses).
        true
    }

    fn registered_external(&self) -> bool {
        // Across processes a peer reaches a rank's heap (`alloc`), and the
        // caller's allocations only as `share_external` shares them.
        self.procs.is_none()
    }

    fn share_external(&self, rank: u32, buf: RawBuf) -> bool {
        let Some(p) = self.procs.as_ref() else {
            return false;
        };
        match self.world.share_range(rank, buf.addr, buf.bytes) {
            Ok(Some(sh)) => {
                if let Some(rec) = &sh.record {
                    p.exports.publish(sh.tag, rec);
                }
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(rank, error = %e, "oxccl: not shared with the peer processes");
                false
            }
        }
    }

    fn maps_windows(&self) -> bool {
        self.procs.is_some()
    }

    fn window_export(
        &self,
        rank: u32,
        buf: RawBuf,
    ) -> Result<Option<(std::os::fd::OwnedFd, Vec<u8>)>, Error> {
        if self.procs.is_none() {
            return Ok(None);
        }
        let e = self
            .world
            .window_export(rank, buf.addr, buf.bytes)
            .map_err(map_error)?;
        Ok(e.map(|(fd, rec)| (fd, rec.to_vec())))
    }

    fn window_import(&self, rank: u32, w: PeerWindow<'_>) -> Result<(), Error> {
        self.world
            .window_import(rank, w.peer, w.fd, w.record)
            .map_err(map_error)
    }

    fn window_publish(&self, _rank: u32, record: &[u8]) -> Result<(), Error> {
        self.world.window_publish(record).map_err(map_error)
    }

    fn window_retire(&self, _rank: u32, buf: RawBuf) {
        self.world.window_retire(buf.addr);
    }

    fn chunk_bytes(&self) -> usize {
        self.world.slot_bytes()
    }

    fn max_channels(&self) -> u32 {
        self.world.max_channels()
    }

    fn link_memory(&self) -> Option<oxccl_topo::policy::LinkMemory> {
        Some(self.world.link_memory())
    }

    fn copy_engines(&self) -> bool {
        self.world.copy_engine_usable()
    }

    fn launch_counts(&self) -> Option<super::LaunchCounts> {
        Some(super::LaunchCounts {
            kernels: self.world.kernel_launches(),
            copy_engine_calls: self.world.copy_engine_calls(),
            oneshot_ll_calls: self.world.oneshot_ll_calls(),
        })
    }

    fn oneshot_ll_bytes(&self) -> usize {
        self.world.oneshot_ll_bytes()
    }

    fn oneshot_ll_priced(&self) -> bool {
        // A launch and one exchange of LL lines, where the executor's
        // one-shot pays its plan's entry and exit synchronisation.
        true
    }

    fn protocols(&self) -> &'static [oxccl_core::Proto] {
        &[oxccl_core::Proto::Simple, oxccl_core::Proto::LL]
    }

    fn prepare_plan(&self, plan: &Plan, elem_size: usize, proto: Proto) -> PreparedPlan {
        // Every rank's upload (blob, connections, semaphores, scratch) now,
        // so no launch of this plan allocates or copies synchronously.
        let mine = |r: u32| self.procs.as_ref().is_none_or(|p| p.me == r);
        let ll1_count = plan
            .coll
            .filter(|c| {
                plan.algo == oxccl_core::Algo::OneShotLl
                    && c.kind == oxccl_core::CollKind::AllReduce
            })
            .map(|c| c.count);
        let uploads = plan
            .ranks
            .iter()
            .map(|rp| {
                mine(rp.rank)
                    .then(|| {
                        // Copy-engine plans run as copies with no kernel
                        // where the world can (else on the executor).
                        if plan.algo == oxccl_core::Algo::CopyEngine {
                            self.world.prepare_copies(rp, elem_size, proto)
                        } else if let Some(count) = ll1_count {
                            // The one-step LL AllReduce where the world
                            // serves it (else the plan, the FIFO one-shot).
                            self.world.prepare_oneshot_ll(rp, elem_size, proto, count)
                        } else {
                            self.world.prepare_proto(rp, elem_size, proto)
                        }
                    })
                    .transpose()
            })
            .collect::<Result<Vec<Option<Arc<Prepared>>>, CudaError>>()
            .map_err(map_error)?;
        Ok(Some(Arc::new(Uploads(uploads))))
    }

    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        let n = launch.plan.bufs.len();
        if n > MAX_BUFS || launch.bufs.len() != n {
            return Err(Error::Internal(format!(
                "{} buffer addresses for a plan with {n} buffers (at most {MAX_BUFS})",
                launch.bufs.len()
            )));
        }
        let mut bufs = [0u64; MAX_BUFS];
        for (slot, (d, r)) in bufs
            .iter_mut()
            .zip(launch.plan.bufs.iter().zip(launch.bufs))
        {
            if d.role != BufRole::Scratch {
                *slot = r.addr;
            }
        }
        let w = &self.world;
        // A cached plan's upload comes with the launch (no hashing or
        // comparing the plan per call); plans made per call (groups) go
        // through the world's own cache.
        let cached = launch
            .handle
            .and_then(|h| h.downcast_ref::<Uploads>())
            .and_then(|u| u.0.get(launch.rank as usize))
            .and_then(Option::as_ref)
            .filter(|p| p.proto() == launch.proto);
        let made;
        let p: &Prepared = match cached {
            Some(p) => p,
            None => {
                made = w
                    .prepare_proto(launch.plan, launch.dtype.size(), launch.proto)
                    .map_err(map_error)?;
                &made
            }
        };
        // A Send/Recv-only plan is launched by the ranks it names alone.
        let party = if launch.p2p_only {
            Party::Peers(p.peers())
        } else {
            Party::All
        };
        // Peers' allocations shared for this call, mapped ahead of the
        // kernel on this rank's stream.
        if let Some(procs) = &self.procs {
            procs.exports.import_new(w);
        }
        // SAFETY: the caller guarantees (trait contract) every non-scratch
        // buffer is device memory of this rank valid until the stream
        // reaches the kernel; the facade only picks plans with remote steps
        // for buffers every rank can address: from `alloc`, registered, or
        // shared for the call (`share_external`).
        // A plan run as copies writes no step stamps.
        let traced = launch
            .steps
            .filter(|_| !p.sm_free() && !p.oneshot_ll())
            .and_then(|sink| super::cuda_trace::buffer(w, p, launch.rank).map(|m| (sink, m)));
        let trace = traced.as_ref().map_or(0, |(_, m)| m.dev_ptr);
        // SAFETY: as above; `trace` is 0 or stamp memory of the plan's
        // size that lives until the stamps were read (or for ever).
        let r = unsafe {
            w.launch(
                p,
                launch.rank,
                &bufs[..n],
                launch.dtype,
                launch.op,
                party,
                trace,
            )
        }
        .map_err(map_error);
        match (traced, &r) {
            (Some((sink, mem)), Ok(())) => {
                let later = super::cuda_trace::later(mem, p, launch.plan, launch.rank);
                sink.later.lock().push(later);
            }
            // A failed launch may still have reached the stream (a gate's
            // wait failed after it): the kernel may write there, so the
            // memory is never freed.
            (Some((_, mem)), Err(_)) => std::mem::forget(mem),
            (None, _) => {}
        }
        r
    }

    fn alloc(&self, rank: u32, bytes: usize) -> Result<RawBuf, Error> {
        let addr = self.world.alloc(rank, bytes).map_err(map_error)?;
        Ok(RawBuf { addr, bytes })
    }

    unsafe fn free(&self, rank: u32, buf: RawBuf) {
        // An error means the buffer is not ours (nothing to release) or
        // its release could not be ordered (the world keeps it unused).
        if let Err(e) = self.world.free(rank, buf.addr) {
            tracing::warn!(rank, error = %e, "oxccl: a buffer was not returned to the pool");
        }
    }

    unsafe fn write(&self, rank: u32, dst: RawBuf, src: &[u8]) -> Result<(), Error> {
        let s = self.world.stream(rank).map_err(map_error)?;
        // SAFETY: `dst` lies in memory from `alloc` with room for `src`
        // (caller's contract).
        unsafe { s.write_sync(dst.addr, src) }.map_err(map_error)
    }

    unsafe fn read(&self, rank: u32, src: RawBuf, dst: &mut [u8]) -> Result<(), Error> {
        let s = self.world.stream(rank).map_err(map_error)?;
        // SAFETY: `src` lies in memory from `alloc` holding `dst.len()`
        // bytes (caller's contract).
        unsafe { s.read_sync(src.addr, dst) }.map_err(map_error)
    }

    fn synchronize(&self, rank: u32) -> Result<(), Error> {
        self.world.synchronize(rank).map_err(|e| self.explain(e))
    }

    unsafe fn follow_stream(&self, rank: u32, stream: RawStream) -> Result<(), Error> {
        // SAFETY: the caller vouches for the handle (trait contract).
        unsafe { self.world.follow_stream(rank, stream.0) }.map_err(map_error)
    }

    unsafe fn release_stream(&self, rank: u32, stream: RawStream) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { self.world.release_stream(rank, stream.0) }.map_err(map_error)
    }

    fn check_external(&self, rank: u32, buf: RawBuf) -> Result<(), Error> {
        self.world
            .check_external(rank, buf.addr, buf.bytes)
            .map_err(map_error)
    }

    fn abort(&self, why: &str) {
        self.why.lock().get_or_insert_with(|| why.to_string());
        self.world.abort();
    }

    fn failure(&self) -> Option<Error> {
        self.world.failure().map(|e| self.explain(e))
    }

    fn completion(&self, rank: u32) -> Result<Box<dyn Completion>, Error> {
        let ev = self.world.event(rank).map_err(map_error)?;
        let s = self.world.stream(rank).map_err(map_error)?;
        ev.record(s).map_err(map_error)?;
        Ok(Box::new(CudaCompletion(ev)))
    }

    fn probe(&self, rank: u32) -> Result<Option<Box<dyn Completion>>, Error> {
        // An event recorded on a stream being captured would become a node
        // of the caller's graph: such a rank is looked at later.
        if self
            .world
            .stream(rank)
            .map_err(map_error)?
            .capturing()
            .map_err(map_error)?
        {
            return Ok(None);
        }
        self.completion(rank).map(Some)
    }

    fn watchdog_thread(&self) {
        if let Err(e) = oxccl_cuda::driver::relax_capture_mode() {
            tracing::debug!(error = %e, "oxccl: the watchdog thread keeps the default capture mode");
        }
    }

    fn timer(&self, rank: u32) -> Result<Box<dyn Timer>, Error> {
        let mut t = CudaTimer {
            world: self.world.clone(),
            rank,
            events: Vec::new(),
            marks: 0,
            laps: Vec::new(),
        };
        t.reserve(1)?;
        Ok(Box::new(t))
    }

    fn rank_devices(&self) -> Option<Vec<i32>> {
        Some(self.world.config().devices.clone())
    }

    fn device_bytes(&self) -> u64 {
        self.world.held_bytes()
    }

    fn busiest_memory_ranks(&self) -> Option<u32> {
        let devs = &self.world.config().devices;
        devs.iter()
            .map(|d| devs.iter().filter(|&x| x == d).count() as u32)
            .max()
    }

    fn copy_bandwidth(&self, bytes: usize) -> Result<f64, Error> {
        let secs = self
            .world
            .time_copy(self.any_rank(), bytes.max(1), 10)
            .map_err(map_error)?;
        Ok(bytes as f64 / secs.max(1e-12) / 1e9)
    }
}

/// An event recorded on one rank's stream.
#[derive(Debug)]
struct CudaCompletion(Event);

impl Completion for CudaCompletion {
    fn is_done(&mut self) -> Result<bool, Error> {
        self.0.query().map_err(map_error)
    }
    fn wait(&mut self) -> Result<(), Error> {
        self.0.synchronize().map_err(map_error)
    }
}

/// Device-event timer on one rank's stream: one event per mark, made
/// ahead by `reserve` or, failing that, at the mark.
#[derive(Debug)]
struct CudaTimer {
    world: Arc<World>,
    rank: u32,
    events: Vec<Event>,
    /// Marks recorded since `start` (0: not started).
    marks: usize,
    laps: Vec<Duration>,
}

impl CudaTimer {
    fn mark(&mut self) -> Result<(), Error> {
        self.reserve(self.marks)?;
        let s = self.world.stream(self.rank).map_err(map_error)?;
        self.events[self.marks].record(s).map_err(map_error)?;
        self.marks += 1;
        Ok(())
    }
}

impl Timer for CudaTimer {
    fn start(&mut self) -> Result<(), Error> {
        self.marks = 0;
        self.laps.clear();
        self.mark()
    }

    fn lap(&mut self) -> Result<(), Error> {
        if self.marks == 0 {
            return Err(super::not_started());
        }
        self.mark()
    }

    fn stop(&mut self) -> Result<Duration, Error> {
        if self.marks == 0 {
            return Err(super::not_started());
        }
        self.mark()?;
        let marks = std::mem::take(&mut self.marks);
        self.events[marks - 1].synchronize().map_err(map_error)?;
        let ms = |a: &Event, b: &Event| -> Result<Duration, Error> {
            let ms = b.elapsed_since(a).map_err(map_error)?;
            Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
        };
        self.laps = self.events[..marks]
            .windows(2)
            .map(|w| ms(&w[0], &w[1]))
            .collect::<Result<_, _>>()?;
        ms(&self.events[0], &self.events[marks - 1])
    }

    fn laps(&self) -> &[Duration] {
        &self.laps
    }

    fn reserve(&mut self, laps: usize) -> Result<(), Error> {
        while self.events.len() < laps + 1 {
            self.events
                .push(self.world.event(self.rank).map_err(map_error)?);
        }
        Ok(())
    }
}
