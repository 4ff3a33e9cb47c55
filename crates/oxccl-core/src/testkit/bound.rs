//! How close a result must be: exact where the arithmetic is exact, else
//! a bound derived from the reduction's roundings, element by element.

use super::format::{exponent, float_format};
use crate::dtype::DataType;
use crate::redop::RedOp;

/// What [`super::compare`] demands of each element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tolerance {
    /// Bit-for-bit equality with the sequential reference.
    Exact,
    /// Within [`rounding_bound`] of the exact value of the pre-scaled sum.
    Rounded,
}

/// The tolerance for `op` on `dtype` over `nranks` ranks, for inputs from
/// [`super::input`] (integers, or palette values for Max/Min/Prod, chosen
/// so sums and products stay in the exact range).
///
/// Exact: integer types (wrapping arithmetic is exact in any order);
/// Sum/Prod/Max/Min; Avg on a power-of-two rank count (the scale 1/n and
/// every partial sum of the scaled integers are exact); PreMulSum by an
/// integer the type holds or by 1/2, 1/4, 1/8, 1/16. Rounded: Avg on other
/// rank counts and other PreMulSum scales on floats.
pub fn tolerance(dtype: DataType, op: RedOp, nranks: u32) -> Tolerance {
    if !dtype.is_float() {
        return Tolerance::Exact;
    }
    let exact = match op {
        RedOp::Sum | RedOp::Prod | RedOp::Max | RedOp::Min => true,
        RedOp::Avg => nranks.max(1).is_power_of_two(),
        RedOp::PreMulSum(s) => exact_scale(dtype, s),
        // The value is in device memory, unknown here: assume the worst.
        RedOp::PreMulSumDevice(_) => false,
    };
    if exact {
        Tolerance::Exact
    } else {
        Tolerance::Rounded
    }
}

fn exact_scale(dtype: DataType, s: f64) -> bool {
    let a = s.abs();
    (s.fract() == 0.0 && a <= dtype.exact_int_range() as f64)
        || [0.5, 0.25, 0.125, 0.0625].contains(&a)
}

/// The spacing of `dtype`'s values at magnitude |v| (subnormals included).
pub fn ulp(dtype: DataType, v: f64) -> f64 {
    let (p, emin) = float_format(dtype);
    let e = if v == 0.0 {
        emin
    } else {
        exponent(v).max(emin)
    };
    2f64.powi(e - (p - 1))
}

/// The value a rounded reduction must produce and how far from it it may
/// lie. Every implementation rounds each term x·s to `dtype` once (as NCCL's
/// pre-multiplication does), so the terms tᵢ are fixed; their sum may then
/// be evaluated in any order, each addition rounded once (fused or wider
/// evaluations round less, so they stay inside). Returns `(Σ tᵢ, bound)`:
///
/// - 0 when every partial sum is exact: all tᵢ are multiples of the
///   smallest one's last significand bit g and Σ|tᵢ| ≤ 2^p·g (p significand
///   bits), so any partial sum, a multiple of g no larger than that, is a
///   value of the type;
/// - else (k − 1)·½ulp(M), k the number of nonzero terms (adding zero is
///   exact) and M ≥ Σ|tᵢ| + the bound (every partial sum lies below that),
///   plus one f64 ulp for computing Σ tᵢ in f64: about (k − 1)/2 ulp.
pub fn rounding_bound(dtype: DataType, xs: impl Iterator<Item = f64>, s: f64) -> (f64, f64) {
    let mut parts = Partials::default();
    let (mut abs, mut k, mut quantum) = (0.0f64, 0u32, f64::INFINITY);
    for x in xs {
        let t = super::model::round(dtype, x * s);
        if t != 0.0 {
            parts.add(t);
            abs += t.abs();
            k += 1;
            quantum = quantum.min(last_bit(t));
        }
    }
    let (prec, _) = float_format(dtype);
    if k <= 1 || abs <= quantum * 2f64.powi(prec) {
        // Exact: the naive f64 sum is exact too (every partial is a value).
        return (parts.total(), 0.0);
    }
    let center = parts.total();
    let mut bound = 0.0;
    for _ in 0..3 {
        bound = f64::from(k - 1) * ulp(dtype, abs + bound) / 2.0;
    }
    (center, bound + ulp(DataType::F64, center))
}

