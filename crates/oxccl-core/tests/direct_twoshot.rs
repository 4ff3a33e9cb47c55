//! Registered two-shot AllReduce that pushes: its shape (one reduce_from of
//! n sources into n outputs per piece, two barriers per channel), the
//! bytes it moves (the 2·S floor), correctness in every type, op and
//! placement, and the checker catching each deliberate break.

mod common;

use common::{checked, is_sync, moved, plan_check_error, strip};
use oxccl_core::gen::{MAX_PUSH_RANKS, PUSH_GROUP};
use oxccl_core::interp::{check, check_in_place};
use oxccl_core::plan::{Dst, Loc, Plan, Src, Step, Xfer};
use oxccl_core::testkit::op_defined;
use oxccl_core::testkit::OPS;
use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest};
use proptest::prelude::*;

fn request(n: u32, count: usize, channels: u32, chunk: usize, in_place: bool) -> PlanRequest {
    let coll = Collective::new(CollKind::AllReduce, count, 0);
    common::registered(coll, n, Algo::TwoShot, (channels, chunk), in_place)
}

fn plan(n: u32, count: usize, channels: u32, chunk: usize, in_place: bool) -> Plan {
    generate(&request(n, count, channels, chunk, in_place)).unwrap()
}

/// A channel's transfers, in order.
fn xfers(steps: &[Step]) -> Vec<&Xfer> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Xfer(x) => Some(x),
            _ => None,
        })
        .collect()
}

/// The sync steps after the channel's last transfer (the exit barrier).
fn exit(steps: &[Step], i: usize) -> bool {
    let last = steps.iter().rposition(|s| !is_sync(s)).unwrap_or(0);
    i > last && is_sync(&steps[i])
}

/// The sync steps before the channel's first transfer (the entry barrier).
fn entry(steps: &[Step], i: usize) -> bool {
    let first = steps
        .iter()
        .position(|s| !is_sync(s))
        .unwrap_or(steps.len());
    i < first
}

/// Per channel: an entry barrier, one push per piece of the rank's block
/// (n sources in rank order, pre-scaled; its own output then every peer's;
/// post), an exit barrier. Each rank reads S and writes S elements in all:
/// the floor, against (3n−1)/n·S for the pull scheme.
#[test]
fn push_shape_and_bytes() {
    for n in [2u32, 3, 5, 8, 16, MAX_PUSH_RANKS] {
        let count = 1000 * n as usize + 7;
        for (channels, chunk) in [(1, 1 << 20), (4, 1 << 20), (3, 50)] {
            let p = plan(n, count, channels, chunk, false);
            for rp in &p.ranks {
                assert_eq!(rp.max_message(), 0);
                for ch in &rp.channels {
                    let syncs = ch.steps.iter().filter(|s| is_sync(s)).count();
                    assert_eq!(syncs, 4 * (n as usize - 1), "n {n} rank {}", rp.rank);
                    let xfers = xfers(&ch.steps);
                    assert!(!xfers.is_empty());
                    if chunk >= count {
                        assert_eq!(xfers.len(), 1, "one step per block when it fits a chunk");
                    }
                    for x in xfers {
                        assert!(x.post && x.len <= chunk);
                        assert_eq!(x.primitive_name(), "reduce_from");
                        for (q, s) in x.srcs.iter().enumerate() {
                            let (peer, at, pre) = match *s {
                                Src::Local { at, pre } => (rp.rank, at, pre),
                                Src::Remote { peer, at, pre } => (peer, at, pre),
                                Src::Recv { .. } => panic!("FIFO source"),
                            };
                            assert!(pre && peer == q as u32 && at.buf.0 == 0);
                        }
                        assert_eq!(x.dsts.len(), n as usize);
                        assert!(matches!(x.dsts[0], Dst::Local(l) if l.buf.0 == 1));
                        let mut peers: Vec<u32> = x.dsts[1..]
                            .iter()
                            .map(|d| match *d {
                                Dst::Remote { peer, at } if at.buf.0 == 1 => peer,
                                other => panic!("unexpected destination {other}"),
                            })
                            .collect();
                        peers.sort_unstable();
                        let want: Vec<u32> = (0..n).filter(|&q| q != rp.rank).collect();
                        assert_eq!(peers, want);
                    }
                }
                let (read, written) = moved(&p, rp.rank as usize);
                let blocks: usize = oxccl_core::gen::split(count, channels as usize)
                    .iter()
                    .map(|r| oxccl_core::gen::split(r.len(), n as usize)[rp.rank as usize].len())
                    .sum();
                assert_eq!((read, written), (n as usize * blocks, n as usize * blocks));
            }
            let total: usize = (0..n as usize).map(|r| moved(&p, r).0).sum();
            assert_eq!(total, n as usize * count, "all ranks read N·S together");
        }
    }
}

