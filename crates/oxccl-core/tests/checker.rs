//! The plan checker on hand-built broken plans: each flaw gives its error.

mod common;

use common::strip;

use oxccl_core::interp::{check, check_in_place};
use oxccl_core::plan::{
    BufDecl, BufId, BufRole, Channel, Dst, Loc, Plan, RankPlan, Src, Step, Xfer,
};
use oxccl_core::{generate, Algo, CollKind, Collective, CoreError, PlanRequest};

fn bufs(len: usize, scratch: usize) -> Vec<BufDecl> {
    vec![
        BufDecl {
            role: BufRole::Input,
            len,
            must_write: false,
        },
        BufDecl {
            role: BufRole::Output,
            len,
            must_write: true,
        },
        BufDecl {
            role: BufRole::Scratch,
            len: scratch,
            must_write: false,
        },
    ]
}

/// A plan of one channel per rank (more where given) over buffers of `len`.
fn plan(len: usize, scratch: usize, ranks: Vec<Vec<Vec<Step>>>) -> Plan {
    let n = ranks.len() as u32;
    Plan {
        algo: Algo::Ring,
        coll: None,
        nranks: n,
        ranks: ranks
            .into_iter()
            .enumerate()
            .map(|(r, chans)| RankPlan {
                rank: r as u32,
                nranks: n,
                bufs: bufs(len, scratch),
                channels: chans.into_iter().map(|steps| Channel { steps }).collect(),
            })
            .collect(),
    }
}

fn x(srcs: Vec<Src>, dsts: Vec<Dst>, len: usize) -> Step {
    Step::Xfer(Xfer::new(srcs, dsts, len))
}
fn input(off: usize) -> Src {
    Src::Local {
        at: Loc::input(off),
        pre: false,
    }
}
fn local(at: Loc) -> Src {
    Src::Local { at, pre: false }
}
fn out(off: usize) -> Dst {
    Dst::Local(Loc::output(off))
}
/// Copies the whole input to the output.
fn copy_all(len: usize) -> Step {
    x(vec![input(0)], vec![out(0)], len)
}

