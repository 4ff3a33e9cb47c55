//! Registered all-pairs Reduce, spread over every rank: its shape (per
//! channel an entry barrier, one reduce_from of n sources into the root's
//! output per piece of the rank's block, an exit barrier), the bytes each
//! rank moves (the (n+1)·S floor, 1/n of it per rank), correctness in
//! every type, op, root and placement, and the checker's verdicts on
//! deliberately broken variants.

mod common;

use common::{is_sync, moved, own_blocks, plan_check_error};
use oxccl_core::gen::split;
use oxccl_core::interp::check_in_place;
use oxccl_core::plan::{Dst, Loc, Plan, Src, Step};
use oxccl_core::testkit::{op_defined, OPS};
use oxccl_core::{generate, Algo, CollKind, Collective, DataType, Element, PlanRequest, RedOp};
use proptest::prelude::*;

fn request(n: u32, count: usize, root: u32, shape: (u32, usize), in_place: bool) -> PlanRequest {
    let coll = Collective::new(CollKind::Reduce, count, root);
    common::registered(coll, n, Algo::AllPairs, shape, in_place)
}

fn plan(n: u32, count: usize, root: u32, shape: (u32, usize), in_place: bool) -> Plan {
    generate(&request(n, count, root, shape, in_place)).unwrap()
}

/// Every rank, on every channel: an entry barrier, one reduce_from per
/// piece of its own block (n pre-scaled sources in rank order, `post`, the
/// root's output as the only destination: local at the root, remote
/// elsewhere), an exit barrier. Rank r reads n·|blocks r| and writes
/// |blocks r|; all ranks together read n·S and write S.
#[test]
fn spread_shape_and_bytes() {
    for n in [2u32, 3, 5, 8, 16, 32, 33] {
        let count = 100 * n as usize + 7;
        for root in [0, n / 2, n - 1] {
            for (channels, chunk) in [(1, 1 << 20), (4, 1 << 20), (3, 17)] {
                let p = plan(n, count, root, (channels, chunk), false);
                for rp in &p.ranks {
                    let r = rp.rank;
                    assert_eq!(rp.max_message(), 0);
                    for (c, ch) in rp.channels.iter().enumerate() {
                        let what = format!("n {n} root {root} rank {r} channel {c}");
                        let syncs = ch.steps.iter().filter(|s| is_sync(s)).count();
                        assert_eq!(syncs, 4 * (n as usize - 1), "{what}");
                        let k = 2 * (n as usize - 1);
                        let middle = &ch.steps[k..ch.steps.len() - k];
                        let range = &split(count, channels as usize)[c];
                        let block = split(range.len(), n as usize)[r as usize].len();
                        assert_eq!(middle.len(), block.div_ceil(chunk), "{what}");
                        for s in middle {
                            let Step::Xfer(x) = s else {
                                panic!("{what}: sync step between the barriers")
                            };
                            assert!(x.post && x.len <= chunk, "{what}");
                            assert_eq!(x.primitive_name(), "reduce_from");
                            assert_eq!(x.srcs.len(), n as usize);
                            for (q, src) in x.srcs.iter().enumerate() {
                                let (peer, at, pre) = match *src {
                                    Src::Local { at, pre } => (r, at, pre),
                                    Src::Remote { peer, at, pre } => (peer, at, pre),
                                    Src::Recv { .. } => panic!("FIFO source"),
                                };
                                assert!(pre && peer == q as u32 && at.buf.0 == 0, "{what}");
                            }
                            let off = match x.srcs[0] {
                                Src::Local { at, .. } | Src::Remote { at, .. } => at.off,
                                Src::Recv { .. } => unreachable!(),
                            };
                            let want = if r == root {
                                Dst::Local(Loc::output(off))
                            } else {
                                Dst::Remote {
                                    peer: root,
                                    at: Loc::output(off),
                                }
                            };
                            assert_eq!(x.dsts, vec![want], "{what}");
                        }
                    }
                    let b = own_blocks(count, channels, n, r);
                    let fair = count / n as usize;
                    assert!(b + channels as usize >= fair && b <= fair + channels as usize);
                    assert_eq!(moved(&p, r as usize), (n as usize * b, b), "rank {r}");
                }
                let total = (0..n as usize)
                    .map(|r| moved(&p, r))
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                assert_eq!(total, (n as usize * count, count), "the (n+1)·S floor");
            }
        }
    }
}

