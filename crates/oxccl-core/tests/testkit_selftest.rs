//! Self-tests of the checker: `testkit::compare` on `testkit::input` must
//! accept correct outputs (the sequential reference, and for rounded cases
//! the same reduction in other orders) and report each mutation as wrong,
//! for every data type × op × collective × rank count the suites use.
//!
//! Mutations: a dropped rank (each rank in turn; a sample of four beyond 16
//! ranks), a doubled result, a zero output, a swapped block, an off-by-one
//! offset, and for reductions each rank returning its own input. One that
//! cannot change the output by construction (a swap on one rank, a shift of
//! one element, dropping a rank no output reads) is counted as not
//! applicable; any other that leaves the output unchanged counts as missed,
//! so the inputs are tested too.
//!
//! Run with `--nocapture` for the table of counts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use oxccl_core::testkit::{self, Tolerance, COLLECTIVES, OPS};
use oxccl_core::{reference, with_dtype, CollKind, Collective, DataType, Element, RedOp};

/// Every rank count the suites use: the interpreter's property tests run
/// 1..=64, the host suites 1..=8, the GPU suite 1, 2, 3, 4 and 8.
const RANKS: [u32; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 32, 33, 64];

/// The ops: the suites' list plus a PreMulSum whose scale rounds.
fn ops() -> Vec<RedOp> {
    let mut v = OPS.to_vec();
    v.push(RedOp::PreMulSum(0.3));
    v
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mutation {
    DroppedRank,
    Doubled,
    Zero,
    SwappedBlock,
    OffByOne,
    OwnInput,
}

const MUTATIONS: [Mutation; 6] = [
    Mutation::DroppedRank,
    Mutation::Doubled,
    Mutation::Zero,
    Mutation::SwappedBlock,
    Mutation::OffByOne,
    Mutation::OwnInput,
];

#[derive(Default, Clone, Copy)]
struct Tally {
    tried: u64,
    caught: u64,
    not_applicable: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.tried += o.tried;
        self.caught += o.caught;
        self.not_applicable += o.not_applicable;
    }
}

/// Whether rank `r`'s output is defined (not a non-root of Reduce or Gather).
fn defined(coll: &Collective, r: u32) -> bool {
    !matches!(coll.kind, CollKind::Reduce | CollKind::Gather) || r == coll.root
}

/// The input block rank `r`'s output reduces (ReduceScatter: block r).
fn block(coll: &Collective, r: usize) -> usize {
    if coll.kind == CollKind::ReduceScatter {
        r
    } else {
        0
    }
}

/// Outputs with rank `d`'s contribution lost: reductions over the other
/// ranks (same lowered op, so Avg keeps its 1/n); data movement leaves the
/// elements that come from `d` unwritten (zero). None where no output
/// element depends on `d`.
fn dropped<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    outs: &[Vec<T>],
    op: RedOp,
    d: usize,
) -> Option<Vec<Vec<T>>> {
    let n = inputs.len();
    let c = coll.count;
    let mut m = outs.to_vec();
    if coll.kind.is_reduction() {
        let lowered = op.lower(T::DTYPE, n as u32);
        for (r, out) in m.iter_mut().enumerate() {
            let b = block(coll, r);
            let parts: Vec<&[T]> = (0..n)
                .filter(|&q| q != d)
                .map(|q| &inputs[q][b * c..(b + 1) * c])
                .collect();
            *out = if parts.is_empty() {
                vec![T::default(); c]
            } else {
                lowered.reference(&parts, c)
            };
        }
        return Some(m);
    }
    let root = coll.root as usize;
    match coll.kind {
        CollKind::Broadcast | CollKind::Scatter => {
            if d != root {
                return None;
            }
            for out in &mut m {
                out.fill(T::default());
            }
        }
        // Block d of every output comes from rank d.
        _ => {
            for out in &mut m {
                out[d * c..(d + 1) * c].fill(T::default());
            }
        }
    }
    Some(m)
}