/// With a push group of `PUSH_GROUP` below n (up to the push limit) each
/// piece is reduced into the rank's own output, then copied to the peers
/// in groups of at most `PUSH_GROUP`, each peer once; the extra reads are
/// the reduced piece's, once per group.
#[test]
fn a_push_group_copies_the_reduction_out_in_groups() {
    for n in [PUSH_GROUP as u32 + 1, 64, MAX_PUSH_RANKS] {
        let count = 1000 * n as usize + 7;
        let mut req = request(n, count, 2, 1 << 20, false);
        req.push_group = Some(PUSH_GROUP);
        let p = generate(&req).unwrap();
        let groups = (n as usize - 1).div_ceil(PUSH_GROUP);
        for rp in &p.ranks {
            for ch in &rp.channels {
                let xfers = xfers(&ch.steps);
                assert_eq!(
                    xfers.len(),
                    1 + groups,
                    "n {n}: one reduction, {groups} copies"
                );
                assert_eq!(xfers[0].primitive_name(), "reduce_from");
                assert!(xfers[0].post && xfers[0].srcs.len() == n as usize);
                assert!(matches!(xfers[0].dsts[..], [Dst::Local(l)] if l.buf.0 == 1));
                let mut peers = Vec::new();
                for x in &xfers[1..] {
                    assert!(!x.post && x.srcs.len() == 1 && x.dsts.len() <= PUSH_GROUP);
                    assert!(matches!(x.srcs[0], Src::Local { at, .. } if at.buf.0 == 1));
                    for d in &x.dsts {
                        match *d {
                            Dst::Remote { peer, at } if at.buf.0 == 1 => peers.push(peer),
                            other => panic!("n {n}: unexpected destination {other}"),
                        }
                    }
                }
                peers.sort_unstable();
                let want: Vec<u32> = (0..n).filter(|&q| q != rp.rank).collect();
                assert_eq!(peers, want, "n {n} rank {}", rp.rank);
            }
            let (read, written) = moved(&p, rp.rank as usize);
            let blocks: usize = oxccl_core::gen::split(count, 2)
                .iter()
                .map(|r| oxccl_core::gen::split(r.len(), n as usize)[rp.rank as usize].len())
                .sum();
            assert_eq!(read, (n as usize + groups) * blocks, "n {n}");
            assert_eq!(written, n as usize * blocks, "n {n}");
        }
        check(&p).unwrap();
    }
}

/// Above the executor's 128 destinations the generator falls back to the
/// pull scheme: no remote writes, three barriers per channel.
#[test]
fn falls_back_to_pull_above_the_operand_limit() {
    let n = MAX_PUSH_RANKS + 1;
    let p = plan(n, 3 * n as usize, 1, 1 << 16, false);
    for rp in &p.ranks {
        let steps = &rp.channels[0].steps;
        assert_eq!(
            steps.iter().filter(|s| is_sync(s)).count(),
            6 * (n as usize - 1)
        );
        for s in steps {
            if let Step::Xfer(x) = s {
                assert!(x.dsts.iter().all(|d| matches!(d, Dst::Local(_))));
                assert!(x.dsts.len() <= 32);
            }
        }
    }
    check(&p).unwrap();
}

/// Removing the exit barrier (on every rank, or on one rank only) lets a
/// rank return while peers still write its output and read its input: the
/// race detector's end-of-run check names the ranks. Removing the entry
/// barrier lets a rank touch a peer that may not have entered.
#[test]
fn checker_catches_missing_barriers() {
    for in_place in [false, true] {
        for (n, channels, chunk) in [(2, 1, 1 << 16), (4, 2, 8), (8, 3, 5)] {
            let p = plan(n, 97, channels, chunk, in_place);
            let what = format!("n {n} channels {channels} in_place={in_place}");
            checked(&p, in_place).unwrap_or_else(|e| panic!("{what}: {e}"));

            let m = plan_check_error(checked(&strip(&p, |_| true, |s, i| !exit(s, i)), in_place));
            assert!(
                m.contains("may finish while rank") && m.contains("still accesses its memory"),
                "{what} without exit: {m}"
            );

            // Rank 0 alone skips its exit barrier: it drops its exit waits
            // and its peers their exit signals to it (so signals stay
            // balanced and only the race detector can object).
            let lone = strip(
                &p,
                |r| r == 0,
                |s, i| !(exit(s, i) && matches!(s[i], Step::Wait { .. })),
            );
            let lone = strip(
                &lone,
                |r| r != 0,
                |s, i| !(exit(s, i) && matches!(s[i], Step::Signal { peer: 0 })),
            );
            let m = plan_check_error(checked(&lone, in_place));
            assert!(
                m.contains("rank 0 may finish while rank"),
                "{what} rank 0 without exit: {m}"
            );

            let m = plan_check_error(checked(&strip(&p, |_| true, |s, i| !entry(s, i)), in_place));
            assert!(m.contains("before hearing"), "{what} without entry: {m}");
        }
    }
}

