//! A second implementation of the reduction arithmetic, independent of
//! [`crate::Element`]: integers in i128, wrapped to the type's width;
//! floats computed in f64 and rounded to the type's format by hand (round
//! to nearest, ties to even, gradual underflow; overflow to infinity, or
//! to the largest finite value for fp8, which saturates as CUDA's
//! `__nv_fp8` conversions do). One f64 operation followed by one rounding
//! to a format of p ≤ 24 bits gives the correctly rounded result (f64 has
//! at least 2p + 2 bits, so the double rounding is harmless), which is what
//! the CPU backends and the kernels compute.
//!
//! Golden tests (`tests/golden.rs`) compare [`reduce`] with
//! [`crate::reference::expected`], the interpreter and hand-written values.

use super::format::{exponent, float_format};
use crate::dtype::DataType;
use crate::redop::RedOp;

/// Rounds `v` to the nearest value of float type `dtype`, or wraps the
/// integer `v` (truncated toward zero first, as a conversion does) into
/// integer type `dtype`.
pub fn round(dtype: DataType, v: f64) -> f64 {
    if !dtype.is_float() {
        return wrap(dtype, v.trunc() as i128) as f64;
    }
    if dtype == DataType::F64 || v == 0.0 || !v.is_finite() {
        return v;
    }
    let (prec, emin) = float_format(dtype);
    let q = exponent(v).max(emin) - (prec - 1);
    // Scaling by powers of two is exact; round_ties_even does the rest.
    let r = (v * 2f64.powi(-q)).round_ties_even() * 2f64.powi(q);
    let max = max_finite(dtype);
    if r.abs() <= max {
        r
    } else if matches!(dtype, DataType::F8E4M3 | DataType::F8E5M2) {
        max.copysign(v)
    } else {
        f64::INFINITY.copysign(v)
    }
}

/// The largest finite value of a float type.
pub fn max_finite(dtype: DataType) -> f64 {
    match dtype {
        DataType::F16 => 65504.0,
        DataType::Bf16 => (2.0 - 2f64.powi(-7)) * 2f64.powi(127),
        DataType::F32 => f64::from(f32::MAX),
        DataType::F8E4M3 => 448.0,
        DataType::F8E5M2 => 57344.0,
        _ => f64::MAX,
    }
}

/// `v` modulo 2^bits, as the signed or unsigned integer type holds it.
pub fn wrap(dtype: DataType, v: i128) -> i128 {
    let bits = 8 * dtype.size() as u32;
    let m = v.rem_euclid(1i128 << bits);
    let signed = matches!(dtype, DataType::I8 | DataType::I32 | DataType::I64);
    if signed && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// `op` over `xs` (one value per rank, rank order) as NCCL defines it on
/// `dtype`, each step rounded (or wrapped) to the type: Avg on floats
/// multiplies each input by 1/n rounded to the type, on integers divides
/// the wrapped sum by n truncating toward zero; PreMulSum multiplies each
/// input by the scalar converted to the type. The model cannot read device
/// memory: model a [`RedOp::PreMulSumDevice`] call as `PreMulSum(value)`
/// (passed as is, it is summed unscaled).
pub fn reduce(dtype: DataType, op: RedOp, xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    if dtype.is_float() {
        reduce_float(dtype, op, xs)
    } else {
        reduce_int(dtype, op, xs) as f64
    }
}

fn reduce_float(dt: DataType, op: RedOp, xs: &[f64]) -> f64 {
    let scale = match op {
        RedOp::Avg => Some(round(dt, 1.0 / xs.len() as f64)),
        RedOp::PreMulSum(s) => Some(round(dt, s)),
        _ => None,
    };
    let term = |x: f64| scale.map_or(x, |s| round(dt, x * s));
    let step = |a: f64, b: f64| match op {
        RedOp::Prod => round(dt, a * b),
        // fmax/fmin: a NaN operand loses.
        RedOp::Max => a.max(b),
        RedOp::Min => a.min(b),
        RedOp::Sum | RedOp::Avg | RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_) => {
            round(dt, a + b)
        }
    };
    xs[1..]
        .iter()
        .fold(term(xs[0]), |acc, &x| step(acc, term(x)))
}

fn reduce_int(dt: DataType, op: RedOp, xs: &[f64]) -> i128 {
    let v: Vec<i128> = xs.iter().map(|&x| x as i128).collect();
    let n = v.len() as i128;
    match op {
        RedOp::Sum | RedOp::PreMulSumDevice(_) => wrap(dt, v.iter().sum()),
        // wrapping_mul: mod 2^128 keeps every residue mod 2^64.
        RedOp::Prod => v.iter().fold(1, |a, &b| wrap(dt, a.wrapping_mul(b))),
        RedOp::Max => *v.iter().max().expect("non-empty"),
        RedOp::Min => *v.iter().min().expect("non-empty"),
        // i128 division truncates toward zero, as C's and NCCL's do.
        RedOp::Avg => wrap(dt, wrap(dt, v.iter().sum()) / n),
        RedOp::PreMulSum(s) => {
            let s = wrap(dt, s.trunc() as i128);
            v.iter()
                .fold(0, |a, &b| wrap(dt, a + wrap(dt, b.wrapping_mul(s))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_by_hand() {
        // E4M3: 17 lies between 16 and 18, ties to even mantissa (16).
        assert_eq!(round(DataType::F8E4M3, 17.0), 16.0);
        assert_eq!(round(DataType::F8E4M3, 19.0), 20.0);
        assert_eq!(round(DataType::F8E4M3, 1000.0), 448.0);
        assert_eq!(round(DataType::F8E4M3, 464.0), 448.0);
        // E5M2: 5 is representable? 1.01·2² yes; 9 ties between 8 and 10 → 8.
        assert_eq!(round(DataType::F8E5M2, 9.0), 8.0);
        assert_eq!(round(DataType::F8E5M2, 1e9), 57344.0);
        assert_eq!(round(DataType::F16, 2049.0), 2048.0);
        assert_eq!(round(DataType::F16, 2051.0), 2052.0);
        assert_eq!(round(DataType::F16, 1e6), f64::INFINITY);
        assert_eq!(round(DataType::Bf16, 257.0), 256.0);
        assert_eq!(round(DataType::Bf16, 259.0), 260.0);
        // Subnormal E4M3: spacing 2^-9.
        assert_eq!(round(DataType::F8E4M3, 3.0 * 2f64.powi(-10)), 2f64.powi(-8));
        assert_eq!(wrap(DataType::I8, 200), -56);
        assert_eq!(wrap(DataType::U8, -1), 255);
        assert_eq!(round(DataType::U32, -1.0), f64::from(u32::MAX));
    }
}
