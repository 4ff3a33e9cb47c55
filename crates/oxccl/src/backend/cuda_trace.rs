//! The CUDA backend's part of the step trace (`OXCCL_TRACE`): a traced
//! launch gets page-locked host memory that the kernel's thread 0 of each
//! block writes every step's `%globaltimer` start and end into
//! (`OxDesc::trace`; untraced launches pass 0 and the kernel only tests
//! it). Nothing waits at the launch (a caller driving several ranks from
//! one thread must launch them all before any can finish): the stamps are
//! read when the trace is written, once every traced call was launched,
//! and become step records named from the plan. A signal or wait run that
//! the kernel does as one phase gives each of its steps the run's stamps.
//! Only the first calls (`OXCCL_TRACE_CALLS`) are traced.

use std::time::{Duration, Instant};

use oxccl_core::plan::RankPlan;
use oxccl_core::trace::{describe, Stamp, StepRecord};
use oxccl_cuda::driver::HostMapped;
use oxccl_cuda::{Prepared, World};

use super::LaterSteps;

/// The longest the trace's writer waits for a traced kernel's stamps.
const WAIT: Duration = Duration::from_secs(10);

/// Zeroed stamp memory for `p` on `rank`'s device; `None` where none can
/// be had: the call's device steps are then not traced.
pub(super) fn buffer(w: &World, p: &Prepared, rank: u32) -> Option<HostMapped> {
    let bytes = p.trace_bytes();
    (bytes > 0)
        .then(|| w.host_mapped(rank, bytes).ok())
        .flatten()
}

/// The records of a traced launch of `p` (rank plan `plan`), read from
/// `mem` when called.
pub(super) fn later(mem: HostMapped, p: &Prepared, plan: &RankPlan, rank: u32) -> LaterSteps {
    // (stamp index, channel, step, name, peer) per step, taken now.
    let mut steps = Vec::new();
    for (c, (first, n)) in p.channel_steps().enumerate() {
        for k in 0..n {
            let (name, peer) = plan
                .channels
                .get(c)
                .and_then(|ch| ch.steps.get(k))
                .map_or(("step", None), describe);
            steps.push((first + k, c as u32, k as u32, name, peer));
        }
    }
    Box::new(move || {
        let until = Instant::now() + WAIT;
        // Both stamps non-zero: the step's end (and start) arrived.
        let done = |i: usize| mem.load_u64(2 * i) != 0 && mem.load_u64(2 * i + 1) != 0;
        while !steps.iter().all(|s| done(s.0)) && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
        }
        let out: Vec<StepRecord> = steps
            .iter()
            .filter(|s| done(s.0))
            .map(|&(i, channel, step, name, peer)| StepRecord {
                channel,
                step,
                name,
                peer,
                waited: false,
                start: Stamp::Device(mem.load_u64(2 * i)),
                end: Stamp::Device(mem.load_u64(2 * i + 1)),
            })
            .collect();
        if out.len() < steps.len() {
            tracing::warn!(
                rank,
                "oxccl: the step trace has {} of a call's {} device steps (the kernel did not finish in {WAIT:?})",
                out.len(),
                steps.len()
            );
            // The kernel may still write there: never free it.
            std::mem::forget(mem);
        }
        out
    })
}
