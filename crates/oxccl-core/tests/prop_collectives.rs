//! Property tests: every collective × every algorithm serving it × all 12
//! data types × every op (where defined) × in place and out of place, on
//! random rank counts (1..=16, some up to 64 with small counts), counts
//! (0, 1, primes, counts not divisible by the rank count), roots, ring
//! orders, channel counts and chunk sizes. Each plan is checked
//! (`interp::check`) and run through the interpreter; the output must
//! equal the sequential reference, exactly except for Avg and
//! non-integer PreMulSum on floats (within `testkit::tolerance`). An op
//! not defined on the type (PreMulSum by 0.5 on integers) is not run.

mod common;

use oxccl_core::gen::supports;
use oxccl_core::testkit::op_defined;
use oxccl_core::testkit::OPS;
use oxccl_core::{Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use proptest::prelude::*;

/// The algorithms serving `kind`, registered variants separate.
fn algos(kind: CollKind) -> Vec<(Algo, bool)> {
    let mut v = Vec::new();
    for a in Algo::ALL {
        if supports(a, kind) {
            if a != Algo::CopyEngine {
                v.push((a, false));
            }
            if matches!(
                a,
                Algo::OneShot | Algo::TwoShot | Algo::AllPairs | Algo::CopyEngine
            ) {
                v.push((a, true));
            }
        }
    }
    v
}

/// A permutation of 0..n from a seed.
fn ring(n: u32, mut x: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n).collect();
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

#[derive(Clone, Debug)]
struct Case {
    n: u32,
    count: usize,
    root: u32,
    algo: usize,
    dtype: DataType,
    op: RedOp,
    in_place: bool,
    channels: u32,
    chunk: usize,
    rings: u8,
    /// 0: one host; else ranks spread over this many hosts (by the seed).
    hosts: u8,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let small = (
        1u32..=16,
        prop_oneof![
            Just(0usize),
            Just(1),
            prop::sample::select(vec![2usize, 3, 5, 7, 11, 13, 17, 31, 61, 127, 251]),
            0usize..400,
        ],
    );
    // Large rank counts with small counts keep the suite fast.
    let large = (17u32..=64, 0usize..12);
    let sizes = prop_oneof![12 => small, 1 => large];
    (
        sizes,
        any::<u32>(),
        any::<usize>(),
        prop::sample::select(DataType::ALL.to_vec()),
        prop::sample::select(OPS.to_vec()),
        any::<bool>(),
        1u32..=4,
        prop_oneof![1usize..8, 8usize..100, Just(1 << 16)],
        0u8..3,
        0u8..5,
        any::<u64>(),
    )
        .prop_map(
            |((n, count), root, algo, dtype, op, in_place, channels, chunk, rings, hosts, seed)| {
                Case {
                    n,
                    count,
                    root: root % n,
                    algo,
                    dtype,
                    op,
                    in_place,
                    channels,
                    chunk,
                    rings,
                    hosts,
                    seed,
                }
            },
        )
}

fn run(kind: CollKind, c: &Case) -> Result<(), TestCaseError> {
    let choices = algos(kind);
    let (algo, registered) = choices[c.algo % choices.len()];
    // An op the collective or the type does not take: Sum instead.
    let op = if op_defined(kind, c.dtype, c.op) {
        c.op
    } else {
        RedOp::Sum
    };
    let root = if kind.has_root() { c.root } else { 0 };
    let mut req = PlanRequest::new(Collective::new(kind, c.count, root), c.n, algo);
    req.in_place = c.in_place;
    req.channels = c.channels;
    req.chunk = c.chunk;
    req.registered = registered;
    req.rings = (0..c.rings)
        .map(|i| ring(c.n, c.seed ^ u64::from(i) << 32))
        .collect();
    if c.hosts > 0 {
        // Any grouping, contiguous in the rings or not.
        let mix = |r: u32| (c.seed ^ u64::from(r).wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 7;
        req.hosts = (0..c.n)
            .map(|r| (mix(r) % u64::from(c.hosts)) as u32)
            .collect();
    }
    common::run_dtype(&req, c.dtype, op, c.seed)
        .map(drop)
        .map_err(|e| TestCaseError::fail(format!("{algo} registered={registered} {op}: {e}")))
}

macro_rules! prop_collective {
    ($name:ident, $kind:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
            #[test]
            fn $name(c in case()) {
                run($kind, &c)?;
            }
        }
    };
}

prop_collective!(all_reduce, CollKind::AllReduce);
prop_collective!(broadcast, CollKind::Broadcast);
prop_collective!(reduce, CollKind::Reduce);
prop_collective!(all_gather, CollKind::AllGather);
prop_collective!(reduce_scatter, CollKind::ReduceScatter);
prop_collective!(all_to_all, CollKind::AllToAll);
prop_collective!(gather, CollKind::Gather);
prop_collective!(scatter, CollKind::Scatter);

/// The whole product of collective × algorithm × dtype × op × in-place on
/// one small shape with uneven blocks, so no combination is left to chance.
#[test]
fn every_combination_once() {
    for kind in CollKind::ALL {
        if kind == CollKind::SendRecv {
            continue;
        }
        for (algo, registered) in algos(kind) {
            for dtype in DataType::ALL {
                let defined = |o: &RedOp| op_defined(kind, dtype, *o);
                for op in OPS.into_iter().filter(defined) {
                    for in_place in [false, true] {
                        if !common::has_plan(algo, kind, registered, in_place, 5) {
                            continue;
                        }
                        let mut req = PlanRequest::new(Collective::new(kind, 11, 2), 5, algo);
                        req.in_place = in_place;
                        req.channels = 2;
                        req.chunk = 2;
                        req.registered = registered;
                        req.rings = vec![vec![3, 0, 4, 2, 1]];
                        if let Err(e) = common::run_dtype(&req, dtype, op, 42) {
                            panic!("{kind} {algo} registered={registered} {dtype} {op} in_place={in_place}: {e}");
                        }
                    }
                }
            }
        }
    }
}
