//! Registered all-pairs AllToAll in place: pairwise swaps. Pinned here:
//! the shape (per channel an entry barrier, three one-operand steps per
//! swap piece, an exit barrier), every moved element read once and written
//! once in the buffers (the in-place floor) with the rank's own block
//! untouched, scratch of one piece per channel carrying half the buffer
//! bytes, the balance between ranks (n = 2..=16, odd n too), correctness in
//! every type and on random shapes, and the checker's verdicts with either
//! barrier removed. Out of place the plan still pulls (checked too).

mod common;

use common::{is_sync, plan_check_error};
use oxccl_core::gen::split;
use oxccl_core::interp::check_in_place;
use oxccl_core::plan::{Dst, Loc, Plan, Src, Step};
use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use proptest::prelude::*;

fn request(n: u32, count: usize, shape: (u32, usize), in_place: bool) -> PlanRequest {
    let coll = Collective::new(CollKind::AllToAll, count, 0);
    common::registered(coll, n, Algo::AllPairs, shape, in_place)
}

fn plan(n: u32, count: usize, shape: (u32, usize)) -> Plan {
    generate(&request(n, count, shape, true)).unwrap()
}

/// Elements a rank's steps read and write, split by where they lie: the
/// rank's or a peer's input/output buffer (one buffer in place), or
/// scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Traffic {
    buf_read: usize,
    buf_written: usize,
    scratch_read: usize,
    scratch_written: usize,
}

impl Traffic {
    fn of(p: &Plan, rank: usize) -> Self {
        let mut t = Traffic::default();
        let is_scratch = |at: Loc| at.buf.0 == 2;
        for s in p.ranks[rank].channels.iter().flat_map(|c| &c.steps) {
            let Step::Xfer(x) = s else { continue };
            for src in &x.srcs {
                let (Src::Local { at, .. } | Src::Remote { at, .. }) = *src else {
                    panic!("FIFO source")
                };
                *if is_scratch(at) {
                    &mut t.scratch_read
                } else {
                    &mut t.buf_read
                } += x.len;
            }
            for dst in &x.dsts {
                let (Dst::Local(at) | Dst::Remote { at, .. }) = *dst else {
                    panic!("FIFO destination")
                };
                *if is_scratch(at) {
                    &mut t.scratch_written
                } else {
                    &mut t.buf_written
                } += x.len;
            }
        }
        t
    }
}

/// How often each element of each rank's buffer (input and output are one
/// buffer in place) is read and written, by whichever rank's steps.
fn buffer_accesses(p: &Plan) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let len = |r: usize| p.ranks[r].bufs[1].len;
    let mut reads: Vec<Vec<u32>> = (0..p.ranks.len()).map(|r| vec![0; len(r)]).collect();
    let mut writes = reads.clone();
    for rp in &p.ranks {
        for s in rp.channels.iter().flat_map(|c| &c.steps) {
            let Step::Xfer(x) = s else { continue };
            let bump = |tally: &mut Vec<Vec<u32>>, owner: u32, at: Loc| {
                if at.buf.0 != 2 {
                    for e in &mut tally[owner as usize][at.off..at.off + x.len] {
                        *e += 1;
                    }
                }
            };
            for src in &x.srcs {
                match *src {
                    Src::Local { at, .. } => bump(&mut reads, rp.rank, at),
                    Src::Remote { peer, at, .. } => bump(&mut reads, peer, at),
                    Src::Recv { .. } => panic!("FIFO source"),
                }
            }
            for dst in &x.dsts {
                match *dst {
                    Dst::Local(at) => bump(&mut writes, rp.rank, at),
                    Dst::Remote { peer, at } => bump(&mut writes, peer, at),
                    Dst::Send { .. } => panic!("FIFO destination"),
                }
            }
        }
    }
    (reads, writes)
}

