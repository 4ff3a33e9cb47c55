//! CUDA ranks in processes that must not spin on each other:
//! each call's device buffers are staged through this rank's shared host
//! heap and the plan runs on the host backend across processes.
//!
//! Why: processes sharing one GPU without MPS are time-sliced, so two
//! processes' kernels spinning on each other's flags take 4.5 ms per round
//! trip (measured on the H200). Here no kernel ever waits for another
//! process: a call copies its buffers device to host on the rank's stream
//! (ordered after the rank's earlier work), runs the plan on the host
//! (shared-memory FIFOs, futex wake-ups, the peer watcher naming a lost
//! process), and copies the outputs back. It is correct with or without
//! MPS and on any number of GPUs; its cost is the copies over PCIe and the
//! host's reductions (the selector sees the host backend's costs, since
//! that is what runs the plan). A call blocks while its plan runs, like
//! the host backend's; its copies out are left queued on the rank's
//! stream, which the caller's stream then follows, as after a kernel.
//!
//! Staging: the call's non-scratch buffers are merged into spans
//! (in-place forms overlap, e.g. AllGather's input inside its output),
//! each span gets a staging area in the shared heap (kept and reused,
//! page-locked once), every span is copied in (an output's untouched bytes
//! must come back unchanged) with one wait for all of them, and the output
//! buffers are copied out. One wait per call, not two per copy: without
//! MPS a wait for the device can wait for another process's time slice.
//! Calls on a stream being captured into a graph run as graph nodes
//! instead (`cuda_staged_capture.rs`).

use std::sync::Arc;

use oxccl_core::plan::BufRole;
use oxccl_core::{Plan, Proto};
use oxccl_cuda::{World, WorldConfig};
use parking_lot::Mutex;

use super::cuda::map_error;
use super::cuda_staged_capture::{self as capture, Captured};
use super::cuda_staging::{self as staging, spans, Stage};
use super::{Backend, BackendKind, BackendOptions, Launch, PreparedPlan, RawBuf, Timer};
use crate::error::Error;

/// This process's rank as the world's only rank.
const ME: u32 = 0;

/// A CUDA rank whose collectives run through host staging.
#[derive(Debug)]
pub struct CudaStaged {
    host: Arc<dyn Backend>,
    world: Arc<World>,
    rank: u32,
    nranks: u32,
    device: i32,
    /// Ranks of the clique on this rank's GPU (this one included).
    on_device: u32,
    stages: Mutex<Vec<Stage>>,
    /// What calls captured into graphs keep until the backend drops.
    captured: Mutex<Captured>,
}

/// Creates the staged backend of this process's rank on `device`.
pub fn create(
    boot: &oxccl_bootstrap::Bootstrap,
    opts: &BackendOptions,
    device: i32,
    on_device: u32,
) -> Result<Arc<dyn Backend>, Error> {
    let mut cfg = WorldConfig::round_robin(1, 1, opts.deadline);
    opts.cuda.apply(&mut cfg);
    cfg.devices = vec![device];
    let world = World::new(cfg).map_err(map_error)?;
    let host = super::host::create_procs(boot, opts)?;
    Ok(Arc::new(CudaStaged {
        host,
        world,
        rank: boot.rank(),
        nranks: boot.nranks(),
        device,
        on_device,
        stages: Mutex::new(Vec::new()),
        captured: Mutex::new(Captured::default()),
    }))
}

impl CudaStaged {
    /// Staging areas of at least the spans' sizes (grown as needed).
    fn grow(&self, st: &mut Vec<Stage>, spans: &[(u64, u64)]) -> Result<Vec<RawBuf>, Error> {
        let ctx = self.world.stream(ME).map_err(map_error)?.ctx().clone();
        for (i, &(s, e)) in spans.iter().enumerate() {
            let need = (e - s) as usize;
            if st.get(i).is_some_and(|g| g.buf.bytes >= need) {
                continue;
            }
            let stage = Stage::new(&self.host, self.rank, &ctx, need.next_power_of_two())?;
            if i < st.len() {
                // The previous call's copies out of the old area may not
                // have run yet.
                self.world.synchronize(ME).map_err(map_error)?;
                let old = std::mem::replace(&mut st[i], stage);
                // SAFETY: no call uses the old area any more (calls hold
                // the `stages` lock).
                unsafe { old.free(&*self.host, self.rank) };
            } else {
                st.push(stage);
            }
        }
        Ok(st.iter().map(|g| g.buf).collect())
    }
}

