//! The CUDA backend's part of the step trace (`OXCCL_TRACE`): a traced
//! launch gets a device buffer where the kernel's thread 0 of each block
//! writes every step's `%globaltimer` start and end (`OxDesc::trace`;
//! untraced launches pass 0 and the kernel only tests it); after the
//! launch the rank's stream is drained, the stamps are read back and
//! become step records named from the plan. A signal or wait run that the
//! kernel does as one phase gives each of its steps the run's stamps. The
//! trace therefore serialises each traced call with the host; only the
//! first calls (`OXCCL_TRACE_CALLS`) are traced.

use oxccl_core::plan::RankPlan;
use oxccl_core::trace::{describe, Stamp, StepRecord};
use oxccl_cuda::{Prepared, World};
use parking_lot::Mutex;

/// A zeroed stamp buffer for `p` on `rank`'s device; `None` where none
/// can be had now (during graph capture, say): the call runs untraced.
pub(super) fn buffer(w: &World, p: &Prepared, rank: u32) -> Option<u64> {
    let bytes = p.trace_bytes();
    (bytes > 0).then(|| w.alloc(rank, bytes).ok()).flatten()
}

/// Waits for the traced launch, reads its stamps into `sink` and frees the
/// buffer. A failure loses the call's device steps, nothing else.
pub(super) fn collect(
    w: &World,
    p: &Prepared,
    plan: &RankPlan,
    rank: u32,
    buf: u64,
    sink: &Mutex<Vec<StepRecord>>,
) {
    let mut bytes = vec![0u8; p.trace_bytes()];
    let read = w.stream(rank).and_then(|s| {
        // SAFETY: `buf` is device memory of `trace_bytes` bytes from
        // `buffer`, which the kernel stops writing before the stream
        // passes it (read_sync drains the stream first).
        unsafe { s.read_sync(buf, &mut bytes) }
    });
    let _ = w.free(rank, buf);
    if let Err(e) = read {
        tracing::warn!(
            rank,
            "oxccl: the step trace lost a call's device steps: {e}"
        );
        return;
    }
    let stamp = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let mut out = sink.lock();
    for (c, (first, n)) in p.channel_steps().enumerate() {
        for k in 0..n {
            let i = first + k;
            let (t0, t1) = (stamp(2 * i), stamp(2 * i + 1));
            if t1 == 0 {
                // Not reached (the kernel stopped early on a failure).
                continue;
            }
            let (name, peer) = plan
                .channels
                .get(c)
                .and_then(|ch| ch.steps.get(k))
                .map_or(("step", None), describe);
            out.push(StepRecord {
                channel: c as u32,
                step: k as u32,
                name,
                peer,
                waited: false,
                start: Stamp::Device(t0),
                end: Stamp::Device(t1),
            });
        }
    }
}