/// Per channel: an entry barrier, then per swap piece three steps of one
/// source and one destination (the peer's piece into scratch, the own
/// piece into the peer's block, scratch into the own block, all at the
/// matching offsets and no longer than the scratch), an exit barrier.
fn shape(p: &Plan, count: usize, channels: u32, what: &str) {
    let n = p.nranks as usize;
    let ranges = split(count, channels as usize);
    for rp in &p.ranks {
        let r = rp.rank as usize;
        let slot = rp.bufs[2].len / channels as usize;
        assert_eq!(rp.bufs[2].len, slot * channels as usize, "{what}");
        for (c, ch) in rp.channels.iter().enumerate() {
            let what = format!("{what} rank {r} channel {c}");
            if ranges[c].is_empty() {
                assert!(ch.steps.is_empty(), "{what}");
                continue;
            }
            let k = 2 * (n - 1);
            assert_eq!(
                ch.steps.iter().filter(|s| is_sync(s)).count(),
                2 * k,
                "{what}"
            );
            assert!(ch.steps[..k].iter().all(is_sync), "{what}: entry");
            assert!(
                ch.steps[ch.steps.len() - k..].iter().all(is_sync),
                "{what}: exit"
            );
            let middle = &ch.steps[k..ch.steps.len() - k];
            assert_eq!(middle.len() % 3, 0, "{what}");
            let tmp = Loc::scratch(c * slot);
            for trio in middle.chunks(3) {
                let xs: Vec<_> = trio
                    .iter()
                    .map(|s| match s {
                        Step::Xfer(x) if x.srcs.len() == 1 && x.dsts.len() == 1 && !x.post => x,
                        other => panic!("{what}: {other:?}"),
                    })
                    .collect();
                let len = xs[0].len;
                assert!(len <= slot && xs.iter().all(|x| x.len == len), "{what}");
                let Src::Remote { peer, at, pre } = xs[0].srcs[0] else {
                    panic!("{what}: {:?}", xs[0])
                };
                assert!(!pre && at.buf.0 == 0, "{what}");
                let (q, o) = (peer as usize, at.off - r * count);
                assert!(q != r && at.off >= r * count && o < count, "{what}");
                assert!(
                    ranges[c].contains(&o),
                    "{what}: offset {o} outside the channel"
                );
                assert_eq!(xs[0].dsts[0], Dst::Local(tmp), "{what}");
                let ours = q * count + o;
                assert_eq!(
                    (xs[1].srcs[0], xs[1].dsts[0]),
                    (
                        Src::Local {
                            at: Loc::input(ours),
                            pre: false
                        },
                        Dst::Remote {
                            peer,
                            at: Loc::output(r * count + o)
                        }
                    ),
                    "{what}"
                );
                assert_eq!(
                    (xs[2].srcs[0], xs[2].dsts[0]),
                    (
                        Src::Local {
                            at: tmp,
                            pre: false
                        },
                        Dst::Local(Loc::output(ours))
                    ),
                    "{what}"
                );
            }
        }
    }
}