fn fails(p: &Plan, needle: &str) {
    match check(p) {
        Err(CoreError::PlanCheck(m)) => assert!(m.contains(needle), "expected {needle:?} in {m:?}"),
        other => panic!("expected a check failure containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn a_correct_hand_plan_passes() {
    let p = plan(
        4,
        0,
        vec![
            vec![vec![x(
                vec![input(0)],
                vec![out(0), Dst::Send { peer: 1 }],
                4,
            )]],
            vec![vec![x(vec![Src::Recv { peer: 0 }], vec![out(0)], 4)]],
        ],
    );
    check(&p).unwrap();
}

#[test]
fn length_mismatch() {
    let p = plan(
        4,
        0,
        vec![
            vec![vec![
                copy_all(4),
                x(vec![input(0)], vec![Dst::Send { peer: 1 }], 4),
            ]],
            vec![vec![
                copy_all(4),
                x(vec![Src::Recv { peer: 0 }], vec![out(0)], 3),
            ]],
        ],
    );
    fails(&p, "receives 3 elements from 0 but the message has 4");
}

#[test]
fn missing_recv() {
    let p = plan(
        4,
        0,
        vec![
            vec![vec![
                copy_all(4),
                x(vec![input(0)], vec![Dst::Send { peer: 1 }], 4),
            ]],
            vec![vec![copy_all(4)]],
        ],
    );
    fails(
        &p,
        "unreceived message(s) on channel 0 from rank 0 to rank 1",
    );
}

#[test]
fn unwritten_output() {
    let p = plan(4, 0, vec![vec![vec![x(vec![input(0)], vec![out(0)], 3)]]]);
    fails(&p, "element 3 of buffer 1 (Output) is never written");
}

#[test]
fn deadlock() {
    // Both ranks receive before they send.
    let ex = |peer| {
        vec![vec![
            x(vec![Src::Recv { peer }], vec![out(0)], 4),
            x(vec![input(0)], vec![Dst::Send { peer }], 4),
        ]]
    };
    let p = plan(4, 0, vec![ex(1), ex(0)]);
    fails(&p, "deadlock");
}

#[test]
fn fifo_depth_deadlock() {
    // Three messages before the peer receives anything: fine with deep
    // FIFOs, a deadlock at the minimum depth every backend must support.
    let ex = |peer| {
        let mut s: Vec<Step> = (0..3)
            .map(|i| x(vec![input(i)], vec![Dst::Send { peer }], 1))
            .collect();
        s.extend((0..4).map(|i| x(vec![Src::Recv { peer }], vec![out(i)], 1)));
        s.insert(3, x(vec![input(3)], vec![Dst::Send { peer }], 1));
        vec![s]
    };
    fails(&plan(4, 0, vec![ex(1), ex(0)]), "deadlock");
}

#[test]
fn scratch_read_before_write() {
    let p = plan(
        4,
        4,
        vec![vec![vec![x(vec![local(Loc::scratch(0))], vec![out(0)], 4)]]],
    );
    fails(&p, "reads undefined element 0 of Scratch buffer on rank 0");
}

#[test]
fn write_into_input() {
    let p = plan(
        4,
        0,
        vec![vec![vec![
            copy_all(4),
            x(vec![input(0)], vec![Dst::Local(Loc::input(0))], 1),
        ]]],
    );
    fails(&p, "writes into an input buffer");
}

#[test]
fn out_of_bounds() {
    let p = plan(4, 0, vec![vec![vec![x(vec![input(2)], vec![out(0)], 4)]]]);
    fails(&p, "exceeds buffer length 4");
}

#[test]
fn unmatched_signal() {
    let p = plan(
        4,
        0,
        vec![
            vec![vec![copy_all(4), Step::Signal { peer: 1 }]],
            vec![vec![copy_all(4)]],
        ],
    );
    fails(&p, "1 signals from 0 to 1 but 0 waits");
}

#[test]
fn channels_writing_the_same_output_race() {
    let p = plan(
        4,
        0,
        vec![vec![
            vec![copy_all(4)],
            vec![x(vec![input(0)], vec![out(2)], 2)],
        ]],
    );
    fails(&p, "unordered with an access by rank 0 channel");
}

fn remote(peer: u32, at: Loc) -> Src {
    Src::Remote {
        peer,
        at,
        pre: false,
    }
}

#[test]
fn remote_read_before_the_peer_entered() {
    // Rank 0 reads rank 1's input with no signal from rank 1 first.
    let p = plan(
        4,
        0,
        vec![
            vec![vec![
                x(vec![remote(1, Loc::input(0))], vec![out(0)], 4),
                Step::Wait { peer: 1 },
            ]],
            vec![vec![copy_all(4), Step::Signal { peer: 0 }]],
        ],
    );
    fails(&p, "before hearing from rank 1");
}

#[test]
fn remote_read_after_the_peer_returned() {
    // Rank 1 signals entry, then returns without waiting for rank 0's read.
    let p = plan(
        4,
        0,
        vec![
            vec![vec![
                Step::Wait { peer: 1 },
                x(vec![remote(1, Loc::input(0))], vec![out(0)], 4),
            ]],
            vec![vec![Step::Signal { peer: 0 }, copy_all(4)]],
        ],
    );
    fails(
        &p,
        "rank 1 may finish while rank 0 channel 0 still accesses its memory",
    );
}

#[test]
fn remote_read_racing_a_local_write() {
    // Rank 1 overwrites its output while rank 0 reads it, with only an
    // entry handshake between them.
    let p = plan(
        4,
        0,
        vec![
            vec![vec![
                Step::Wait { peer: 1 },
                x(vec![remote(1, Loc::output(0))], vec![out(0)], 4),
                Step::Signal { peer: 1 },
            ]],
            vec![vec![
                copy_all(4),
                Step::Signal { peer: 0 },
                x(vec![input(0)], vec![out(0)], 4),
                Step::Wait { peer: 0 },
            ]],
        ],
    );
    fails(&p, "unordered with an access by rank");
}

/// Generated registered plans with their synchronisation removed.
fn registered(algo: Algo, in_place: bool) -> Plan {
    let mut req = PlanRequest::new(Collective::new(CollKind::AllReduce, 40, 0), 4, algo);
    req.registered = true;
    req.in_place = in_place;
    req.chunk = 8;
    generate(&req).unwrap()
}

#[test]
fn registered_plans_pass_and_need_every_barrier() {
    for algo in [Algo::OneShot, Algo::TwoShot] {
        for in_place in [false, true] {
            let p = registered(algo, in_place);
            if in_place {
                check_in_place(&p).unwrap();
            } else {
                check(&p).unwrap();
            }
            // Without the last barrier a rank may return while read.
            let q = strip(
                &p,
                |_| true,
                |steps, i| {
                    let last = steps
                        .iter()
                        .rposition(|s| matches!(s, Step::Signal { .. }))
                        .unwrap();
                    i + 2 < last || matches!(steps[i], Step::Xfer(_))
                },
            );
            let r = if in_place {
                check_in_place(&q)
            } else {
                check(&q)
            };
            // Out of place a rank may return while read; in place a
            // one-shot rank may also overwrite its output (it is the input)
            // while a peer still reads it, which the checker finds first.
            let needle = if in_place && algo == Algo::OneShot {
                "unordered with an access by rank"
            } else {
                "still accesses its memory"
            };
            assert!(
                matches!(&r, Err(CoreError::PlanCheck(m)) if m.contains(needle)),
                "{algo} in_place={in_place}: without the exit barrier: {r:?}"
            );
            // Without the entry barrier a rank reads before its peers entered.
            let q = strip(&p, |_| true, |_, i| i >= 6);
            let r = if in_place {
                check_in_place(&q)
            } else {
                check(&q)
            };
            assert!(
                matches!(&r, Err(CoreError::PlanCheck(m)) if m.contains("before hearing")),
                "{algo} in_place={in_place}: {r:?}"
            );
        }
    }
}

#[test]
fn in_place_one_shot_without_scratch_races() {
    let mut p = registered(Algo::OneShot, true);
    for rp in &mut p.ranks {
        for ch in &mut rp.channels {
            for s in &mut ch.steps {
                if let Step::Xfer(x) = s {
                    for d in &mut x.dsts {
                        if let Dst::Local(at) = d {
                            if at.buf == BufId::SCRATCH {
                                *at = Loc::output(at.off);
                            }
                        }
                    }
                }
            }
        }
    }
    match check_in_place(&p) {
        Err(CoreError::PlanCheck(m)) => assert!(m.contains("unordered"), "{m}"),
        other => panic!("{other:?}"),
    }
}
