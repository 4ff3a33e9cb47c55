//! Shared test support: run a plan on a host fabric, one thread per rank.
#![allow(dead_code)] // reason: each test binary uses a different subset of these helpers

use std::sync::Arc;
use std::time::Duration;

use oxccl_core::interp;
use oxccl_core::plan::{BufRole, Plan, Rank};
use oxccl_core::{generate, testkit, CoreError, Element, PlanRequest, RedOp};
use oxccl_host::{ExecStats, HostBuf, HostConfig, HostError, HostFabric};

/// A config with small slots, so modest counts pipeline through many
/// messages and wrap the FIFOs, and a deadline that turns a hang into a
/// failure well within the test's run time.
pub fn small_config(slot_bytes: usize) -> HostConfig {
    HostConfig {
        deadline: Duration::from_secs(60),
        slots: 2,
        slot_bytes,
        spin: 16,
        ..HostConfig::default()
    }
}

/// One rank's result: its output buffer and stats, or the error.
pub type RankResult<T> = Result<(Vec<T>, ExecStats), HostError>;

/// Where each rank's fabric comes from: one shared by every rank (threads
/// of one process), or one per rank (`fabs[rank]`, as ranks in processes).
pub trait Fabrics: Sync {
    fn of(&self, rank: Rank) -> &Arc<HostFabric>;
}

impl Fabrics for &Arc<HostFabric> {
    fn of(&self, _: Rank) -> &Arc<HostFabric> {
        self
    }
}

impl Fabrics for &[Arc<HostFabric>] {
    fn of(&self, rank: Rank) -> &Arc<HostFabric> {
        &self[rank as usize]
    }
}

/// Runs `plan` on `fabs` with one thread per rank (ranks in `absent` never
/// call), each rank's memory laid out as the interpreter lays it out
/// (`in_place`: input and output share an arena at the collective's
/// offsets). Returns every rank's output buffer.
pub fn run_plan<T: Element>(
    fabs: impl Fabrics,
    plan: &Plan,
    inputs: &[Vec<T>],
    in_place: bool,
    op: &oxccl_core::LoweredOp,
    absent: &[Rank],
) -> Vec<Option<RankResult<T>>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = plan
            .ranks
            .iter()
            .zip(interp::memories(plan, inputs, in_place))
            .map(|(rp, mut mem)| {
                let skip = absent.contains(&rp.rank);
                let fab = fabs.of(rp.rank).clone();
                s.spawn(move || {
                    if skip {
                        return None;
                    }
                    let bases: Vec<*mut T> =
                        mem.arenas.iter_mut().map(|a| a.as_mut_ptr()).collect();
                    let bufs: Vec<HostBuf> = rp
                        .bufs
                        .iter()
                        .zip(&mem.views)
                        .filter(|(d, _)| d.role != BufRole::Scratch)
                        .map(|(_, v)| HostBuf {
                            // SAFETY: views lie inside their arenas.
                            ptr: unsafe { bases[v.arena].add(v.off) }.cast(),
                            bytes: v.len * size_of::<T>(),
                        })
                        .collect();
                    // SAFETY: the buffers point into `mem`, which this thread
                    // owns and does not touch until `execute` returns.
                    let res = unsafe { fab.execute(rp, &bufs, T::DTYPE, op) };
                    let out = rp
                        .bufs
                        .iter()
                        .position(|b| b.role == BufRole::Output)
                        .map(|i| mem.read_buf(oxccl_core::plan::BufId(i as u16)))
                        .unwrap_or_default();
                    Some(res.map(|st| (out, st)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// What [`check_request`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    Ran,
    Unsupported,
}

/// The one test body: generates `req`, runs it on `fab` with inputs from
/// `testkit::input`, and compares every output with the sequential
/// reference. `Unsupported` requests are skipped (and say so).
pub fn check_request<T: Element>(
    fab: &Arc<HostFabric>,
    req: &PlanRequest,
    op: RedOp,
    seed: u64,
) -> Result<Checked, String> {
    let plan = match generate(req) {
        Ok(p) => p,
        Err(CoreError::Unsupported { .. }) => return Ok(Checked::Unsupported),
        Err(e) => return Err(format!("{req:?}: generate: {e}")),
    };
    let n = req.nranks;
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input(&req.coll, n, r, op, seed))
        .collect();
    let lowered = op.lower(T::DTYPE, n);
    let results = run_plan(fab, &plan, &inputs, req.in_place, &lowered, &[]);
    let mut outs = Vec::new();
    for (r, res) in results.into_iter().enumerate() {
        match res.expect("every rank ran") {
            Ok((o, _)) => outs.push(o),
            Err(e) => return Err(format!("{req:?} {op} {}: rank {r}: {e}", T::DTYPE)),
        }
    }
    let (wrong, first) = testkit::compare(&req.coll, &inputs, &outs, op);
    if wrong > 0 {
        return Err(format!(
            "{req:?} {op} {}: {wrong} wrong elements; first: {}",
            T::DTYPE,
            first.unwrap_or_default()
        ));
    }
    Ok(Checked::Ran)
}
