//! Calls made on a caller's stream (NCCL's semantics for memory and
//! streams the application owns).
//!
//! A rank's kernels always run on the rank's own stream: the buffer
//! lifetimes (`memory`: a free's event on the rank's stream orders reuse),
//! the plan uploads and the error records all rely on one stream per rank.
//! A call on a caller's stream S is therefore a fork and a join around the
//! launch, with events and no host wait:
//!
//! 1. [`World::follow_stream`]: an event recorded on S, and the rank's
//!    stream waits for it, so the launch runs after S's earlier work;
//! 2. the launch, on the rank's stream, as for any call, gated (`gate`):
//!    it returns once the ranks it exchanges with have launched too, so
//!    the caller's later work on S (a copy of the result, which holds a
//!    driver lock while it waits for the kernel) is never queued, or
//!    waiting, while a peer this kernel spins for has yet to launch;
//! 3. [`World::release_stream`]: an event recorded on the rank's stream,
//!    and S waits for it, so S's later work runs after the launch.
//!
//! Under graph capture of S this is the usual fork/join pattern: step 1
//! draws the rank's stream into S's capture, the launch becomes a kernel
//! node, and step 3 joins it back, so `cuStreamEndCapture` on S sees no
//! unjoined work. Until S's capture ends, the rank's stream is capturing
//! too: what would wait on it (alloc, free, copies, `synchronize`) is
//! refused or fails there, as it must.
//!
//! When S is the rank's own stream both steps are skipped.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use cudarc::driver::sys::CUstream;

use crate::driver::{wait_event_raw, Event};
use crate::error::{CudaError, Result};

use super::{lock, World};

/// One rank's fork and join events, made at its first call on a caller's
/// stream. Each is recorded and waited on under the lock, so concurrent
/// calls on one rank (from several threads) never wait on a half-made
/// record; a wait snapshots the record it sees, so reuse is safe.
#[derive(Debug, Default)]
pub(super) struct Joins(Mutex<Option<(Event, Event)>>);

impl World {
    /// Makes `rank`'s work issued after this call wait for everything
    /// issued on `stream` before it (on the device; returns at once).
    ///
    /// # Safety
    /// `stream` must be a live stream handle of the rank's device's
    /// primary context (the context cudarc and the runtime API use), or a
    /// default-stream handle (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
    pub unsafe fn follow_stream(&self, rank: u32, stream: u64) -> Result<()> {
        let Some(s) = self.foreign(rank, stream)? else {
            return Ok(());
        };
        let st = self.rank(rank)?;
        self.with_joins(rank, |fork, _| {
            // SAFETY: `s` belongs to the rank's context (checked in
            // `foreign`; caller's contract that it is live).
            unsafe { fork.record_raw(s)? };
            st.stream.wait_event(fork)
        })?;
        // The launch until `release_stream` is gated: the caller's later
        // work on `s` may share a hardware queue with a peer's kernel.
        st.on_caller_stream.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Makes `stream`'s work issued after this call wait for everything
    /// issued on `rank` before it (on the device; returns at once).
    ///
    /// # Safety
    /// As [`World::follow_stream`].
    pub unsafe fn release_stream(&self, rank: u32, stream: u64) -> Result<()> {
        let Some(s) = self.foreign(rank, stream)? else {
            return Ok(());
        };
        let st = self.rank(rank)?;
        st.on_caller_stream.store(false, Ordering::Relaxed);
        self.with_joins(rank, |_, join| {
            join.record(&st.stream)?;
            // SAFETY: as in `follow_stream`.
            unsafe { wait_event_raw(s, join) }
        })
    }

    /// The caller's stream as a driver handle, `None` when it is the
    /// rank's own stream; an error when it belongs to another context.
    fn foreign(&self, rank: u32, stream: u64) -> Result<Option<CUstream>> {
        let st = self.rank(rank)?;
        let s = stream as usize as CUstream;
        if s == st.stream.raw {
            return Ok(None);
        }
        let dev = self.dev(rank)?;
        // SAFETY: the caller of `follow_stream`/`release_stream` vouches
        // for the handle.
        if !unsafe { dev.ctx.owns_stream(s)? } {
            return Err(CudaError::Invalid(format!(
                "stream {stream:#x} does not belong to the primary context of device {} \
                 (rank {rank}'s device): pass a stream created on that device's primary \
                 context (cudarc's CudaContext::new({}) or the runtime API)",
                dev.ctx.ordinal, dev.ctx.ordinal
            )));
        }
        Ok(Some(s))
    }

    fn with_joins(&self, rank: u32, f: impl FnOnce(&Event, &Event) -> Result<()>) -> Result<()> {
        let st = self.rank(rank)?;
        let mut j = lock(&st.joins.0);
        let pair = match j.take() {
            Some(p) => p,
            None => {
                let ctx = &self.dev(rank)?.ctx;
                (Event::ordering(ctx)?, Event::ordering(ctx)?)
            }
        };
        let r = f(&pair.0, &pair.1);
        *j = Some(pair);
        r
    }
}
