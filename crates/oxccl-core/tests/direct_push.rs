//! Registered all-pairs Broadcast and AllGather, pushed: their shape (per
//! channel an entry barrier, one step per piece reading it once and
//! writing it into every output, an exit barrier), the bytes each rank
//! moves (the HBM floors: Broadcast (n+1)·S out of place and n·S in place,
//! spread 1/n per rank; AllGather n·(S/n + S)), every output element
//! written exactly once, the pull fallback above 128 ranks, correctness in
//! every type, root and placement, and the checker's verdicts on
//! deliberately broken variants.

mod common;

use common::{is_sync, moved, own_blocks, plan_check_error};
use oxccl_core::gen::{split, MAX_PUSH_RANKS, PUSH_GROUP};
use oxccl_core::interp::check_in_place;
use oxccl_core::plan::{Dst, Loc, Plan, Src, Step};
use oxccl_core::testkit::{op_defined, OPS};
use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use proptest::prelude::*;

const KINDS: [CollKind; 2] = [CollKind::Broadcast, CollKind::AllGather];

fn request(
    kind: CollKind,
    n: u32,
    count: usize,
    root: u32,
    shape: (u32, usize),
    in_place: bool,
) -> PlanRequest {
    let coll = Collective::new(kind, count, root);
    common::registered(coll, n, Algo::AllPairs, shape, in_place)
}

fn plan(req: &PlanRequest) -> Plan {
    generate(req).unwrap()
}

/// How often each element of each rank's output is written, by whichever
/// rank's steps.
fn output_writes(p: &Plan) -> Vec<Vec<u32>> {
    let mut w: Vec<Vec<u32>> = p.ranks.iter().map(|rp| vec![0; rp.bufs[1].len]).collect();
    for rp in &p.ranks {
        for s in rp.channels.iter().flat_map(|c| &c.steps) {
            let Step::Xfer(x) = s else { continue };
            for d in &x.dsts {
                let (owner, at) = match *d {
                    Dst::Local(at) => (rp.rank, at),
                    Dst::Remote { peer, at } => (peer, at),
                    Dst::Send { .. } => panic!("FIFO destination"),
                };
                assert_eq!(at.buf.0, 1, "writes only outputs");
                for e in &mut w[owner as usize][at.off..at.off + x.len] {
                    *e += 1;
                }
            }
        }
    }
    w
}

/// Where a source lies: (owner, offset); panics unless it is an input.
fn source(rank: u32, src: &Src) -> (u32, usize) {
    let (owner, at, pre) = match *src {
        Src::Local { at, pre } => (rank, at, pre),
        Src::Remote { peer, at, pre } => (peer, at, pre),
        Src::Recv { .. } => panic!("FIFO source"),
    };
    assert!(!pre && at.buf.0 == 0, "a plain read of an input");
    (owner, at.off)
}

/// Every rank, on every channel: an entry barrier, one step per piece with
/// one source (Broadcast: rank r's block of the root's input; AllGather:
/// the rank's own input) and one destination per rank (its own output
/// first, locally, then every peer's remotely; in place without the buffer
/// that already holds the bytes), an exit barrier. Bytes per rank and in
/// all are the floors, and every output element is written exactly once
/// (in place: except those already there).
#[test]
fn push_shape_and_bytes() {
    for n in [1u32, 2, 3, 5, 8, 16, MAX_PUSH_RANKS] {
        let count = 100 * n as usize + 7;
        for kind in KINDS {
            for root in [0, n / 2, n - 1] {
                for (channels, chunk) in [(1, 1 << 20), (4, 1 << 20), (3, 17)] {
                    for in_place in [false, true] {
                        let p = plan(&request(kind, n, count, root, (channels, chunk), in_place));
                        let what = format!("{kind} n {n} root {root} in_place={in_place}");
                        shape(&p, kind, count, channels, chunk, in_place, &what);
                        bytes(&p, kind, count, channels, in_place, &what);
                    }
                }
            }
        }
    }
}

