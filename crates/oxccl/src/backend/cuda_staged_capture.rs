//! Staged calls captured into a CUDA graph (`cudaStreamBeginCapture`,
//! nccl-tests `-G`, `torch.cuda.graph`).
//!
//! An eager staged call copies with host waits, which a capture forbids.
//! Captured, the same call becomes three kinds of graph nodes on the
//! rank's stream (joined to the caller's by [`super::Backend::follow_stream`]
//! and `release_stream`): copies of every span device to host, a host
//! node that runs the plan on the host backend, and copies of the outputs
//! back. Every replay runs all three in order, so the host node sees the
//! buffers as they are at that replay.
//!
//! Each captured call gets staging areas of its own, never the eager
//! calls' (a replay runs on the driver's host thread, maybe while the
//! rank's thread runs an eager call), and its host job: both are kept
//! until the backend drops, since the caller may replay the graph any time
//! until it destroys the communicator (as with NCCL, a graph must not be
//! replayed after that).
//!
//! A PreMulSum scalar in device memory (`ncclScalarDevice`) is copied
//! into a page-locked cell of the call's own before the host node, which
//! hands the host plan the value of that replay.
//!
//! A host node cannot report an error: a plan that fails in one aborts the
//! clique with the reason, so every rank's next call fails naming it.

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use oxccl_core::plan::{BufRole, RankPlan};
use oxccl_core::{DataType, LoweredOp, Proto};
use oxccl_cuda::driver::Stream;

use super::cuda::map_error;
use super::cuda_staging::{staged, Stage};
use super::{Backend, Launch, PlanHandle, RawBuf};
use crate::error::Error;

/// What a captured call's host node runs at each replay.
#[derive(Debug)]
pub(super) struct HostJob {
    host: Arc<dyn Backend>,
    rank: u32,
    plan: RankPlan,
    /// The plan's buffers, staged (scratch ones `RawBuf::NULL`).
    bufs: Vec<RawBuf>,
    dtype: DataType,
    op: LoweredOp,
    proto: Proto,
    handle: Option<PlanHandle>,
    p2p_only: bool,
    /// Where the replay's copy left a device scalar's bytes.
    scalar: Option<u64>,
}

impl HostJob {
    fn run(&self) -> Result<(), Error> {
        let op = match self.scalar {
            // SAFETY: an 8-byte page-locked cell of this job's areas,
            // written by the copy this node follows.
            Some(cell) => unsafe { with_scale_in(&self.op, self.dtype, cell) },
            None => self.op,
        };
        let l = Launch {
            rank: self.rank,
            plan: &self.plan,
            bufs: &self.bufs,
            dtype: self.dtype,
            op: &op,
            proto: self.proto,
            handle: self.handle.as_ref(),
            p2p_only: self.p2p_only,
            steps: None,
        };
        // SAFETY: every staged buffer is page-locked heap memory of this
        // process kept with the job (`Captured`), laid out as the
        // originals; the graph's copies in finished before this node runs
        // and the copies out start after it returns.
        unsafe { self.host.execute(&l) }
    }
}

/// `op` with its device scalar replaced by the value a copy left in
/// `cell` (little-endian, one element of `dtype`).
///
/// # Safety
/// `cell` is 8 bytes of host memory, which the copy has finished writing.
pub(super) unsafe fn with_scale_in(op: &LoweredOp, dtype: DataType, cell: u64) -> LoweredOp {
    // SAFETY: the caller's contract.
    let word = unsafe { std::ptr::read_volatile(cell as usize as *const [u8; 8]) };
    let v = oxccl_core::with_dtype!(dtype, T => {
        // SAFETY: `word` holds at least one `T` (at most 8 bytes); read
        // unaligned.
        let x: T = unsafe { std::ptr::read_unaligned(word.as_ptr().cast::<T>()) };
        oxccl_core::Element::to_f64(x)
    });
    LoweredOp {
        pre_scale: Some(v),
        pre_scale_at: None,
        ..*op
    }
}

/// The host node's entry: runs the job; a failure or a panic aborts the
/// clique (a host node has no way to return an error, and must not
/// unwind into the driver).
unsafe extern "C" fn run_job(data: *mut c_void) {
    // SAFETY: `data` is a `HostJob` kept by its backend
    // (`Captured::jobs`) until the backend drops, after every replay.
    let job = unsafe { &*(data as *const HostJob) };
    let why = match std::panic::catch_unwind(AssertUnwindSafe(|| job.run())) {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("a graph-captured call failed on rank {}: {e}", job.rank),
        Err(_) => format!("a graph-captured call panicked on rank {}", job.rank),
    };
    tracing::error!(rank = job.rank, "oxccl: {why}");
    job.host.abort(&why);
}