/// Bytes: in the buffers every element outside a rank's own block is read
/// exactly once and written exactly once (the in-place floor, 2(n−1)·count
/// per rank on average), the own block never; the scratch carries half as
/// much as the buffers (each swapped element passes through it once), so
/// at most 2·S per rank (S = n·count). Ranks differ by at most one swapped
/// element (three reads and three writes, scratch included), and not at all
/// when n is odd or every channel's range is even (an opposite pair's odd
/// range cannot be halved).
fn bytes(p: &Plan, count: usize, channels: u32, what: &str) {
    let n = p.nranks as usize;
    let (reads, writes) = buffer_accesses(p);
    for q in 0..n {
        for (e, (&rd, &wr)) in reads[q].iter().zip(&writes[q]).enumerate() {
            let want = u32::from(e / count != q);
            assert_eq!((rd, wr), (want, want), "{what}: rank {q} element {e}");
        }
    }
    let t: Vec<Traffic> = (0..n).map(|r| Traffic::of(p, r)).collect();
    for (r, t) in t.iter().enumerate() {
        let what = format!("{what} rank {r}: {t:?}");
        assert_eq!(t.buf_read, t.buf_written, "{what}");
        assert_eq!(t.scratch_read, t.scratch_written, "{what}");
        assert_eq!(2 * t.scratch_read, t.buf_read, "{what}");
        assert!(
            t.scratch_read + t.scratch_written <= 2 * n * count,
            "{what}"
        );
    }
    let total: usize = t.iter().map(|t| t.buf_read).sum();
    assert_eq!(total, n * (n - 1) * count, "{what}: the floor");
    let swapped: Vec<usize> = t.iter().map(|t| t.scratch_read).collect();
    let (lo, hi) = (swapped.iter().min(), swapped.iter().max());
    let even = n % 2 == 1
        || split(count, channels as usize)
            .iter()
            .all(|c| c.len() % 2 == 0);
    let spread = if even { 0 } else { 1 };
    assert!(hi.unwrap() - lo.unwrap() <= spread, "{what}: {swapped:?}");
}

#[test]
fn swap_shape_bytes_and_balance() {
    for n in 2u32..=16 {
        for count in [0, 1, 2, 7, 64, 101 * n as usize + 3] {
            for (channels, chunk) in [(1, 1 << 20), (4, 1 << 20), (3, 5), (16, 2)] {
                let p = plan(n, count, (channels, chunk));
                let what = format!("n {n} count {count} channels {channels} chunk {chunk}");
                shape(&p, count, channels, &what);
                bytes(&p, count, channels, &what);
            }
        }
    }
}

/// One rank: nothing to swap, no scratch, no steps.
#[test]
fn one_rank_in_place_does_nothing() {
    let p = plan(1, 50, (2, 8));
    assert_eq!(p.ranks[0].bufs[2].len, 0);
    assert!(p.ranks[0].channels.iter().all(|c| c.steps.is_empty()));
}

/// The scratch is one piece per channel: the smaller of `chunk` and the
/// swap piece (the constant that keeps it in L2), however large the count.
#[test]
fn scratch_is_one_piece_per_channel() {
    let scratch = |count, shape| plan(8, count, shape).ranks[0].bufs[2].len;
    // Small chunks: a piece is a chunk (or the whole channel if shorter).
    assert_eq!(scratch(1000, (4, 7)), 4 * 7);
    assert_eq!(scratch(10, (4, 7)), 4 * 3);
    // Large chunks: a piece is capped, the same for any larger count.
    let capped = scratch(1 << 24, (16, 1 << 24)) / 16;
    assert!((1 << 12..=1 << 16).contains(&capped), "{capped}");
    assert_eq!(scratch(1 << 26, (16, 1 << 24)), 16 * capped);
    assert_eq!(scratch(1 << 24, (16, capped)), 16 * capped);
    assert_eq!(scratch(1 << 24, (16, capped / 2)), 16 * (capped / 2));
}

/// The 8-rank sweep on one H200 (256 MiB of f32 per rank: count = 8 Mi
/// elements per block, 16 channels, the facade's 4 MiB registered pieces,
/// so the swap piece caps them): per rank
/// 7/8·S read and 7/8·S written in the buffers (S = 8·count, the in-place
/// floor) plus 7/16·S each way through scratch; the staged plan it replaces
/// moved 14/8·S each way (every block into scratch and out again).
#[test]
fn eight_rank_sweep_bytes() {
    let count = 8 << 20;
    let p = plan(8, count, (16, 1 << 20));
    for r in 0..8 {
        let t = Traffic::of(&p, r);
        assert_eq!(
            t,
            Traffic {
                buf_read: 7 * count,
                buf_written: 7 * count,
                scratch_read: 7 * count / 2,
                scratch_written: 7 * count / 2,
            },
            "rank {r}"
        );
    }
    let slot = p.ranks[0].bufs[2].len / 16;
    // 8 ranks × 16 channels of 4-byte scratch pieces, well inside 50 MB.
    assert!(8 * 16 * slot * 4 <= 16 << 20, "{slot}");
}

