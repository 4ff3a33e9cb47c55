//! Registered-buffer steps (`Src::Remote`/`Dst::Remote`) with
//! `Signal`/`Wait`, on hand-built plans checked by the interpreter first.

mod common;

use common::{run_plan, small_config};
use oxccl_core::interp::{self, InterpOptions};
use oxccl_core::plan::{BufDecl, BufRole, Channel, Dst, Loc, Plan, RankPlan, Src, Step, Xfer};
use oxccl_core::{testkit, Algo, CollKind, Collective, DataType, RedOp};
use oxccl_host::{HostError, HostFabric};

fn decls(coll: &Collective, n: u32, rank: u32) -> Vec<BufDecl> {
    vec![
        BufDecl {
            role: BufRole::Input,
            len: coll.input_len(n),
            must_write: false,
        },
        BufDecl {
            role: BufRole::Output,
            len: coll.output_len(n),
            must_write: coll.writes_output(rank),
        },
        BufDecl {
            role: BufRole::Scratch,
            len: coll.output_len(n),
            must_write: false,
        },
    ]
}

/// Signal every peer, then wait for every peer.
fn barrier(steps: &mut Vec<Step>, n: u32, r: u32) {
    let peers = (0..n).filter(move |&p| p != r);
    steps.extend(peers.clone().map(|peer| Step::Signal { peer }));
    steps.extend(peers.map(|peer| Step::Wait { peer }));
}

fn plan(coll: Collective, n: u32, body: impl Fn(u32, &mut Vec<Step>)) -> Plan {
    let ranks = (0..n)
        .map(|r| {
            let mut steps = Vec::new();
            barrier(&mut steps, n, r);
            body(r, &mut steps);
            barrier(&mut steps, n, r);
            RankPlan {
                rank: r,
                nranks: n,
                bufs: decls(&coll, n, r),
                channels: vec![Channel { steps }],
            }
        })
        .collect();
    Plan {
        algo: Algo::OneShot,
        coll: Some(coll),
        nranks: n,
        ranks,
    }
}

/// One-shot AllReduce: every rank reduces all inputs, read in place.
fn one_shot(n: u32, count: usize) -> Plan {
    let coll = Collective::new(CollKind::AllReduce, count, 0);
    plan(coll, n, |r, steps| {
        let srcs = (0..n)
            .map(|q| {
                let at = Loc::input(0);
                if q == r {
                    Src::Local { at, pre: true }
                } else {
                    Src::Remote {
                        peer: q,
                        at,
                        pre: true,
                    }
                }
            })
            .collect();
        // Into scratch first: in place, the output is the input peers read.
        steps.push(Step::Xfer(Xfer {
            srcs,
            dsts: vec![Dst::Local(Loc::scratch(0))],
            len: count,
            post: true,
        }));
        barrier(steps, n, r);
        steps.push(Step::Xfer(Xfer::new(
            vec![Src::Local {
                at: Loc::scratch(0),
                pre: false,
            }],
            vec![Dst::Local(Loc::output(0))],
            count,
        )));
    })
}

/// AllGather by puts into every peer's output.
fn put_all_gather(n: u32, count: usize) -> Plan {
    let coll = Collective::new(CollKind::AllGather, count, 0);
    plan(coll, n, |r, steps| {
        let at = Loc::output(r as usize * count);
        let mut dsts = vec![Dst::Local(at)];
        dsts.extend(
            (0..n)
                .filter(|&p| p != r)
                .map(|peer| Dst::Remote { peer, at }),
        );
        steps.push(Step::Xfer(Xfer::new(
            vec![Src::Local {
                at: Loc::input(0),
                pre: false,
            }],
            dsts,
            count,
        )));
    })
}

/// Runs `plan` through the interpreter (the checker) and then `calls`
/// times on one host fabric, comparing each run with the reference.
fn check(plan: &Plan, op: RedOp, in_place: bool, calls: u64) {
    let coll = plan.coll.unwrap();
    let n = plan.nranks;
    let lowered = op.lower(DataType::F32, n);
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| testkit::input(&coll, n, r, op, 5)).collect();
    let mut mem = interp::memories(plan, &inputs, in_place);
    interp::run(plan, &mut mem, &lowered, &InterpOptions::default()).expect("plan checks");
    let fab = HostFabric::new(n, small_config(64));
    for call in 0..calls {
        let outs: Vec<Vec<f32>> = run_plan(&fab, plan, &inputs, in_place, &lowered, &[])
            .into_iter()
            .map(|r| r.unwrap().unwrap_or_else(|e| panic!("call {call}: {e}")).0)
            .collect();
        let (wrong, first) = testkit::compare(&coll, &inputs, &outs, op);
        assert_eq!(wrong, 0, "call {call}: {first:?}");
    }
    if n > 1 {
        // Each pair's semaphore grew by the plan's barriers every call.
        let barriers = plan.ranks[0].channels[0]
            .steps
            .iter()
            .filter(|s| **s == Step::Signal { peer: 1 })
            .count() as u64;
        let [_, _, posted, consumed] = fab.link_counters(0, 0, 1).unwrap();
        assert_eq!((posted, consumed), (barriers * calls, barriers * calls));
    }
}

#[test]
fn one_shot_allreduce_reads_peers_directly() {
    for n in [1u32, 2, 3, 5] {
        for in_place in [false, true] {
            check(&one_shot(n, 1001), RedOp::Sum, in_place, 3);
            check(&one_shot(n, 7), RedOp::Avg, in_place, 2);
        }
    }
}

#[test]
fn put_all_gather_writes_peers_directly() {
    for n in [2u32, 4] {
        for in_place in [false, true] {
            check(&put_all_gather(n, 333), RedOp::Sum, in_place, 3);
        }
    }
}

/// A remote read of a peer that has not published this call's buffers
/// (here: it never joins) is a mismatch, not a read of stale memory.
#[test]
fn remote_access_without_synchronisation_is_refused() {
    let mut p = one_shot(2, 4);
    // Drop rank 1's barrier: it reads rank 0 straight away.
    p.ranks[1].channels[0]
        .steps
        .retain(|s| matches!(s, Step::Xfer(_)));
    let fab = HostFabric::new(2, small_config(64));
    let inputs = vec![vec![1.0f32; 4]; 2];
    let res = run_plan(
        &fab,
        &p,
        &inputs,
        false,
        &RedOp::Sum.lower(DataType::F32, 2),
        &[0],
    );
    match res[1].as_ref().unwrap() {
        Err(HostError::Mismatch {
            rank: 1, peer: 0, ..
        }) => {}
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert!(fab.failure().is_some());
}
