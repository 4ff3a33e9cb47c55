//! Shared body of the generator tests: generate a plan, run it through the
//! reference interpreter, compare with the sequential reference.

#![allow(dead_code)] // reason: each test binary uses a different subset of these helpers

use oxccl_core::gen::supports;
use oxccl_core::interp::{self, InterpOptions, RankMem};
use oxccl_core::plan::{BufId, Plan, Step};
use oxccl_core::{
    generate, testkit, with_dtype, Algo, CollKind, DataType, Element, PlanRequest, RedOp,
};

/// Every (algorithm, collective) pair with a generator (Send/Recv has its
/// own builder).
pub fn served() -> impl Iterator<Item = (Algo, CollKind)> {
    Algo::ALL.into_iter().flat_map(|a| {
        CollKind::ALL
            .into_iter()
            .filter(move |&k| k != CollKind::SendRecv && supports(a, k))
            .map(move |k| (a, k))
    })
}

/// Runs `req` with element type `T` and `op`; `Err` describes the first
/// difference from the reference (or the checker's complaint).
pub fn run_typed<T: Element>(req: &PlanRequest, op: RedOp, seed: u64) -> Result<Plan, String> {
    let plan = generate(req).map_err(|e| format!("generate: {e}"))?;
    let checked = if req.in_place {
        interp::check_in_place(&plan)
    } else {
        interp::check(&plan)
    };
    checked.map_err(|e| format!("check: {e}"))?;
    run_plan::<T>(req, &plan, op, seed)?;
    Ok(plan)
}

/// Runs an already generated plan for `req`.
pub fn run_plan<T: Element>(
    req: &PlanRequest,
    plan: &Plan,
    op: RedOp,
    seed: u64,
) -> Result<(), String> {
    let n = req.nranks;
    let coll = req.coll;
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input(&coll, n, r, op, seed))
        .collect();
    let mut mem: Vec<RankMem<T>> = plan
        .ranks
        .iter()
        .zip(&inputs)
        .map(|(rp, i)| {
            RankMem::new(
                &rp.bufs,
                i,
                req.in_place.then(|| coll.in_place_offsets(rp.rank)),
            )
        })
        .collect();
    let lowered = op.lower(T::DTYPE, n);
    let opts = InterpOptions {
        seed,
        ..InterpOptions::default()
    };
    interp::run(plan, &mut mem, &lowered, &opts).map_err(|e| format!("interp: {e}"))?;
    let outs: Vec<Vec<T>> = mem.iter().map(|m| m.read_buf(BufId::OUTPUT)).collect();
    let (wrong, first) = testkit::compare(&coll, &inputs, &outs, op);
    if wrong > 0 {
        return Err(format!("{wrong} wrong: {}", first.unwrap_or_default()));
    }
    Ok(())
}

/// [`run_typed`] for a run-time data type.
pub fn run_dtype(req: &PlanRequest, dt: DataType, op: RedOp, seed: u64) -> Result<Plan, String> {
    with_dtype!(dt, T => run_typed::<T>(req, op, seed))
}

/// A copy of `p` in which every channel of the ranks `which` selects keeps
/// only the steps `keep(channel's steps, index)` selects (deliberately
/// broken plans for the checker).
pub fn strip(p: &Plan, which: impl Fn(u32) -> bool, keep: impl Fn(&[Step], usize) -> bool) -> Plan {
    let mut q = p.clone();
    for rp in q.ranks.iter_mut().filter(|rp| which(rp.rank)) {
        for ch in &mut rp.channels {
            let kept = (0..ch.steps.len())
                .filter(|&i| keep(&ch.steps, i))
                .map(|i| ch.steps[i].clone())
                .collect();
            ch.steps = kept;
        }
    }
    q
}