/// Without the exit barrier a rank may return (its caller reusing its
/// input, or the root its output) while peers still read or write it. The
/// race detector's end-of-run check (`race::Race::finish`) reports it.
/// Non-roots must wait for each other too: each reads block r of every
/// non-root's input. And without the entry barrier (on all ranks, or the
/// root's handshakes alone) a rank reads a peer that may not have entered.
#[test]
fn checker_catches_missing_barriers() {
    for in_place in [false, true] {
        for (n, root, shape) in [(2, 1, (1, 1 << 16)), (4, 2, (2, 8)), (8, 0, (3, 5))] {
            let p = plan(n, 97, root, shape, in_place);
            let what = format!("n {n} root {root} in_place={in_place}");
            // The root alone skipping its exit handshakes may return while
            // non-roots still read its input and write its output.
            common::assert_barriers_needed(&p, in_place, root, &what);
            // Without the non-roots' mutual ones, the race is on a
            // non-root's input.
            if n > 2 {
                common::assert_non_roots_need_each_other(&p, root, in_place, &what);
            }
        }
    }
}

/// In place the root's output is its input: block r of it is read (as the
/// root's input) and written by rank r only, in one step, element by
/// element, so the plan needs no scratch and passes. Pointing the writes
/// at the next rank's block makes them collide with that rank's reads of
/// the root's input: the race detector (through the in-place aliasing)
/// reports it.
#[test]
fn in_place_root_blocks_are_private_to_their_reducer() {
    let (n, count, root) = (4, 40, 1);
    let p = plan(n, count, root, (1, 1 << 16), true);
    check_in_place(&p).unwrap();
    assert!(p.ranks.iter().all(|rp| rp.bufs[2].len == 0), "no scratch");
    let mut bad = p.clone();
    for rp in &mut bad.ranks {
        for s in &mut rp.channels[0].steps {
            if let Step::Xfer(x) = s {
                for d in &mut x.dsts {
                    let (Dst::Local(at) | Dst::Remote { at, .. }) = d else {
                        panic!("FIFO destination")
                    };
                    *at = Loc::output((at.off + count / n as usize) % count);
                }
            }
        }
    }
    let m = plan_check_error(check_in_place(&bad));
    assert!(m.contains("unordered"), "{m}");
}

/// Every dtype × op × placement, with roots at both ends, on shapes with
/// uneven, empty and chunked blocks, equal to the sequential reference.
#[test]
fn every_type_op_root_and_placement() {
    for dtype in DataType::ALL {
        for op in OPS
            .into_iter()
            .filter(|&o| op_defined(CollKind::Reduce, dtype, o))
        {
            for in_place in [false, true] {
                for (n, count, root, shape) in [(8, 61, 7, (2, 3)), (3, 2, 0, (2, 1))] {
                    let req = request(n, count, root, shape, in_place);
                    common::run_dtype(&req, dtype, op, 11).unwrap_or_else(|e| {
                        panic!("{dtype} {op} in_place={in_place} n {n} root {root}: {e}")
                    });
                }
            }
        }
    }
}

/// PreMulSum(0.5) on i8 is not a case: its scalar converts to 0, so every
/// output is 0 and a dropped or doubled rank goes unseen (the facade
/// refuses the op); an integer scalar is, and a wrong plan then shows.
#[test]
fn premulsum_half_on_i8_is_not_a_case() {
    let (half, two) = (RedOp::PreMulSum(0.5), RedOp::PreMulSum(2.0));
    assert!(!op_defined(CollKind::Reduce, DataType::I8, half));
    assert!(op_defined(CollKind::Reduce, DataType::I8, two));
    assert!(op_defined(CollKind::Reduce, DataType::F32, half));
    assert_eq!(
        half.lower(DataType::I8, 4).pre_scale.map(i8::from_f64),
        Some(0)
    );
    // With the integer scalar, a plan that drops rank 0's sources is
    // reported wrong; with 0.5 it would not be.
    let req = request(4, 40, 1, (1, 1 << 16), false);
    let p = plan(4, 40, 1, (1, 1 << 16), false);
    let mut bad = p.clone();
    for rp in &mut bad.ranks {
        for s in &mut rp.channels[0].steps {
            if let Step::Xfer(x) = s {
                x.srcs.remove(0);
            }
        }
    }
    let run = |plan: &Plan, op| common::run_plan::<i8>(&req, plan, op, 3);
    assert!(run(&p, two).is_ok());
    let e = run(&bad, two).expect_err("a dropped rank with PreMulSum(2)");
    assert!(e.contains("wrong"), "{e}");
    assert_eq!(run(&bad, half), Ok(()), "with PreMulSum(0.5) it passes");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// Random shapes and roots, up to and past 32 ranks, checked and
    /// compared with the reference.
    #[test]
    fn registered_reduce_random(c in common::random_case(CollKind::Reduce), root in any::<u32>()) {
        // Only ops the type defines: PreMulSum(0.5) on i8 would scale
        // every input to 0 and pass whatever the plan did.
        prop_assert!(op_defined(CollKind::Reduce, c.dtype, c.op), "{} {}", c.dtype, c.op);
        let req = request(c.n, c.count, root % c.n, (c.channels, c.chunk), c.in_place);
        common::run_dtype(&req, c.dtype, c.op, c.seed).map_err(TestCaseError::fail)?;
    }
}