/// In place, rank r reads and writes only block r, element by element in
/// one step. Pointing its remote writes at the next rank's block makes them
/// collide with that rank's reads of the same elements: the race detector
/// (through the in-place aliasing of input and output) reports it.
#[test]
fn in_place_push_into_a_foreign_block_races() {
    let n = 4;
    let count = 40;
    let p = plan(n, count, 1, 1 << 16, true);
    check_in_place(&p).unwrap();
    let mut bad = p.clone();
    for rp in &mut bad.ranks {
        for s in &mut rp.channels[0].steps {
            if let Step::Xfer(x) = s {
                for d in &mut x.dsts {
                    if let Dst::Remote { at, .. } = d {
                        *at = Loc::output((at.off + count / n as usize) % count);
                    }
                }
            }
        }
    }
    let m = plan_check_error(check_in_place(&bad));
    assert!(m.contains("unordered"), "{m}");
}

/// Every dtype × op × placement on a shape with uneven, empty and chunked
/// blocks, equal to the sequential reference.
#[test]
fn every_type_op_and_placement() {
    for dtype in DataType::ALL {
        for op in OPS
            .into_iter()
            .filter(|&o| op_defined(CollKind::AllReduce, dtype, o))
        {
            for in_place in [false, true] {
                for (n, count, channels, chunk) in [(8, 61, 2, 3), (3, 2, 2, 1)] {
                    let req = request(n, count, channels, chunk, in_place);
                    common::run_dtype(&req, dtype, op, 7)
                        .unwrap_or_else(|e| panic!("{dtype} {op} in_place={in_place} n {n}: {e}"));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// Random shapes around the push/pull boundary, checked and compared.
    #[test]
    fn registered_two_shot_random(c in common::random_case(CollKind::AllReduce)) {
        let req = request(c.n, c.count, c.channels, c.chunk, c.in_place);
        common::run_dtype(&req, c.dtype, c.op, c.seed).map_err(TestCaseError::fail)?;
    }
}

/// With a push group below n the piece is reduced into the rank's own
/// output, then copied out to at most `g` peers per step: the same result
/// in every placement, race-free in place, and each peer written once.
#[test]
fn grouped_push_reduces_once_then_copies_in_groups() {
    for in_place in [false, true] {
        for (n, g) in [(8u32, 3usize), (5, 1), (4, 4), (16, 5)] {
            let mut req = request(n, 97 * n as usize + 3, 2, 7, in_place);
            req.push_group = Some(g);
            let p = generate(&req).unwrap();
            let what = format!("n {n} g {g} in_place={in_place}");
            checked(&p, in_place).unwrap_or_else(|e| panic!("{what}: {e}"));
            for rp in &p.ranks {
                let mut written = vec![0usize; n as usize];
                for x in rp.channels.iter().flat_map(|c| xfers(&c.steps)) {
                    assert!(x.dsts.len() <= g.max(1), "{what}: {} outputs", x.dsts.len());
                    for d in &x.dsts {
                        match *d {
                            Dst::Remote { peer, .. } => written[peer as usize] += x.len,
                            Dst::Local(_) => written[rp.rank as usize] += x.len,
                            Dst::Send { .. } => panic!("{what}: FIFO destination"),
                        }
                    }
                }
                assert!(
                    written.windows(2).all(|w| w[0] == w[1]),
                    "{what}: rank {} writes {written:?}",
                    rp.rank
                );
            }
            for op in OPS
                .into_iter()
                .filter(|&o| op_defined(CollKind::AllReduce, DataType::F32, o))
            {
                common::run_dtype(&req, DataType::F32, op, 11)
                    .unwrap_or_else(|e| panic!("{what} {op}: {e}"));
            }
        }
    }
}
