//! Bad input gets a typed error, writes nothing, and leaves the fabric
//! usable; run-time disagreement between ranks fails the fabric.

mod common;

use common::{check_request, run_plan, small_config, Checked};
use oxccl_core::plan::{BufDecl, BufRole, Channel, Dst, Loc, Plan, RankPlan, Src, Step, Xfer};
use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use oxccl_host::{HostBuf, HostError, HostFabric};

fn ring_request(count: usize, chunk: usize) -> PlanRequest {
    let mut req = PlanRequest::new(
        Collective::new(CollKind::AllReduce, count, 0),
        2,
        Algo::Ring,
    );
    req.chunk = chunk;
    req
}

/// Calls rank 0's part of `req` alone with `bufs`: rejected before any
/// step, so no peer is needed.
fn call_rank0(fab: &HostFabric, req: &PlanRequest, bufs: &[HostBuf]) -> HostError {
    let plan = generate(req).unwrap();
    let op = RedOp::Sum.lower(DataType::F32, 2);
    // SAFETY: every buffer passed below points into a live vector of at
    // least `bytes` bytes.
    unsafe { fab.execute(&plan.ranks[0], bufs, DataType::F32, &op) }.unwrap_err()
}

#[test]
fn bad_calls_are_refused_and_write_nothing() {
    let fab = HostFabric::new(2, small_config(64));
    let input = vec![1.0f32; 100];
    let mut output = vec![-1.0f32; 100];
    let mut short = vec![-1.0f32; 99];
    let req = ring_request(100, 16);
    let cases = [
        (
            "too few buffers",
            vec![HostBuf::from_slice(&input)],
            ring_request(100, 16),
        ),
        (
            "output too small",
            vec![
                HostBuf::from_slice(&input),
                HostBuf::from_mut_slice(&mut short),
            ],
            ring_request(100, 16),
        ),
        (
            "misaligned",
            vec![
                HostBuf::from_slice(&input),
                HostBuf {
                    // SAFETY: one byte into a 400-byte buffer.
                    ptr: unsafe { output.as_mut_ptr().cast::<u8>().add(1) },
                    bytes: 396,
                },
            ],
            ring_request(99, 16),
        ),
        (
            "message larger than a slot",
            vec![
                HostBuf::from_slice(&input),
                HostBuf::from_mut_slice(&mut output),
            ],
            ring_request(100, 17),
        ),
    ];
    for (what, bufs, req) in cases {
        match call_rank0(&fab, &req, &bufs) {
            HostError::InvalidPlan(m) => println!("{what}: {m}"),
            other => panic!("{what}: expected InvalidPlan, got {other:?}"),
        }
    }
    assert!(
        output.iter().chain(&short).all(|&v| v == -1.0),
        "nothing written"
    );
    assert!(fab.failure().is_none());
    // The fabric still works, and the rejected calls left no trace.
    assert_eq!(
        check_request::<f32>(&fab, &req, RedOp::Sum, 1),
        Ok(Checked::Ran)
    );
}

#[test]
fn plan_for_another_fabric_is_refused() {
    let fab = HostFabric::new(3, small_config(64));
    let input = vec![1.0f32; 10];
    let mut output = vec![0.0f32; 10];
    let bufs = [
        HostBuf::from_slice(&input),
        HostBuf::from_mut_slice(&mut output),
    ];
    assert!(matches!(
        call_rank0(&fab, &ring_request(10, 4), &bufs),
        HostError::InvalidPlan(_)
    ));
}

/// Rank 0 sends four elements; rank 1 expects five.
#[test]
fn message_length_mismatch_fails_the_fabric() {
    let bufs = || {
        vec![
            BufDecl {
                role: BufRole::Input,
                len: 5,
                must_write: false,
            },
            BufDecl {
                role: BufRole::Output,
                len: 5,
                must_write: false,
            },
        ]
    };
    let send = Step::Xfer(Xfer::new(
        vec![Src::Local {
            at: Loc::input(0),
            pre: false,
        }],
        vec![Dst::Send { peer: 1 }],
        4,
    ));
    let recv = Step::Xfer(Xfer::new(
        vec![Src::Recv { peer: 0 }],
        vec![Dst::Local(Loc::output(0))],
        5,
    ));
    let plan = Plan {
        algo: Algo::Ring,
        coll: None,
        nranks: 2,
        ranks: [send, recv]
            .into_iter()
            .enumerate()
            .map(|(r, step)| RankPlan {
                rank: r as u32,
                nranks: 2,
                bufs: bufs(),
                channels: vec![Channel { steps: vec![step] }],
            })
            .collect(),
    };
    let fab = HostFabric::new(2, small_config(64));
    let inputs = vec![vec![1u8; 5]; 2];
    let res = run_plan(
        &fab,
        &plan,
        &inputs,
        false,
        &RedOp::Sum.lower(DataType::U8, 2),
        &[],
    );
    match res[1].as_ref().unwrap() {
        Err(HostError::Mismatch {
            rank: 1,
            peer: 0,
            channel: 0,
            step: 0,
            detail,
        }) => assert!(detail.contains("has 4"), "{detail}"),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert!(fab.failure().is_some());
}
