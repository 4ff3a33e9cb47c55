//! Shared body of the generator tests: generate a plan, run it through the
//! reference interpreter, compare with the sequential reference.

#![allow(dead_code)] // reason: each test binary uses a different subset of these helpers

use oxccl_core::gen::{split, supports};
use oxccl_core::interp::{self, InterpOptions};
use oxccl_core::plan::{BufId, Plan, Step};
use oxccl_core::{
    generate, testkit, with_dtype, Algo, CollKind, Collective, CoreError, DataType, Element,
    PlanRequest, RedOp,
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

/// Whether `algo` has a plan for `kind` in this form: everything but the
/// copy-engine algorithm off registered buffers, which it refuses.
pub fn has_plan(algo: Algo, _kind: CollKind, registered: bool, _in_place: bool, _n: u32) -> bool {
    algo != Algo::CopyEngine || registered
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
    let mut mem = interp::memories(plan, &inputs, req.in_place);
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

/// `interp::check_in_place` for in-place plans, `interp::check` otherwise.
pub fn checked(p: &Plan, in_place: bool) -> Result<(), CoreError> {
    if in_place {
        interp::check_in_place(p)
    } else {
        interp::check(p)
    }
}

/// The checker's message; panics on success or on another error.
pub fn plan_check_error(r: Result<(), CoreError>) -> String {
    match r {
        Err(CoreError::PlanCheck(m)) => m,
        other => panic!("expected a plan check error, got {other:?}"),
    }
}

pub fn is_sync(s: &Step) -> bool {
    matches!(s, Step::Signal { .. } | Step::Wait { .. })
}

/// Elements read and written by `rank`'s steps (sources and destinations
/// of every transfer, wherever they lie).
pub fn moved(p: &Plan, rank: usize) -> (usize, usize) {
    p.ranks[rank]
        .channels
        .iter()
        .flat_map(|c| &c.steps)
        .filter_map(|s| match s {
            Step::Xfer(x) => Some((x.srcs.len() * x.len, x.dsts.len() * x.len)),
            _ => None,
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// A random registered-plan case: rank counts mostly small, some of 30–34
/// ranks; counts with empty, uneven and chunked blocks.
#[derive(Clone, Debug)]
pub struct RandomCase {
    pub n: u32,
    pub count: usize,
    pub channels: u32,
    pub chunk: usize,
    pub in_place: bool,
    pub dtype: DataType,
    /// The drawn op, or Sum where it does not apply to the collective.
    pub op: RedOp,
    pub seed: u64,
}

pub fn random_case(kind: CollKind) -> impl proptest::strategy::Strategy<Value = RandomCase> {
    use proptest::prelude::*;
    (
        prop_oneof![4 => 1u32..=12, 1 => 30u32..=34],
        prop_oneof![
            0usize..300,
            prop::sample::select(vec![1usize, 7, 127, 1021])
        ],
        1u32..=4,
        prop_oneof![1usize..16, Just(1 << 16)],
        any::<bool>(),
        prop::sample::select(DataType::ALL.to_vec()),
        prop::sample::select(testkit::OPS.to_vec()),
        any::<u64>(),
    )
        .prop_map(
            move |(n, count, channels, chunk, in_place, dtype, op, seed)| RandomCase {
                n,
                count,
                channels,
                chunk,
                in_place,
                dtype,
                op: if testkit::op_defined(kind, dtype, op) {
                    op
                } else {
                    RedOp::Sum
                },
                seed,
            },
        )
}

/// A request for a plan over registered buffers.
pub fn registered(
    coll: Collective,
    n: u32,
    algo: Algo,
    (channels, chunk): (u32, usize),
    in_place: bool,
) -> PlanRequest {
    let mut req = PlanRequest::new(coll, n, algo);
    req.registered = true;
    req.in_place = in_place;
    req.channels = channels;
    req.chunk = chunk;
    req
}

/// In a plan whose every non-empty channel starts and ends with a full
/// barrier (2(n−1) steps: signal every peer, wait every peer), the entry
/// barrier's steps.
pub fn entry(n: u32) -> impl Fn(&[Step], usize) -> bool {
    move |_, i| i < 2 * (n as usize - 1)
}

/// The exit barrier's steps, as [`entry`].
pub fn exit(n: u32) -> impl Fn(&[Step], usize) -> bool {
    move |s, i| i + 2 * (n as usize - 1) >= s.len()
}

/// Elements of rank `r`'s blocks over all channels, when each channel's
/// range is split into n blocks.
pub fn own_blocks(count: usize, channels: u32, n: u32, r: u32) -> usize {
    split(count, channels as usize)
        .iter()
        .map(|c| split(c.len(), n as usize)[r as usize].len())
        .sum()
}

/// `p` without rank `t`'s handshakes in `part` ([`entry`] or [`exit`]) of
/// every channel: at entry `t`'s signals and its peers' waits for `t`, at
/// exit `t`'s waits and its peers' signals to `t`, so signals stay
/// balanced.
pub fn without_handshakes(
    p: &Plan,
    t: u32,
    part: impl Fn(&[Step], usize) -> bool,
    at_entry: bool,
) -> Plan {
    let own = |s: &Step| match s {
        Step::Signal { .. } => at_entry,
        Step::Wait { .. } => !at_entry,
        Step::Xfer(_) | Step::Swap { .. } => false,
    };
    let theirs = |s: &Step| match *s {
        Step::Signal { peer } => !at_entry && peer == t,
        Step::Wait { peer } => at_entry && peer == t,
        Step::Xfer(_) | Step::Swap { .. } => false,
    };
    let q = strip(p, |r| r == t, |s, i| !(part(s, i) && own(&s[i])));
    strip(&q, |r| r != t, |s, i| !(part(s, i) && theirs(&s[i])))
}

/// For a plan with full entry and exit barriers (which must pass): the
/// checker rejects it without the exit barrier on every rank ("may finish
/// while rank … still accesses its memory"), without the entry barrier
/// ("before hearing"), and without only rank `lone`'s exit or entry
/// handshakes (naming `lone` as the rank that may finish, or whose memory
/// is accessed before hearing from it).
pub fn assert_barriers_needed(p: &Plan, in_place: bool, lone: u32, what: &str) {
    let n = p.nranks;
    checked(p, in_place).unwrap_or_else(|e| panic!("{what}: {e}"));
    let m = plan_check_error(checked(
        &strip(p, |_| true, |s, i| !exit(n)(s, i)),
        in_place,
    ));
    assert!(
        m.contains("may finish while rank") && m.contains("still accesses its memory"),
        "{what} without exit: {m}"
    );
    let m = plan_check_error(checked(
        &strip(p, |_| true, |s, i| !entry(n)(s, i)),
        in_place,
    ));
    assert!(m.contains("before hearing"), "{what} without entry: {m}");
    let m = plan_check_error(checked(
        &without_handshakes(p, lone, exit(n), false),
        in_place,
    ));
    assert!(
        m.contains(&format!("rank {lone} may finish while rank")),
        "{what} rank {lone} without exit: {m}"
    );
    let m = plan_check_error(checked(
        &without_handshakes(p, lone, entry(n), true),
        in_place,
    ));
    assert!(
        m.contains(&format!("accesses rank {lone}'s memory before hearing")),
        "{what} rank {lone} without entry: {m}"
    );
}

/// Non-roots skip their exit handshakes with each other, keeping those
/// with the root: the checker still reports a rank that may finish while
/// another accesses its memory, and it is not the root.
pub fn assert_non_roots_need_each_other(p: &Plan, root: u32, in_place: bool, what: &str) {
    let n = p.nranks;
    let non_root = |peer: u32| peer != root;
    let loose = strip(
        p,
        |r| r != root,
        |s, i| {
            !(exit(n)(s, i)
                && matches!(s[i], Step::Signal { peer } | Step::Wait { peer } if non_root(peer)))
        },
    );
    let m = plan_check_error(checked(&loose, in_place));
    assert!(
        m.contains("may finish while rank") && !m.contains(&format!("rank {root} may finish")),
        "{what} non-roots without mutual exit: {m}"
    );
}