impl Backend for CudaStaged {
    fn device_bytes(&self) -> u64 {
        self.world.held_bytes()
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_of(&self, rank: u32) -> Option<i32> {
        (rank == self.rank).then_some(self.device)
    }

    fn describe(&self) -> String {
        format!(
            "cuda, rank {} of {} processes on device {} ({} here), staged through host memory \
             ({}; {})",
            self.rank,
            self.nranks,
            self.device,
            self.on_device,
            self.host.describe(),
            self.world.describe()
        )
    }

    fn blocking(&self) -> bool {
        true
    }

    unsafe fn follow_stream(&self, _rank: u32, stream: super::RawStream) -> Result<(), Error> {
        // The staging copies run on the world's stream: they must follow
        // the caller's earlier work there. Nothing to release: the call
        // is complete (outputs copied back) before it returns.
        // SAFETY: the caller vouches for the handle (trait contract).
        unsafe { self.world.follow_stream(ME, stream.0) }.map_err(map_error)
    }

    unsafe fn release_stream(&self, _rank: u32, stream: super::RawStream) -> Result<(), Error> {
        // An eager call is complete already; a captured one left its nodes
        // on the world's stream, which the capture must join back.
        // SAFETY: the caller vouches for the handle (trait contract).
        unsafe { self.world.release_stream(ME, stream.0) }.map_err(map_error)
    }

    fn reads_device_scalars(&self) -> bool {
        // Read by `execute` (eager) or by a captured call's copy at each
        // replay, then handed to the host plan as a value.
        true
    }

    fn registered_alloc(&self) -> bool {
        // Peers never address this rank's device memory.
        false
    }

    fn registered_external(&self) -> bool {
        // Peers reach only each other's host heaps: a registration of the
        // caller's device memory is accepted and changes nothing.
        false
    }

    fn check_external(&self, _rank: u32, buf: RawBuf) -> Result<(), Error> {
        // Still the caller's device memory on this rank's device, as NCCL
        // checks; the world holds this device only, so no peer is asked.
        self.world
            .check_external(ME, buf.addr, buf.bytes)
            .map_err(map_error)
    }

    fn chunk_bytes(&self) -> usize {
        self.host.chunk_bytes()
    }

    fn max_channels(&self) -> u32 {
        self.host.max_channels()
    }

    fn protocols(&self) -> &'static [Proto] {
        self.host.protocols()
    }