/// What captured calls keep alive: their staging areas and host jobs.
#[derive(Debug, Default)]
pub(super) struct Captured {
    areas: Vec<Stage>,
    /// Shared, not boxed, only for a stable address the graph holds.
    jobs: Vec<Arc<HostJob>>,
}

impl Captured {
    /// Returns every staging area to `host` (the jobs hold no memory of
    /// their own). Only once no replay can run: the backend's drop.
    pub(super) fn release(&mut self, host: &dyn Backend, rank: u32) {
        self.jobs.clear();
        for a in self.areas.drain(..) {
            // SAFETY: no replay runs any more (the communicator is gone).
            unsafe { a.free(host, rank) };
        }
    }
}

/// The pieces of one staged call that [`capture`] needs.
pub(super) struct Call<'a> {
    pub host: &'a Arc<dyn Backend>,
    pub rank: u32,
    pub launch: &'a Launch<'a>,
    /// The plan's buffers as the caller passed them (scratch ones NULL).
    pub live: &'a [RawBuf],
    /// Non-overlapping spans covering `live`, in address order.
    pub spans: &'a [(u64, u64)],
}

/// A new staging area of `bytes` bytes, kept in `cap`; its address.
fn pinned_area(
    s: &Stream,
    cap: &mut Captured,
    host: &Arc<dyn Backend>,
    rank: u32,
    bytes: usize,
) -> Result<u64, Error> {
    let st = Stage::new(host, rank, s.ctx(), bytes)?;
    let addr = st.buf.addr;
    cap.areas.push(st);
    Ok(addr)
}

/// Enqueues `call` on `s`, a stream being captured: copies in, the host
/// node, copies out. Nothing runs now.
///
/// # Safety
/// As [`Backend::execute`] for `call.launch`'s buffers, at every replay
/// of the graph.
pub(super) unsafe fn capture(s: &Stream, cap: &mut Captured, call: Call<'_>) -> Result<(), Error> {
    let first = cap.areas.len();
    for &(lo, hi) in call.spans {
        pinned_area(s, cap, call.host, call.rank, (hi - lo) as usize)?;
    }
    let areas = &cap.areas[first..];
    let bases: Vec<u64> = areas.iter().map(|a| a.buf.addr).collect();
    let staged = staged(call.live, call.spans, &bases);
    for (&(lo, hi), a) in call.spans.iter().zip(areas) {
        // SAFETY: the span lies in the caller's device buffers (valid at
        // every replay: the caller's contract) and the area holds it.
        unsafe { s.copy_async(a.buf.addr, lo, (hi - lo) as usize) }.map_err(map_error)?;
    }
    let l = call.launch;
    let scalar = match l.op.pre_scale_at {
        Some(at) => {
            let cell = pinned_area(s, cap, call.host, call.rank, 8)?;
            // SAFETY: the scalar is one element in device memory valid at
            // every replay (the caller's contract); the cell holds 8 bytes.
            unsafe { s.copy_async(cell, at, l.dtype.size()) }.map_err(map_error)?;
            Some(cell)
        }
        None => None,
    };
    let job = Arc::new(HostJob {
        host: call.host.clone(),
        rank: call.rank,
        plan: l.plan.clone(),
        bufs: staged.clone(),
        dtype: l.dtype,
        op: *l.op,
        proto: l.proto,
        handle: l.handle.cloned(),
        p2p_only: l.p2p_only,
        scalar,
    });
    let data = Arc::as_ptr(&job) as *mut c_void;
    cap.jobs.push(job);
    // SAFETY: the job stays in `cap` until `release` (after every
    // replay); `run_job` calls no CUDA and catches panics.
    unsafe { s.host_fn(run_job, data) }.map_err(map_error)?;
    for ((d, b), h) in l.plan.bufs.iter().zip(call.live).zip(&staged) {
        if d.role != BufRole::Output || b.bytes == 0 {
            continue;
        }
        // SAFETY: as the copies in.
        unsafe { s.copy_async(b.addr, h.addr, b.bytes) }.map_err(map_error)?;
    }
    Ok(())
}