/// Applies `mutation` (variant `d`: the dropped rank). None: not applicable.
fn mutate<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    outs: &[Vec<T>],
    op: RedOp,
    mutation: Mutation,
    d: usize,
) -> Option<Vec<Vec<T>>> {
    let n = inputs.len();
    let c = coll.count;
    let live = |r: usize| defined(coll, r as u32);
    let mut m = outs.to_vec();
    match mutation {
        Mutation::DroppedRank => return dropped(coll, inputs, outs, op, d),
        Mutation::Doubled => {
            for out in m.iter_mut().enumerate().filter(|(r, _)| live(*r)) {
                for x in out.1.iter_mut() {
                    *x = T::from_f64(2.0 * x.to_f64());
                }
            }
        }
        Mutation::Zero => {
            for out in &mut m {
                out.fill(T::default());
            }
        }
        Mutation::SwappedBlock => match coll.kind {
            // n blocks per output: blocks 0 and 1 trade places.
            CollKind::AllGather | CollKind::AllToAll | CollKind::Gather => {
                if n < 2 || c == 0 {
                    return None;
                }
                for out in &mut m {
                    let (a, b) = out.split_at_mut(c);
                    a.swap_with_slice(&mut b[..c]);
                }
            }
            // One block per rank, different on each: ranks 0 and 1 trade.
            CollKind::ReduceScatter | CollKind::Scatter => {
                if n < 2 {
                    return None;
                }
                m.swap(0, 1);
            }
            // One block, the same on every rank: its halves trade.
            _ => {
                let h = c / 2;
                if h == 0 {
                    return None;
                }
                for out in &mut m {
                    let (a, b) = out.split_at_mut(h);
                    a.swap_with_slice(&mut b[..h]);
                }
            }
        },
        Mutation::OffByOne => {
            if outs.iter().all(|o| o.len() < 2) {
                return None;
            }
            // Each output read one element late; the last keeps its value.
            for (out, orig) in m.iter_mut().zip(outs) {
                if out.len() >= 2 {
                    out.rotate_left(1);
                    let last = out.len() - 1;
                    out[last] = orig[last];
                }
            }
        }
        Mutation::OwnInput => {
            if !coll.kind.is_reduction() || n < 2 {
                return None;
            }
            for (r, out) in m.iter_mut().enumerate() {
                let b = block(coll, r);
                out.copy_from_slice(&inputs[r][b * c..(b + 1) * c]);
            }
        }
    }
    Some(m)
}

/// The reduction evaluated in reverse rank order and as a pairwise tree:
/// other legitimate orders, which a rounded comparison must accept.
fn reordered<T: Element>(coll: &Collective, inputs: &[Vec<T>], op: RedOp) -> [Vec<Vec<T>>; 2] {
    let n = inputs.len();
    let c = coll.count;
    let lowered = op.lower(T::DTYPE, n as u32);
    let reverse = (0..n)
        .map(|r| {
            let b = block(coll, r);
            let parts: Vec<&[T]> = (0..n)
                .rev()
                .map(|q| &inputs[q][b * c..(b + 1) * c])
                .collect();
            lowered.reference(&parts, c)
        })
        .collect();
    let tree = (0..n)
        .map(|r| {
            let b = block(coll, r);
            (0..c)
                .map(|i| {
                    let mut level: Vec<T> =
                        (0..n).map(|q| lowered.pre(inputs[q][b * c + i])).collect();
                    while level.len() > 1 {
                        level = level
                            .chunks(2)
                            .map(|p| {
                                if p.len() == 2 {
                                    lowered.base.apply(p[0], p[1])
                                } else {
                                    p[0]
                                }
                            })
                            .collect();
                    }
                    lowered.post(level[0])
                })
                .collect()
        })
        .collect();
    [reverse, tree]
}

