//! Every generator on a grid of small cases, f32 and i32, sum.

mod common;

use oxccl_core::{Collective, DataType, PlanRequest, RedOp};

#[test]
fn every_generator_small_grid() {
    for (algo, kind) in common::served() {
        for n in [1u32, 2, 3, 4, 5, 7, 8] {
            for count in [0usize, 1, 2, 7, 30] {
                for in_place in [false, true] {
                    for (channels, chunk) in [(1, 64), (2, 3), (3, 1)] {
                        let root = (count as u32 * 7 + 3) % n;
                        let mut req = PlanRequest::new(Collective::new(kind, count, root), n, algo);
                        req.in_place = in_place;
                        req.channels = channels;
                        req.chunk = chunk;
                        for registered in [false, true] {
                            if !common::has_plan(algo, kind, registered, in_place, n) {
                                continue;
                            }
                            req.registered = registered;
                            for dt in [DataType::F32, DataType::I32] {
                                if let Err(e) = common::run_dtype(&req, dt, RedOp::Sum, 7) {
                                    panic!("{algo} {kind} n={n} count={count} root={root} in_place={in_place} ch={channels} chunk={chunk} registered={registered} {dt}: {e}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `Algo::plan_channels` is what the generators make, so a caller that
/// keeps `plan_channels(c)` within a device's limit never hands it more
/// (the double binary tree makes two per requested channel).
#[test]
fn plan_channels_says_how_many_channels_a_plan_has() {
    for (algo, kind) in common::served() {
        for registered in [false, true] {
            if !common::has_plan(algo, kind, registered, false, 8) {
                continue;
            }
            for channels in [1u32, 3, 8, 16] {
                let mut req = PlanRequest::new(Collective::new(kind, 4096, 0), 8, algo);
                req.channels = channels;
                req.registered = registered;
                let plan = oxccl_core::gen::generate(&req).unwrap();
                for rp in &plan.ranks {
                    assert_eq!(
                        rp.channels.len() as u32,
                        algo.plan_channels(channels),
                        "{algo} {kind} registered={registered} ch={channels}"
                    );
                }
                let fit = algo.channels_within(algo.plan_channels(channels));
                assert_eq!(fit, channels, "{algo}");
                assert!(algo.plan_channels(algo.channels_within(channels)) <= channels);
            }
        }
    }
}

/// `RankPlan::peers` names whom each rank exchanges with: a ring's two
/// neighbours, every rank for all-pairs, the root alone for a leaf of a
/// gather; and every generated plan's names are mutual.
#[test]
fn peers_name_whom_each_rank_exchanges_with() {
    use oxccl_core::{Algo, CollKind};
    let plan = |kind, algo, registered| {
        let mut req = PlanRequest::new(Collective::new(kind, 40, 0), 5, algo);
        req.registered = registered;
        oxccl_core::gen::generate(&req).unwrap()
    };
    let ring = plan(CollKind::AllReduce, Algo::Ring, false);
    assert_eq!(ring.ranks[0].peers(), vec![1, 4]);
    assert_eq!(ring.ranks[2].peers(), vec![1, 3]);
    let one = plan(CollKind::AllReduce, Algo::OneShot, true);
    assert_eq!(one.ranks[3].peers(), vec![0, 1, 2, 4]);
    let gather = plan(CollKind::Gather, Algo::AllPairs, false);
    assert_eq!(gather.ranks[0].peers(), vec![1, 2, 3, 4]);
    assert_eq!(gather.ranks[2].peers(), vec![0]);
    for (algo, kind) in common::served() {
        for registered in [false, true] {
            if !common::has_plan(algo, kind, registered, false, 5) {
                continue;
            }
            for n in [1u32, 2, 3, 5] {
                let mut req = PlanRequest::new(Collective::new(kind, 30, 1 % n), n, algo);
                req.registered = registered;
                let p = oxccl_core::gen::generate(&req).unwrap();
                for (a, rp) in p.ranks.iter().enumerate() {
                    assert!(
                        !rp.peers().contains(&(a as u32)),
                        "{algo} {kind}: rank {a} names itself"
                    );
                    for b in rp.peers() {
                        assert!(
                            p.ranks[b as usize].peers().contains(&(a as u32)),
                            "{algo} {kind} n={n} registered={registered}: rank {a} names {b}, not mutual"
                        );
                    }
                }
            }
        }
    }
}
