//! `gen::reduces_in_rank_order`, proven on plans: with an operator that is
//! neither associative nor commutative, a plan gives the sequential
//! reference's bits exactly when every element is folded left to right
//! over the original inputs in rank order 0..n−1. Every algorithm the
//! predicate names must do so for every shape tried (rank counts, counts,
//! channels, pieces, ring orders, registered or not, in place or not);
//! every other algorithm serving a reduction must differ somewhere, so
//! the predicate names no algorithm it should not and misses none.

mod common;

use common::served;
use oxccl_core::gen::reduces_in_rank_order;
use oxccl_core::interp::{self, InterpOptions};
use oxccl_core::plan::BufId;
use oxccl_core::{
    generate, reference, Algo, CollKind, Collective, DataType, Element, PlanRequest, RedOp,
};

/// A word whose "sum" remembers the order of its operands:
/// `a + b = rotl(a, 7) * K + b` (wrapping). A left fold over x0..xn−1 is
/// a polynomial in K that any other bracketing or order changes (for
/// random words, but for a vanishing chance), so a plan matching the
/// reference bit for bit folds in rank order.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Ordered(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Element for Ordered {
    // The interpreter only needs a data type for the op's lowering; Sum on
    // U64 has no pre-scale and no post-division.
    const DTYPE: DataType = DataType::U64;
    fn from_f64(v: f64) -> Self {
        Ordered(v as u64)
    }
    fn to_f64(self) -> f64 {
        self.0 as f64
    }
    fn add(self, o: Self) -> Self {
        Ordered(self.0.rotate_left(7).wrapping_mul(K).wrapping_add(o.0))
    }
    fn mul(self, o: Self) -> Self {
        Ordered(self.0.wrapping_mul(o.0))
    }
    fn maximum(self, o: Self) -> Self {
        Ordered(self.0.max(o.0))
    }
    fn minimum(self, o: Self) -> Self {
        Ordered(self.0.min(o.0))
    }
    fn div_count(self, n: u32) -> Self {
        Ordered(self.0 / u64::from(n))
    }
    fn bits_eq(self, o: Self) -> bool {
        self == o
    }
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A permutation of 0..n from a seed.
fn ring(n: u32, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    let mut v: Vec<u32> = (0..n).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
    }
    v
}

/// Whether `req`'s plan gives the reference's bits on every rank whose
/// output the collective defines.
fn matches_reference(req: &PlanRequest, seed: u64) -> bool {
    let plan = generate(req).unwrap_or_else(|e| panic!("{req:?}: {e}"));
    let n = req.nranks;
    let mut x = seed | 1;
    let inputs: Vec<Vec<Ordered>> = (0..n)
        .map(|_| {
            (0..req.coll.input_len(n))
                .map(|_| Ordered(xorshift(&mut x)))
                .collect()
        })
        .collect();
    let mut mem = interp::memories(&plan, &inputs, req.in_place);
    let op = RedOp::Sum.lower(DataType::U64, n);
    let opts = InterpOptions {
        seed,
        ..InterpOptions::default()
    };
    interp::run(&plan, &mut mem, &op, &opts).unwrap_or_else(|e| panic!("{req:?}: {e}"));
    let want = reference::expected(&req.coll, &inputs, &op);
    mem.iter().zip(want).all(|(m, w)| match w {
        Some(w) => m.read_buf(BufId::OUTPUT) == w,
        None => true,
    })
}

/// The shapes tried for `(algo, kind)`: rank counts, counts, channels,
/// pieces, ring orders, registered and FIFO variants, both placements.
fn shapes(algo: Algo, kind: CollKind) -> Vec<PlanRequest> {
    let mut v = Vec::new();
    let mut seed = 0x5EED_u64;
    for n in [1u32, 2, 3, 4, 5, 8, 9] {
        for count in [0usize, 1, 7, 37, 130] {
            for (channels, chunk) in [(1u32, 1 << 16), (2, 3), (3, 16), (4, 1)] {
                for in_place in [false, true] {
                    for registered in [false, true] {
                        let direct = matches!(algo, Algo::OneShot | Algo::TwoShot | Algo::AllPairs);
                        if registered && !direct {
                            continue;
                        }
                        seed = seed.wrapping_add(0x9E37);
                        let root = (seed % u64::from(n)) as u32;
                        let mut req = PlanRequest::new(Collective::new(kind, count, root), n, algo);
                        req.channels = channels;
                        req.chunk = chunk;
                        req.in_place = in_place;
                        req.registered = registered;
                        req.rings = (0..channels)
                            .map(|c| ring(n, seed + u64::from(c)))
                            .collect();
                        v.push(req);
                    }
                }
            }
        }
    }
    v
}

#[test]
fn the_predicate_is_exactly_the_plans_that_fold_in_rank_order() {
    let mut checked = 0;
    for (algo, kind) in served().filter(|(_, k)| k.is_reduction()) {
        let reqs = shapes(algo, kind);
        let differ: Vec<&PlanRequest> = reqs
            .iter()
            .enumerate()
            .filter(|(i, r)| !matches_reference(r, *i as u64 + 1))
            .map(|(_, r)| r)
            .collect();
        if reduces_in_rank_order(algo, kind) {
            assert!(
                differ.is_empty(),
                "{algo} {kind}: {} of {} shapes fold out of rank order, first {:?}",
                differ.len(),
                reqs.len(),
                differ[0]
            );
        } else {
            assert!(
                !differ.is_empty(),
                "{algo} {kind} folds in rank order in every shape tried: name it deterministic"
            );
        }
        checked += reqs.len();
    }
    assert!(checked > 3000, "only {checked} plans");
}

#[test]
fn the_predicate_covers_what_serves() {
    for kind in CollKind::ALL {
        for algo in Algo::ALL {
            if reduces_in_rank_order(algo, kind) {
                assert!(oxccl_core::gen::supports(algo, kind), "{algo} {kind}");
            }
        }
        // Every reduction keeps at least one deterministic algorithm, and
        // every data-movement collective all of its algorithms.
        if kind != CollKind::SendRecv {
            let any = Algo::ALL.iter().any(|&a| reduces_in_rank_order(a, kind));
            assert!(any, "{kind} has no deterministic algorithm");
        }
        if !kind.is_reduction() {
            for algo in Algo::ALL {
                assert_eq!(
                    reduces_in_rank_order(algo, kind),
                    oxccl_core::gen::supports(algo, kind),
                    "{algo} {kind}"
                );
            }
        }
    }
}
