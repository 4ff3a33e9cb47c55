//! Shared test support: inputs whose results are exact, and comparison
//! against [`crate::reference`]. Used by every backend's test suite, so
//! one test body serves them all.

use crate::coll::{CollKind, Collective};
use crate::element::Element;
use crate::redop::{LoweredOp, RedOp};

/// Deterministic input for `rank`: small integers (so sums and products of
/// up to `nranks` of them are exact in every float type), varied by seed.
///
/// Values lie in `1..=bound` where `bound` keeps the reduction of `nranks`
/// values inside the type's exact-integer range for `op`. Where even
/// `nranks` ones would leave that range (8-bit floats on many ranks), each
/// element is 1 on at most `cap` ranks (rotating with the element index)
/// and 0 elsewhere, so sums stay exact in any order.
pub fn input<T: Element>(
    coll: &Collective,
    nranks: u32,
    rank: u32,
    op: RedOp,
    seed: u64,
) -> Vec<T> {
    let len = coll.input_len(nranks);
    let n = u64::from(nranks.max(1));
    let range = T::DTYPE.exact_int_range();
    let bound = match op {
        // Products: only 1s and 2s, and only where 2^n stays exact.
        RedOp::Prod => {
            if n < 63 && (1u64 << n.min(62)) <= range {
                2
            } else {
                1
            }
        }
        // PreMulSum by 2 doubles each term.
        RedOp::PreMulSum(s) => {
            ((range as f64 / (n as f64 * s.abs().max(1.0))) as u64).clamp(1, 100)
        }
        _ => (range / n).clamp(1, 100),
    };
    // Terms a sum may hold before leaving the exact range.
    let cap = match op {
        RedOp::PreMulSum(s) => (range as f64 / s.abs().max(1.0)) as u64,
        RedOp::Sum | RedOp::Avg => range,
        _ => u64::MAX,
    };
    if n > cap {
        return (0..len as u64)
            .map(|i| T::from_f64(f64::from(u8::from((u64::from(rank) + i) % n < cap))))
            .collect();
    }
    let mut x = seed ^ (u64::from(rank) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_f64((1 + x % bound) as f64)
        })
        .collect()
}

/// Relative tolerance for float results whose computation is not exact:
/// Avg and PreMulSum with a non-integer scale round at every step, in an
/// order the algorithm chooses. Everything else (integers; floats filled
/// by [`input`] with small integers) must match exactly: 0.
///
/// Bound: a pre-scaled sum of n non-negative terms computed in any order
/// is within (n + 1)·u·|sum| of the exact value (u = ε/2, half the type's
/// machine epsilon: one rounding for the scale, n − 1 for the additions),
/// and so is the reference; so |got − expected| ≤ (n + 1)·ε·max(|expected|, 1).
/// Twice that is allowed, for the rounding of the scale itself and
/// subnormal results in the 8-bit types.
pub fn tolerance(dtype: crate::DataType, op: RedOp, nranks: u32) -> f64 {
    let inexact = match op {
        RedOp::Avg => dtype.is_float(),
        RedOp::PreMulSum(s) => dtype.is_float() && s.fract() != 0.0,
        _ => false,
    };
    if !inexact {
        return 0.0;
    }
    // Machine epsilon: 2^-(mantissa bits).
    let eps = match dtype {
        crate::DataType::F64 => f64::EPSILON,
        crate::DataType::F32 => f64::from(f32::EPSILON),
        crate::DataType::F16 => 1.0 / 1024.0,
        crate::DataType::Bf16 => 1.0 / 128.0,
        crate::DataType::F8E4M3 => 1.0 / 8.0,
        _ => 1.0 / 4.0,
    };
    2.0 * eps * f64::from(nranks.max(1) + 1)
}

/// Compares outputs with the reference. Returns the number of wrong
/// elements and a description of the first one.
pub fn compare<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
    op: RedOp,
) -> (u64, Option<String>) {
    let n = inputs.len() as u32;
    let lowered: LoweredOp = op.lower(T::DTYPE, n);
    let expected = crate::reference::expected(coll, inputs, &lowered);
    let tol = tolerance(T::DTYPE, op, n);
    let mut wrong = 0u64;
    let mut first = None;
    for (r, (exp, got)) in expected.iter().zip(outputs).enumerate() {
        let Some(exp) = exp else { continue };
        if got.len() < exp.len() {
            wrong += (exp.len() - got.len()) as u64;
            first.get_or_insert_with(|| {
                format!(
                    "rank {r}: output has {} elements, expected {}",
                    got.len(),
                    exp.len()
                )
            });
        }
        for (i, (e, g)) in exp.iter().zip(got).enumerate() {
            let ok = if tol == 0.0 {
                e.bits_eq(*g) || (e.to_f64().is_nan() && g.to_f64().is_nan())
            } else {
                (e.to_f64() - g.to_f64()).abs() <= tol * e.to_f64().abs().max(1.0)
            };
            if !ok {
                wrong += 1;
                first.get_or_insert_with(|| {
                    format!("rank {r} element {i}: expected {e:?}, got {g:?}")
                });
            }
        }
    }
    (wrong, first)
}

/// Whether `op` is defined for collective `kind` (reductions only take ops).
pub fn op_applies(kind: CollKind, op: RedOp) -> bool {
    kind.is_reduction() || op == RedOp::Sum
}

/// Every collective the shared suites run (Send/Recv has its own tests).
pub const COLLECTIVES: [CollKind; 8] = [
    CollKind::AllReduce,
    CollKind::Broadcast,
    CollKind::Reduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::AllToAll,
    CollKind::Gather,
    CollKind::Scatter,
];

/// Every reduction op the shared suites try (where it applies): the five
/// built-ins, an exact PreMulSum and an inexact one.
pub const OPS: [RedOp; 7] = [
    RedOp::Sum,
    RedOp::Prod,
    RedOp::Max,
    RedOp::Min,
    RedOp::Avg,
    RedOp::PreMulSum(2.0),
    RedOp::PreMulSum(0.5),
];