/// Full barriers at entry and exit, neither removable: without the exit
/// barrier a rank may return while the owner of a swap with it still
/// reads and writes its block; without the entry barrier the owner touches
/// a peer that may not have entered. Removing one rank's handshakes is
/// caught too (every rank has a peer that swaps with it).
#[test]
fn checker_catches_missing_barriers() {
    for (n, count, shape) in [
        (2, 9, (1, 1 << 16)),
        (3, 40, (2, 8)),
        (4, 33, (2, 5)),
        (5, 20, (3, 4)),
        (8, 61, (3, 5)),
    ] {
        let p = plan(n, count, shape);
        for lone in [0, n - 1] {
            common::assert_barriers_needed(&p, true, lone, &format!("n {n} lone {lone}"));
        }
    }
}

/// Both ranks of a pair swapping it (instead of its owner alone) race: the
/// checker reports it.
#[test]
fn a_pair_swapped_twice_races() {
    let (n, count) = (3u32, 12usize);
    let p = plan(n, count, (1, 1 << 16));
    // Rank 0 owns {0, 1} and nothing else; give rank 1 the same swap,
    // mirrored.
    let mut bad = p.clone();
    let mirrored: Vec<Step> = p.ranks[0].channels[0]
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Xfer(x) => Some(x),
            _ => None,
        })
        .map(|x| {
            let mut y = x.clone();
            let flip = |off: usize| (off + count) % (2 * count);
            for s in &mut y.srcs {
                match s {
                    Src::Remote { peer, at, .. } => {
                        *peer = 0;
                        at.off = flip(at.off);
                    }
                    Src::Local { at, .. } if at.buf.0 != 2 => at.off = flip(at.off),
                    _ => {}
                }
            }
            for d in &mut y.dsts {
                match d {
                    Dst::Remote { peer, at } => {
                        *peer = 0;
                        at.off = flip(at.off);
                    }
                    Dst::Local(at) if at.buf.0 != 2 => at.off = flip(at.off),
                    _ => {}
                }
            }
            Step::Xfer(y)
        })
        .collect();
    assert_eq!(mirrored.len(), 3);
    let steps = &mut bad.ranks[1].channels[0].steps;
    let k = 2 * (n as usize - 1);
    steps.splice(k..k, mirrored);
    let m = plan_check_error(check_in_place(&bad));
    assert!(m.contains("unordered"), "{m}");
}

/// Every dtype, in place and out of place, on shapes with uneven, empty
/// and chunked blocks, equal to the sequential reference.
#[test]
fn every_type_and_placement() {
    for dtype in DataType::ALL {
        for in_place in [false, true] {
            for (n, count, shape) in [
                (2, 7, (2, 3)),
                (3, 10, (1, 4)),
                (8, 61, (16, 4)),
                (8, 61, (2, 1 << 16)),
                (7, 1, (3, 2)),
                (16, 9, (4, 2)),
            ] {
                let req = request(n, count, shape, in_place);
                common::run_dtype(&req, dtype, RedOp::Sum, 3).unwrap_or_else(|e| {
                    panic!("{dtype} in_place={in_place} n {n} count {count}: {e}")
                });
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// Random shapes (ranks up to 34, counts not divisible, channels,
    /// chunks), mostly in place: checked and compared with the reference.
    #[test]
    fn registered_all_to_all_random(c in common::random_case(CollKind::AllToAll), flip in 0u8..4) {
        let in_place = c.in_place || flip > 0;
        let req = request(c.n, c.count, (c.channels, c.chunk), in_place);
        common::run_dtype(&req, c.dtype, c.op, c.seed).map_err(TestCaseError::fail)?;
    }
}