fn shape(
    p: &Plan,
    kind: CollKind,
    count: usize,
    channels: u32,
    chunk: usize,
    in_place: bool,
    what: &str,
) {
    let (n, root) = (p.nranks, p.coll.unwrap().root);
    let broadcast = kind == CollKind::Broadcast;
    for rp in &p.ranks {
        let r = rp.rank;
        assert_eq!(rp.max_message(), 0, "{what}");
        assert_eq!(rp.bufs[2].len, 0, "{what}: no scratch");
        for (c, ch) in rp.channels.iter().enumerate() {
            let what = format!("{what} rank {r} channel {c}");
            let range = &split(count, channels as usize)[c];
            let span = if broadcast {
                let b = &split(range.len(), n as usize)[r as usize];
                range.start + b.start..range.start + b.end
            } else {
                range.clone()
            };
            if range.is_empty() {
                assert!(ch.steps.is_empty(), "{what}");
                continue;
            }
            let syncs = ch.steps.iter().filter(|s| is_sync(s)).count();
            assert_eq!(syncs, 4 * (n as usize - 1), "{what}");
            let k = 2 * (n as usize - 1);
            let middle = &ch.steps[k..ch.steps.len() - k];
            // Nothing to write: one rank holding its bytes already.
            let idle = n == 1 && in_place;
            // One step per piece and group of up to PUSH_GROUP outputs.
            let fan = n as usize - usize::from(in_place);
            let groups = fan.div_ceil(PUSH_GROUP);
            let want = if idle {
                0
            } else {
                span.len().div_ceil(chunk) * groups
            };
            assert_eq!(middle.len(), want, "{what}");
            let mut next = span.start;
            for piece in middle.chunks(groups.max(1)) {
                let xs: Vec<_> = piece
                    .iter()
                    .map(|s| match s {
                        Step::Xfer(x) => x,
                        _ => panic!("{what}: sync step between the barriers"),
                    })
                    .collect();
                let x = xs[0];
                assert!(!x.post && x.len <= chunk && x.srcs.len() == 1, "{what}");
                for y in &xs {
                    assert!(y.srcs == x.srcs && y.len == x.len && !y.post, "{what}");
                    assert!(!y.dsts.is_empty() && y.dsts.len() <= PUSH_GROUP, "{what}");
                }
                let (owner, off) = source(r, &x.srcs[0]);
                assert_eq!(off, next, "{what}: pieces in order");
                next += x.len;
                assert_eq!(owner, if broadcast { root } else { r }, "{what}");
                // The offset in every output, and the buffer that in place
                // already holds the bytes.
                let (at, already) = if broadcast {
                    (off, root)
                } else {
                    (r as usize * count + off, r)
                };
                let dst = |q: u32| {
                    if q == r {
                        Dst::Local(Loc::output(at))
                    } else {
                        Dst::Remote {
                            peer: q,
                            at: Loc::output(at),
                        }
                    }
                };
                let dsts: Vec<Dst> = (0..n)
                    .map(|k| (r + k) % n)
                    .filter(|&q| !(in_place && q == already))
                    .map(dst)
                    .collect();
                let got: Vec<Dst> = xs.iter().flat_map(|y| y.dsts.iter().copied()).collect();
                assert_eq!(got, dsts, "{what}");
            }
            if !idle {
                assert_eq!(next, span.end, "{what}: the whole span");
            }
        }
    }
}