/// Every mutation of one case; panics if `compare` rejects a correct output.
fn one_case<T: Element>(
    kind: CollKind,
    n: u32,
    op: RedOp,
    tally: &mut BTreeMap<Mutation, Tally>,
    missed: &mut Vec<String>,
) {
    // At least n elements, so every rank leads (holds the extreme, the
    // factor, the largest term) somewhere; 16 for varied halves.
    let count = (n as usize + 3).max(16);
    let coll = Collective::new(kind, count, n / 2);
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input::<T>(&coll, n, r, op, 17))
        .collect();
    let lowered = op.lower(T::DTYPE, n);
    let outs: Vec<Vec<T>> = reference::expected(&coll, &inputs, &lowered)
        .into_iter()
        .map(|o| o.unwrap_or_else(|| vec![T::default(); coll.output_len(n)]))
        .collect();
    let what = format!("{} {kind} {op:?} n={n}", T::DTYPE);
    let (wrong, first) = testkit::compare(&coll, &inputs, &outs, op);
    assert_eq!(wrong, 0, "{what}: the reference itself rejected: {first:?}");
    if kind.is_reduction() && testkit::tolerance(T::DTYPE, op, n) == Tolerance::Rounded {
        for other in reordered(&coll, &inputs, op) {
            let (wrong, first) = testkit::compare(&coll, &inputs, &other, op);
            assert_eq!(wrong, 0, "{what}: another order rejected: {first:?}");
        }
    }
    let drops: Vec<usize> = if n <= 16 {
        (0..n as usize).collect()
    } else {
        vec![0, 1, n as usize / 2, n as usize - 1]
    };
    for mutation in MUTATIONS {
        let variants = if mutation == Mutation::DroppedRank {
            drops.clone()
        } else {
            vec![0]
        };
        for d in variants {
            let t = tally.entry(mutation).or_default();
            let Some(m) = mutate(&coll, &inputs, &outs, op, mutation, d) else {
                t.not_applicable += 1;
                continue;
            };
            t.tried += 1;
            let (wrong, _) = testkit::compare(&coll, &inputs, &m, op);
            if wrong > 0 {
                t.caught += 1;
            } else {
                missed.push(format!("{what}: {mutation:?} (rank {d}) not reported"));
            }
        }
    }
}

/// Tallies per (dtype, rank count), per mutation, and the misses.
type Outcome = (
    BTreeMap<(DataType, u32), Tally>,
    BTreeMap<Mutation, Tally>,
    Vec<String>,
);

/// The whole product.
fn run_all(dtypes: &[DataType]) -> Outcome {
    let mut by_case = BTreeMap::new();
    let mut by_mutation = BTreeMap::new();
    let mut missed = Vec::new();
    for &dt in dtypes {
        for n in RANKS {
            let mut local = BTreeMap::new();
            for kind in COLLECTIVES {
                for op in ops()
                    .into_iter()
                    .filter(|&o| testkit::op_defined(kind, dt, o))
                {
                    with_dtype!(dt, T => one_case::<T>(kind, n, op, &mut local, &mut missed));
                }
            }
            let mut sum = Tally::default();
            for (m, t) in local {
                sum += t;
                *by_mutation.entry(m).or_insert_with(Tally::default) += t;
            }
            by_case.insert((dt, n), sum);
        }
    }
    (by_case, by_mutation, missed)
}

fn table(by_case: &BTreeMap<(DataType, u32), Tally>) -> String {
    let mut s = String::from("caught/tried (not applicable) per dtype and rank count\n");
    let _ = write!(s, "{:>9}", "dtype");
    for n in RANKS {
        let _ = write!(s, " {:>13}", format!("n={n}"));
    }
    s.push('\n');
    let mut dts: Vec<DataType> = by_case.keys().map(|k| k.0).collect();
    dts.dedup();
    for dt in dts {
        let _ = write!(s, "{:>9}", dt.name());
        for n in RANKS {
            let t = by_case[&(dt, n)];
            let _ = write!(
                s,
                " {:>13}",
                format!("{}/{} ({})", t.caught, t.tried, t.not_applicable)
            );
        }
        s.push('\n');
    }
    s
}

fn check(dtypes: &[DataType]) {
    let (by_case, by_mutation, missed) = run_all(dtypes);
    println!("{}", table(&by_case));
    for (m, t) in &by_mutation {
        println!(
            "{m:?}: {} caught of {} tried, {} not applicable",
            t.caught, t.tried, t.not_applicable
        );
    }
    let total: u64 = by_case.values().map(|t| t.tried).sum();
    assert!(total > 0);
    assert!(
        missed.is_empty(),
        "{} of {total} mutations not reported:\n{}",
        missed.len(),
        missed.join("\n")
    );
}

#[test]
fn checker_reports_every_mutation_of_integer_types() {
    let ints: Vec<DataType> = DataType::ALL
        .into_iter()
        .filter(|d| !d.is_float())
        .collect();
    assert_eq!(ints.len(), 6);
    check(&ints);
}

#[test]
fn checker_reports_every_mutation_of_f16_bf16_f32_f64() {
    check(&[DataType::F16, DataType::Bf16, DataType::F32, DataType::F64]);
}

#[test]
fn checker_reports_every_mutation_of_fp8() {
    check(&[DataType::F8E4M3, DataType::F8E5M2]);
}
