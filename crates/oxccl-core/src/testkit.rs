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
/// values inside the type's exact-integer range for `op`.
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

/// Tolerance (absolute, in units of the value) for float results whose
/// computation is not exact: Avg and PreMulSum with a non-integer scale
/// round at every step, in an order the algorithm chooses.
pub fn tolerance(dtype: crate::DataType, op: RedOp, nranks: u32) -> f64 {
    let inexact = match op {
        RedOp::Avg => dtype.is_float(),
        RedOp::PreMulSum(s) => dtype.is_float() && s.fract() != 0.0,
        _ => false,
    };
    if !inexact {
        return 0.0;
    }
    // Relative epsilon of the type, times the number of roundings.
    let eps = match dtype {
        crate::DataType::F64 => f64::EPSILON,
        crate::DataType::F32 => f32::EPSILON as f64,
        crate::DataType::F16 => 1.0 / 1024.0,
        crate::DataType::Bf16 => 1.0 / 128.0,
        crate::DataType::F8E4M3 => 1.0 / 8.0,
        _ => 1.0 / 4.0,
    };
    eps * 4.0 * f64::from(nranks.max(1)) * 100.0
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
