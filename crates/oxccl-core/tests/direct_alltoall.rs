//! Registered all-pairs AllToAll in place: pairwise swaps. Pinned here:
//! the shape (per channel an entry barrier, one `Step::Swap` per piece of
//! each pair the rank owns, an exit barrier), no scratch, every moved
//! element read once and written once in the buffers (the in-place floor)
//! with the rank's own block untouched, the balance between ranks (n =
//! 2..=16, odd n too), correctness in every type and on random shapes,
//! and the checker's verdicts with either barrier removed or a pair
//! swapped twice. Out of place the plan still pulls (checked too).

mod common;

use common::{is_sync, plan_check_error};
use oxccl_core::gen::split;
use oxccl_core::interp::check_in_place;
use oxccl_core::plan::{Loc, Plan, Rank, Step};
use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use proptest::prelude::*;

fn request(n: u32, count: usize, shape: (u32, usize), in_place: bool) -> PlanRequest {
    let coll = Collective::new(CollKind::AllToAll, count, 0);
    common::registered(coll, n, Algo::AllPairs, shape, in_place)
}

fn plan(n: u32, count: usize, shape: (u32, usize)) -> Plan {
    generate(&request(n, count, shape, true)).unwrap()
}

/// Elements a rank's steps read and write in the buffers (input and
/// output are one buffer in place), and in scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Traffic {
    buf_read: usize,
    buf_written: usize,
    scratch: usize,
}

impl Traffic {
    fn of(p: &Plan, rank: usize) -> Self {
        let mut t = Traffic::default();
        for s in p.ranks[rank].channels.iter().flat_map(|c| &c.steps) {
            match s {
                Step::Swap {
                    at, peer_at, len, ..
                } => {
                    // Both blocks are read and both written.
                    for l in [at, peer_at] {
                        if l.buf.0 == 2 {
                            t.scratch += 2 * len;
                        } else {
                            t.buf_read += len;
                            t.buf_written += len;
                        }
                    }
                }
                Step::Xfer(x) => panic!("transfer in the in-place plan: {x:?}"),
                Step::Signal { .. } | Step::Wait { .. } => {}
            }
        }
        t
    }
}

/// A swap step's fields: this rank's range, the peer, the peer's range,
/// the length.
fn swap(s: &Step) -> Option<(Loc, Rank, Loc, usize)> {
    match *s {
        Step::Swap {
            at,
            peer,
            peer_at,
            len,
        } => Some((at, peer, peer_at, len)),
        _ => None,
    }
}

/// How often each element of each rank's buffer is read and written, by
/// whichever rank's steps.
fn buffer_accesses(p: &Plan) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let len = |r: usize| p.ranks[r].bufs[1].len;
    let mut reads: Vec<Vec<u32>> = (0..p.ranks.len()).map(|r| vec![0; len(r)]).collect();
    let mut writes = reads.clone();
    for rp in &p.ranks {
        for s in rp.channels.iter().flat_map(|c| &c.steps) {
            let Some((at, peer, peer_at, len)) = swap(s) else {
                continue;
            };
            for (owner, l) in [(rp.rank, at), (peer, peer_at)] {
                for tally in [&mut reads, &mut writes] {
                    for e in &mut tally[owner as usize][l.off..l.off + len] {
                        *e += 1;
                    }
                }
            }
        }
    }
    (reads, writes)
}

/// Per channel: an entry barrier, then swaps of one piece (at most `chunk`
/// elements) of the rank's block q with block r of peer q's buffer, at the
/// matching offsets inside the channel's range, then an exit barrier. No
/// scratch.
fn shape(p: &Plan, count: usize, channels: u32, chunk: usize, what: &str) {
    let n = p.nranks as usize;
    let ranges = split(count, channels as usize);
    for rp in &p.ranks {
        let r = rp.rank as usize;
        assert_eq!(rp.bufs[2].len, 0, "{what}: scratch");
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
            for s in &ch.steps[k..ch.steps.len() - k] {
                let Some((at, peer, peer_at, len)) = swap(s) else {
                    panic!("{what}: {s:?}")
                };
                let q = peer as usize;
                assert!(q != r && q < n, "{what}: peer {q}");
                assert!(len > 0 && len <= chunk, "{what}: length {len}");
                assert_eq!(at.buf.0, 1, "{what}");
                assert_eq!(peer_at.buf.0, 1, "{what}");
                let o = at.off - q * count;
                assert!(at.off >= q * count && o < count, "{what}");
                assert_eq!(peer_at.off, r * count + o, "{what}");
                assert!(
                    ranges[c].contains(&o) && ranges[c].contains(&(o + len - 1)),
                    "{what}: offset {o}+{len} outside the channel"
                );
            }
        }
    }
}

/// Bytes: in the buffers every element outside a rank's own block is read
/// exactly once and written exactly once (the in-place floor, 2(n−1)·count
/// per rank on average), the own block never, and nothing goes through
/// scratch. Ranks differ by at most one swapped element, and not at all
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
        assert_eq!(t.scratch, 0, "{what}");
    }
    let total: usize = t.iter().map(|t| t.buf_read).sum();
    assert_eq!(total, n * (n - 1) * count, "{what}: the floor");
    // Elements each rank swaps (each swap reads two).
    let swapped: Vec<usize> = t.iter().map(|t| t.buf_read / 2).collect();
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
                shape(&p, count, channels, chunk, &what);
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

/// The 8-rank sweep on one H200 (256 MiB of f32 per rank: count = 8 Mi
/// elements per block, 16 channels, the facade's 4 MiB registered pieces):
/// per rank 7/8·S read and 7/8·S written in the buffers (S = 8·count, the
/// in-place floor) and nothing else, in one swap per owned pair and
/// channel (3.5 pairs per rank: three owned, the opposite one halved). The
/// plans before moved 14/8·S each way (staged through scratch) and then
/// 7/16·S more each way through an L2-sized scratch piece, in ~196 steps
/// per channel.
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
                scratch: 0,
            },
            "rank {r}"
        );
        for ch in &p.ranks[r].channels {
            let swaps = ch
                .steps
                .iter()
                .filter(|s| matches!(s, Step::Swap { .. }))
                .count();
            assert_eq!(swaps, 4, "rank {r}");
        }
    }
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
        .filter_map(|s| match *s {
            Step::Swap {
                at, peer_at, len, ..
            } => Some(Step::Swap {
                at: peer_at,
                peer: 0,
                peer_at: at,
                len,
            }),
            _ => None,
        })
        .collect();
    assert_eq!(mirrored.len(), 1);
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