    fn prepare_plan(&self, plan: &Plan, elem_size: usize, proto: Proto) -> PreparedPlan {
        self.host.prepare_plan(plan, elem_size, proto)
    }

    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        let live: Vec<RawBuf> = launch
            .plan
            .bufs
            .iter()
            .zip(launch.bufs)
            .map(|(d, b)| {
                if d.role == BufRole::Scratch {
                    RawBuf::NULL
                } else {
                    *b
                }
            })
            .collect();
        let spans = spans(&live);
        let s = self.world.stream(ME).map_err(map_error)?;
        if s.capturing().map_err(map_error)? {
            let call = capture::Call {
                host: &self.host,
                rank: self.rank,
                launch,
                live: &live,
                spans: &spans,
            };
            // SAFETY: the caller's contract (trait) covers every replay.
            return unsafe { capture::capture(s, &mut self.captured.lock(), call) };
        }
        // Held for the whole call: the staging areas are this call's. A
        // PreMulSum scalar in device memory gets an 8-byte area after the
        // spans' (the host plan is handed its value).
        let mut guard = self.stages.lock();
        let scalar = launch.op.pre_scale_at;
        let mut want = spans.clone();
        if scalar.is_some() {
            want.push((0, 8));
        }
        let stages = self.grow(&mut guard, &want)?;
        // Every copy in, then one wait: without MPS each wait for the
        // device may wait for a time slice of another process's context,
        // so a call waits once, not once per copy.
        for (&(lo, hi), st) in spans.iter().zip(&stages) {
            // SAFETY: the span lies in the caller's device buffers (trait
            // contract), valid for the call; the page-locked area holds
            // `hi - lo` bytes, used by nothing else while `guard` is held
            // (the previous call's copies out of it come first on `s`).
            unsafe { s.copy_async(st.addr, lo, (hi - lo) as usize) }.map_err(map_error)?;
        }
        // The scalar's cell: the area after the spans' (`want`).
        let cell = scalar.zip(stages.get(spans.len()).map(|c| c.addr));
        if let Some((at, cell)) = cell {
            // SAFETY: one element of the call's type in device memory the
            // caller keeps valid (raw call contract); the cell holds 8 bytes.
            unsafe { s.copy_async(cell, at, launch.dtype.size()) }.map_err(map_error)?;
        }
        s.synchronize().map_err(map_error)?;
        let op = match cell {
            // SAFETY: the cell's 8 bytes, written by the copy just waited for.
            Some((_, cell)) => unsafe { capture::with_scale_in(launch.op, launch.dtype, cell) },
            None => *launch.op,
        };
        let launch = &Launch { op: &op, ..*launch };
        let bases: Vec<u64> = stages.iter().map(|b| b.addr).collect();
        let staged = staging::staged(&live, &spans, &bases[..spans.len()]);
        let hl = Launch {
            bufs: &staged,
            ..*launch
        };
        // SAFETY: every staged buffer is heap memory of this process of the
        // original's length, laid out (and aliased) as the originals are.
        unsafe { self.host.execute(&hl)? };
        // The copies out are enqueued, not waited for: the caller's stream
        // follows them (`release_stream`), and the next call's copies into
        // the same areas follow them on `s`.
        for ((d, b), h) in launch.plan.bufs.iter().zip(&live).zip(&staged) {
            if d.role != BufRole::Output || b.bytes == 0 {
                continue;
            }
            // SAFETY: `b` is the caller's device buffer (trait contract);
            // `h` holds `b.bytes` bytes of page-locked staging, unchanged
            // until the next call, which waits for `s` before writing it.
            unsafe { s.copy_async(b.addr, h.addr, b.bytes) }.map_err(map_error)?;
        }
        drop(guard);
        Ok(())
    }

    fn alloc(&self, _rank: u32, bytes: usize) -> Result<RawBuf, Error> {
        let addr = self.world.alloc(ME, bytes).map_err(map_error)?;
        Ok(RawBuf { addr, bytes })
    }

    unsafe fn free(&self, _rank: u32, buf: RawBuf) {
        if let Err(e) = self.world.free(ME, buf.addr) {
            tracing::warn!(rank = self.rank, error = %e, "oxccl: a buffer was not returned to the pool");
        }
    }

    unsafe fn write(&self, _rank: u32, dst: RawBuf, src: &[u8]) -> Result<(), Error> {
        let s = self.world.stream(ME).map_err(map_error)?;
        // SAFETY: `dst` lies in memory from `alloc` with room for `src`.
        unsafe { s.write_sync(dst.addr, src) }.map_err(map_error)
    }

    unsafe fn read(&self, _rank: u32, src: RawBuf, dst: &mut [u8]) -> Result<(), Error> {
        let s = self.world.stream(ME).map_err(map_error)?;
        // SAFETY: `src` lies in memory from `alloc` holding `dst.len()` bytes.
        unsafe { s.read_sync(src.addr, dst) }.map_err(map_error)
    }

    fn synchronize(&self, _rank: u32) -> Result<(), Error> {
        self.world.synchronize(ME).map_err(map_error)
    }

    fn abort(&self, why: &str) {
        self.host.abort(why);
        self.world.abort();
    }

    fn failure(&self) -> Option<Error> {
        self.host
            .failure()
            .or_else(|| self.world.failure().map(map_error))
    }

    fn timer(&self, _rank: u32) -> Result<Box<dyn Timer>, Error> {
        // Calls block until their copies and the host plan are done.
        Ok(Box::<super::WallTimer>::default())
    }

    fn busiest_memory_ranks(&self) -> Option<u32> {
        Some(self.on_device)
    }

    fn stream_bandwidth(&self, bytes: usize) -> Option<Result<f64, Error>> {
        // Staged ranks talk through the host backend.
        self.host.stream_bandwidth(bytes)
    }

    fn net_placement(&self) -> Option<oxccl_topo::NetPlacement> {
        // The plans run on the host backend, over its transport.
        self.host.net_placement()
    }

    fn copy_bandwidth(&self, bytes: usize) -> Result<f64, Error> {
        let secs = self
            .world
            .time_copy(ME, bytes.max(1), 10)
            .map_err(map_error)?;
        Ok(bytes as f64 / secs.max(1e-12) / 1e9)
    }
}

impl Drop for CudaStaged {
    fn drop(&mut self) {
        // The last eager call's copies out of the staging areas may still
        // be queued: they finish before the areas are unpinned. No replay
        // runs any more (the communicator is gone).
        if let Err(e) = self.world.synchronize(ME) {
            tracing::warn!(rank = self.rank, error = %e, "oxccl: staged copies did not finish");
        }
        self.captured.get_mut().release(&*self.host, self.rank);
    }
}