/// The value of the lowest set bit of `t`'s significand (t finite, not 0).
fn last_bit(t: f64) -> f64 {
    let bits = t.abs().to_bits();
    let mant = bits & ((1 << 52) - 1);
    let biased = (bits >> 52) as i32;
    let (m, e) = if biased == 0 {
        (mant, -1074)
    } else {
        (mant | 1 << 52, biased - 1075)
    };
    2f64.powi(e + m.trailing_zeros() as i32)
}

/// Shewchuk's exact sum of f64s as non-overlapping partials (as Python's
/// `math.fsum`): the total is the exact sum rounded to within one ulp.
#[derive(Default)]
struct Partials(Vec<f64>);

impl Partials {
    fn add(&mut self, mut x: f64) {
        let mut kept = 0;
        for k in 0..self.0.len() {
            let mut y = self.0[k];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                self.0[kept] = lo;
                kept += 1;
            }
            x = hi;
        }
        self.0.truncate(kept);
        self.0.push(x);
    }

    fn total(&self) -> f64 {
        self.0.iter().rev().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_of_each_format() {
        assert_eq!(ulp(DataType::F8E4M3, 3.0), 0.25);
        assert_eq!(ulp(DataType::F8E5M2, 3.0), 0.5);
        assert_eq!(ulp(DataType::F16, 1.0), 1.0 / 1024.0);
        assert_eq!(ulp(DataType::Bf16, 256.0), 2.0);
        assert_eq!(ulp(DataType::F32, 1.0), f64::from(f32::EPSILON));
        assert_eq!(ulp(DataType::F64, 1.0), f64::EPSILON);
        // Subnormals: the spacing stops shrinking at the smallest normal.
        assert_eq!(ulp(DataType::F8E4M3, 2f64.powi(-8)), 2f64.powi(-9));
        assert_eq!(ulp(DataType::F16, 0.0), 2f64.powi(-24));
    }

    #[test]
    fn fsum_is_exact_where_naive_sums_are_not() {
        let mut p = Partials::default();
        for x in [1e16, 1.0, -1e16, 1.0] {
            p.add(x);
        }
        assert_eq!(p.total(), 2.0);
    }

    #[test]
    fn bound_of_an_average_of_three() {
        // E4M3: 1/3 rounds to 0.34375 = 11·2^-5; terms 1·s, 2·s, 4·s are
        // exact, but their sum 77·2^-5 needs 7 bits: 2 additions may each
        // err by ½ulp(2.4) = 1/8.
        let s = 0.34375;
        let (center, b) = rounding_bound(DataType::F8E4M3, [1.0, 2.0, 4.0].into_iter(), s);
        assert_eq!(center, 7.0 * s);
        assert_eq!(b, 0.25 + ulp(DataType::F64, center));
        // 3 = 1.1·2^1 is exact: terms 1·s and 2·s rounded (0.34375, 0.6875)
        // and zeros; 0.34375 + 0.6875 = 33·2^-5 still needs 6 bits.
        let (_, b) = rounding_bound(DataType::F8E4M3, [1.0, 0.0, 0.0].into_iter(), s);
        assert_eq!(b, 0.0, "one nonzero term: nothing to add");
        // Multiples of 2^-5 summing to at most 2^4·2^-5: exact in any order.
        let (center, b) = rounding_bound(DataType::F8E4M3, [1.0, 1.0, 2.0].into_iter(), 0.0625);
        assert_eq!((center, b), (0.25, 0.0));
    }
}
