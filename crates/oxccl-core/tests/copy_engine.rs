//! The copy-engine algorithm's plans are copies only: every transfer reads
//! one buffer and writes one other (no FIFO message, no reduction, no
//! swap), so a backend can issue each as one memory copy; they give the
//! reference's result for every collective it serves (in-place AllToAll
//! staged through scratch), and it refuses unregistered buffers with a
//! typed error.

mod common;

use oxccl_core::gen::supports;
use oxccl_core::plan::{Dst, Src, Step};
use oxccl_core::{generate, Algo, CollKind, Collective, CoreError, DataType, PlanRequest, RedOp};

const SERVED: [CollKind; 5] = [
    CollKind::Broadcast,
    CollKind::AllGather,
    CollKind::AllToAll,
    CollKind::Gather,
    CollKind::Scatter,
];

#[test]
fn it_serves_the_data_movement_collectives_only() {
    for kind in CollKind::ALL {
        assert_eq!(
            supports(Algo::CopyEngine, kind),
            SERVED.contains(&kind),
            "{kind}"
        );
    }
    assert_eq!("ce".parse::<Algo>().unwrap(), Algo::CopyEngine);
    assert_eq!(Algo::CopyEngine.to_string(), "ce");
}

#[test]
fn every_transfer_is_one_copy_and_results_match() {
    let mut copies = 0;
    for kind in SERVED {
        for n in [1u32, 2, 3, 5, 8, 9] {
            for in_place in [false, true] {
                if !common::has_plan(Algo::CopyEngine, kind, true, in_place, n) {
                    continue;
                }
                for (channels, chunk) in [(1u32, 1 << 16), (3, 5)] {
                    let root = n / 2;
                    let mut req =
                        PlanRequest::new(Collective::new(kind, 29, root), n, Algo::CopyEngine);
                    req.registered = true;
                    req.in_place = in_place;
                    req.channels = channels;
                    req.chunk = chunk;
                    let what = format!("{kind} n={n} in_place={in_place} ch={channels}");
                    let plan = common::run_dtype(&req, DataType::F32, RedOp::Sum, 3)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(plan.algo, Algo::CopyEngine, "{what}");
                    for rp in &plan.ranks {
                        for step in rp.channels.iter().flat_map(|c| &c.steps) {
                            match step {
                                Step::Xfer(x) => {
                                    assert_eq!(
                                        (x.srcs.len(), x.dsts.len()),
                                        (1, 1),
                                        "{what}: {step:?}"
                                    );
                                    assert!(!x.post, "{what}: {step:?}");
                                    assert!(
                                        !matches!(x.srcs[0], Src::Recv { .. })
                                            && !matches!(x.dsts[0], Dst::Send { .. }),
                                        "{what}: a FIFO message: {step:?}"
                                    );
                                    copies += 1;
                                }
                                Step::Signal { .. } | Step::Wait { .. } => {}
                                other => panic!("{what}: not a copy: {other:?}"),
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(copies > 1000, "{copies} copies");
}

#[test]
fn unregistered_buffers_are_refused() {
    let refused = |kind, registered, in_place| {
        let mut req = PlanRequest::new(Collective::new(kind, 16, 0), 4, Algo::CopyEngine);
        req.registered = registered;
        req.in_place = in_place;
        matches!(generate(&req), Err(CoreError::Unsupported { .. }))
    };
    for kind in SERVED {
        assert!(refused(kind, false, false), "{kind} unregistered");
    }
    assert!(!refused(CollKind::AllToAll, true, true));
    assert!(!refused(CollKind::AllToAll, true, false));
    assert!(!refused(CollKind::AllGather, true, true));
    assert!(refused(CollKind::AllReduce, true, false));
}