fn bytes(p: &Plan, kind: CollKind, count: usize, channels: u32, in_place: bool, what: &str) {
    let (n, root) = (p.nranks, p.coll.unwrap().root);
    let nn = n as usize;
    // Destinations per step: every rank's output, less the one already
    // holding the bytes in place.
    let fan = if in_place { nn - 1 } else { nn };
    for r in 0..n {
        let read = match kind {
            CollKind::Broadcast => {
                let b = own_blocks(count, channels, n, r);
                let fair = count / nn;
                assert!(b + channels as usize >= fair && b <= fair + channels as usize);
                b
            }
            _ => count,
        };
        // One rank in place has nothing to move (and reads nothing); each
        // group of up to PUSH_GROUP outputs reads the piece once.
        let groups = fan.div_ceil(PUSH_GROUP);
        assert_eq!(
            moved(p, r as usize),
            (groups * read, fan * read),
            "{what} rank {r}"
        );
    }
    let total = (0..nn)
        .map(|r| moved(p, r))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // S: one output's size; all inputs are read once per group of
    // PUSH_GROUP outputs and every output byte not already in place is
    // written once.
    let s = p.ranks[0].bufs[1].len;
    let reads = |fan: usize| fan.div_ceil(PUSH_GROUP) * s;
    let floor = match (kind, in_place) {
        (_, true) if nn == 1 => (0, 0),
        (CollKind::Broadcast, false) => (reads(nn), nn * s),
        (CollKind::Broadcast, true) => (reads(nn - 1), (nn - 1) * s),
        (_, false) => (reads(nn), nn * s),
        (_, true) => (reads(nn - 1), nn * s - s),
    };
    assert_eq!(total, floor, "{what}: the floor");
    for (q, w) in output_writes(p).iter().enumerate() {
        for (e, &times) in w.iter().enumerate() {
            let there = in_place
                && match kind {
                    CollKind::Broadcast => q as u32 == root,
                    _ => e / count == q,
                };
            let want = u32::from(!there);
            assert_eq!(times, want, "{what}: output of rank {q} element {e}");
        }
    }
}

/// Above [`MAX_PUSH_RANKS`] a step would need more destinations than the
/// CUDA executor takes: both pull (one destination per step, this rank's
/// own output, no remote write), and stay correct.
#[test]
fn pull_above_the_operand_limit() {
    let n = MAX_PUSH_RANKS + 1;
    for kind in KINDS {
        for in_place in [false, true] {
            let req = request(kind, n, 70, 3, (2, 16), in_place);
            let p = common::run_dtype(&req, DataType::F32, oxccl_core::RedOp::Sum, 5)
                .unwrap_or_else(|e| panic!("{kind} in_place={in_place}: {e}"));
            for rp in &p.ranks {
                for s in rp.channels.iter().flat_map(|c| &c.steps) {
                    if let Step::Xfer(x) = s {
                        assert!(
                            matches!(x.dsts[..], [Dst::Local(_)]),
                            "{kind} in_place={in_place} rank {}: {x:?}",
                            rp.rank
                        );
                    }
                }
            }
        }
    }
}

/// Without the exit barrier a rank may return (its caller reusing its
/// output, or the root its input) while peers still write or read it;
/// without the entry barrier a rank touches a peer that may not have
/// entered. Removing the handshakes with one rank only (the root for
/// Broadcast, whose input everyone reads; any rank for AllGather, whose
/// output everyone writes) is caught too, naming that rank, and so is
/// removing those between non-roots in Broadcast (they write each other's
/// outputs).
#[test]
fn checker_catches_missing_barriers() {
    for kind in KINDS {
        for in_place in [false, true] {
            for (n, root, shape) in [(2, 1, (1, 1 << 16)), (4, 2, (2, 8)), (8, 0, (3, 5))] {
                let p = plan(&request(kind, n, 97, root, shape, in_place));
                let what = format!("{kind} n {n} root {root} in_place={in_place}");
                let lone = if kind == CollKind::Broadcast {
                    root
                } else {
                    n - 1
                };
                common::assert_barriers_needed(&p, in_place, lone, &what);
                if kind == CollKind::Broadcast && n > 2 {
                    common::assert_non_roots_need_each_other(&p, root, in_place, &what);
                }
            }
        }
    }
}

/// In place, rank r's writes may not touch a block another rank still
/// reads: pointing every rank's writes at the next rank's block (and, for
/// Broadcast, adding the root's buffer as a destination) makes them
/// collide with that rank's read of the same element, which the race
/// detector reports through the in-place aliasing.
#[test]
fn in_place_writes_never_touch_what_another_rank_reads() {
    let (n, count, root) = (4u32, 40usize, 1u32);
    for kind in KINDS {
        let p = plan(&request(kind, n, count, root, (1, 1 << 16), true));
        check_in_place(&p).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let shift = if kind == CollKind::Broadcast {
            count / n as usize
        } else {
            count
        };
        let len = p.ranks[0].bufs[1].len;
        let mut bad = p.clone();
        for rp in &mut bad.ranks {
            for s in &mut rp.channels[0].steps {
                let Step::Xfer(x) = s else { continue };
                for d in &mut x.dsts {
                    let (Dst::Local(at) | Dst::Remote { at, .. }) = d else {
                        panic!("FIFO destination")
                    };
                    *at = Loc::output((at.off + shift) % len);
                }
                if kind == CollKind::Broadcast && rp.rank != root {
                    let at = x.dsts[0];
                    let (Dst::Local(at) | Dst::Remote { at, .. }) = at else {
                        unreachable!()
                    };
                    x.dsts.push(Dst::Remote { peer: root, at });
                }
            }
        }
        let m = plan_check_error(check_in_place(&bad));
        assert!(m.contains("unordered"), "{kind}: {m}");
    }
}

/// Every dtype × placement (these collectives reduce nothing, so the only
/// op that applies is Sum), with roots at both ends, on shapes with uneven, empty and
/// chunked blocks and at the 128-rank push limit, equal to the sequential
/// reference.
#[test]
fn every_type_op_root_and_placement() {
    for kind in KINDS {
        for dtype in DataType::ALL {
            for op in OPS.into_iter().filter(|&o| op_defined(kind, dtype, o)) {
                for in_place in [false, true] {
                    for (n, count, root, shape) in [
                        (8, 61, 7, (2, 3)),
                        (8, 61, 0, (16, 4)),
                        (3, 2, 0, (2, 1)),
                        (1, 5, 0, (2, 2)),
                        (MAX_PUSH_RANKS, 70, MAX_PUSH_RANKS - 1, (2, 5)),
                    ] {
                        let req = request(kind, n, count, root, shape, in_place);
                        common::run_dtype(&req, dtype, op, 11).unwrap_or_else(|e| {
                            panic!("{kind} {dtype} {op} in_place={in_place} n {n} root {root}: {e}")
                        });
                    }
                }
            }
        }
    }
}

/// A push group set by the request (`OXCCL_PUSH_GROUP`) bounds every
/// step's outputs instead of `PUSH_GROUP`, with the same result.
#[test]
fn a_requested_push_group_bounds_each_step() {
    for kind in KINDS {
        for in_place in [false, true] {
            for (n, g) in [(8u32, 3usize), (6, 1), (40, 64)] {
                let mut req = request(kind, n, 5 * n as usize + 1, n - 1, (2, 3), in_place);
                req.push_group = Some(g);
                let p = plan(&req);
                let what = format!("{kind} n {n} g {g} in_place={in_place}");
                for s in p
                    .ranks
                    .iter()
                    .flat_map(|r| &r.channels)
                    .flat_map(|c| &c.steps)
                {
                    if let Step::Xfer(x) = s {
                        assert!(x.dsts.len() <= g, "{what}: {} outputs", x.dsts.len());
                    }
                }
                common::run_dtype(&req, DataType::F32, RedOp::Sum, 5)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Random shapes and roots, up to 34 ranks, checked and
    /// compared with the reference.
    #[test]
    fn registered_broadcast_random(c in common::random_case(CollKind::Broadcast), root in any::<u32>()) {
        let req = request(CollKind::Broadcast, c.n, c.count, root % c.n, (c.channels, c.chunk), c.in_place);
        common::run_dtype(&req, c.dtype, c.op, c.seed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn registered_all_gather_random(c in common::random_case(CollKind::AllGather)) {
        let req = request(CollKind::AllGather, c.n, c.count, 0, (c.channels, c.chunk), c.in_place);
        common::run_dtype(&req, c.dtype, c.op, c.seed).map_err(TestCaseError::fail)?;
    }
}
