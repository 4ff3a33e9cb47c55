//! Test inputs: values that differ across ranks and elements, chosen per
//! collective and op so that every correct result is exact (or within
//! [`super::tolerance`]) and every wrong one shows.
//!
//! Four schemes:
//! - **Palette** (data movement, Max, Min): at each element the ranks hold
//!   distinct entries of a list of nonzero values the type holds exactly
//!   (both signs, low mantissa bits and high integer bits exercised), so a
//!   swapped rank or block, an off-by-one offset, or a Max returning its own
//!   input is visible. For Max/Min the entries are spread over the list and
//!   the rank holding the extreme rotates with the element.
//! - **Prod**: one rank per element (rotating) holds a non-unit factor,
//!   the others ±1 (1 on unsigned types): every product is exact in any
//!   order, differs by element, and a dropped rank changes a sign or loses
//!   the factor.
//! - **Dense** (Sum, Avg, PreMulSum where the type has room): positive
//!   integers in `1..=b`, `b` such that the sum of `n` never overflows nor
//!   leaves the exact-integer range.
//! - **Sparse** (the same ops where `n` values of 2 would not fit: 8-bit and
//!   bf16 floats on many ranks): a rotating window of ranks of varying
//!   width holds 1s, its first rank a larger value, the rest 0, so each
//!   element's total stays within the exact range and varies. Rounded
//!   cases ([`super::tolerance`]) whose rounding bound would exceed one
//!   term's share use it too, with at most three terms and a dominant
//!   leader, so a dropped leader stays visible through the bound.

use crate::coll::Collective;
use crate::dtype::DataType;
use crate::element::Element;
use crate::redop::RedOp;

use super::bound::{tolerance, Tolerance};

/// Deterministic input of `rank` for `coll` on `nranks` ranks under `op`
/// (the op given for data-moving collectives is ignored), varied by `seed`.
pub fn input<T: Element>(
    coll: &Collective,
    nranks: u32,
    rank: u32,
    op: RedOp,
    seed: u64,
) -> Vec<T> {
    let len = coll.input_len(nranks);
    let n = u64::from(nranks.max(1));
    let scheme = Scheme::new::<T>(coll.kind.is_reduction(), op, n, seed);
    let r = u64::from(rank);
    (0..len as u64)
        .map(|i| T::from_f64(scheme.value(r, i)))
        .collect()
}

/// A 64-bit mix (splitmix64's finaliser): independent-looking values per
/// (seed, index) at the cost of a few multiplications.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `h` mapped onto `0..m` by its high bits (Lemire's multiply-shift: no
/// division, which dominated generating large buffers).
fn below(h: u64, m: u64) -> u64 {
    ((u128::from(h) * u128::from(m)) >> 64) as u64
}

enum Scheme {
    /// Rank `r` at element `i` holds `values[(base(i) + rot(r, i) * stride) % len]`.
    Palette {
        values: Vec<f64>,
        stride: u64,
        /// Number of bases to draw from.
        bases: u64,
        /// Max/Min: the rotation depends on `i`, so the extreme moves.
        rotate: bool,
        n: u64,
        seed: u64,
    },
    Prod {
        factors: Vec<f64>,
        signed: bool,
        n: u64,
        seed: u64,
    },
    Dense {
        bound: u64,
        seed: u64,
    },
    Sparse {
        n: u64,
        /// Most ranks active at one element.
        width: u64,
        /// Largest total of one element.
        budget: u64,
        /// The leading rank holds at least half of what is left.
        dominant: bool,
        seed: u64,
    },
}

impl Scheme {
    fn new<T: Element>(reduction: bool, op: RedOp, n: u64, seed: u64) -> Scheme {
        let dt = T::DTYPE;
        let palette = |rotate: bool| {
            let values = values_of::<T>();
            let len = values.len() as u64;
            // Data movement: ranks `len / n` apart. Max/Min: spread so the
            // n values of an element fit above a random base.
            let stride = if rotate {
                ((len - 1) / (2 * (n - 1)).max(1)).max(1)
            } else {
                (len / n).max(1)
            };
            let span = (n - 1) * stride;
            Scheme::Palette {
                bases: if rotate && span < len {
                    len - span
                } else {
                    len
                },
                values,
                stride,
                rotate,
                n,
                seed,
            }
        };
        if !reduction {
            return palette(false);
        }
        match op {
            RedOp::Max | RedOp::Min => palette(true),
            RedOp::Prod => {
                let factors: Vec<f64> = values_of::<T>()
                    .into_iter()
                    .filter(|v| v.abs() != 1.0)
                    .collect();
                Scheme::Prod {
                    factors,
                    signed: dt.is_float() || is_signed(dt),
                    n,
                    seed,
                }
            }
            RedOp::Sum | RedOp::Avg | RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_) => {
                let budget = sum_budget(dt, op).max(1);
                let bound = (budget / n).min(1 << 50);
                // A rounded sum of k terms may err by about (k − 1)/2 ulp,
                // more than one term's share once k² passes 2^p: there,
                // few terms per element, led by a large one.
                let (prec, _) = super::format::float_format(dt);
                let rounded = tolerance(dt, op, n as u32) == Tolerance::Rounded
                    && (n * n) as f64 > 2f64.powi(prec - 2);
                if bound >= 2 && !rounded {
                    Scheme::Dense { bound, seed }
                } else {
                    Scheme::Sparse {
                        n,
                        width: if rounded { n.min(3) } else { n.min(budget) },
                        budget,
                        dominant: rounded,
                        seed,
                    }
                }
            }
        }
    }

    fn value(&self, r: u64, i: u64) -> f64 {
        match self {
            Scheme::Palette {
                values,
                stride,
                bases,
                rotate,
                n,
                seed,
            } => {
                let len = values.len() as u64;
                let base = below(mix(seed ^ i.wrapping_mul(0xA24B_AED4_963E_E407)), *bases);
                let rot = if *rotate { (r + i + seed) % n } else { r };
                let k = base + rot * stride;
                values[(if k < len { k } else { k % len }) as usize]
            }
            Scheme::Prod {
                factors,
                signed,
                n,
                seed,
            } => {
                let h = mix(seed ^ i.wrapping_mul(0x9FB2_1C65_1E98_DF25));
                if (i + seed) % n == r {
                    factors[below(h, factors.len() as u64) as usize]
                } else if *signed && (mix(h ^ r) & 1 == 1) {
                    -1.0
                } else {
                    1.0
                }
            }
            Scheme::Dense { bound, seed } => {
                let h = mix(seed ^ mix(r.wrapping_add(1)) ^ i.wrapping_mul(0xD6E8_FEB8_6659_FD93));
                (1 + below(h, *bound)) as f64
            }
            Scheme::Sparse {
                n,
                width,
                budget,
                dominant,
                seed,
            } => {
                let h = mix(seed ^ i.wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
                let active = 1 + below(h, *width);
                let slot = (r + n - (i + seed) % n) % n;
                // The leader's share: 1..=room, or its upper half.
                let room = budget - active + 1;
                let lo = if *dominant { room.div_ceil(2) } else { 1 };
                if slot >= active {
                    0.0
                } else if slot == 0 {
                    (lo + below(h.rotate_left(32), room - lo + 1)) as f64
                } else {
                    1.0
                }
            }
        }
    }
}

fn is_signed(dt: DataType) -> bool {
    matches!(dt, DataType::I8 | DataType::I32 | DataType::I64)
}

/// The largest total of one element's terms (before scaling) for which a
/// sum of non-negative integers is exact in any order and does not
/// overflow, scaled terms included.
fn sum_budget(dt: DataType, op: RedOp) -> u64 {
    let range = dt.exact_int_range();
    match op {
        RedOp::PreMulSum(s) if s.abs() > 1.0 => (range as f64 / s.abs().ceil()) as u64,
        _ => range,
    }
}

/// Distinct nonzero values `T` holds exactly, ascending. Floats: both signs
/// of `(1 + m/8 + δ)·2^e`, δ the lowest mantissa bit where the type has
/// more than three; integers: `k·M` over a range of `k` with `M` reaching
/// the type's high bits.
fn values_of<T: Element>() -> Vec<f64> {
    let dt = T::DTYPE;
    let mut v: Vec<f64> = if dt.is_float() {
        let (emax, low_bit) = match dt {
            DataType::F8E4M3 | DataType::F8E5M2 => (8, 0.0),
            DataType::F16 => (12, 1.0 / 1024.0),
            DataType::Bf16 => (12, 1.0 / 128.0),
            DataType::F32 => (12, f64::from(f32::EPSILON)),
            _ => (12, f64::EPSILON),
        };
        let mut v = Vec::new();
        for e in -6..=emax {
            for m in 0..8 {
                let mag = (1.0 + f64::from(m) / 8.0 + low_bit) * 2f64.powi(e);
                for x in [mag, -mag] {
                    if T::from_f64(x).to_f64() == x {
                        v.push(x);
                    }
                }
            }
        }
        v
    } else {
        let (ks, mul): (std::ops::RangeInclusive<i64>, i64) = match dt {
            DataType::I8 => (-127..=127, 1),
            DataType::U8 => (1..=255, 1),
            DataType::I32 => (-1000..=1000, 1_000_003),
            DataType::U32 => (1..=2000, 2_000_003),
            DataType::I64 => (-1000..=1000, (1 << 40) + 1),
            _ => (1..=2000, (1 << 41) + 1),
        };
        ks.filter(|&k| k != 0).map(|k| (k * mul) as f64).collect()
    };
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollKind;
    use crate::with_dtype;

    #[test]
    fn palettes_are_large_enough_for_64_ranks() {
        for dt in DataType::ALL {
            let len = with_dtype!(dt, T => values_of::<T>().len());
            assert!(len >= 100, "{dt}: {len}");
        }
    }

    #[test]
    fn max_inputs_are_distinct_across_ranks_at_every_element() {
        for dt in DataType::ALL {
            for n in [2u32, 3, 16, 64] {
                let coll = Collective::new(CollKind::AllReduce, 70, 0);
                let ins: Vec<Vec<f64>> = with_dtype!(dt, T => (0..n)
                    .map(|r| input::<T>(&coll, n, r, RedOp::Max, 5).iter().map(|x| x.to_f64()).collect())
                    .collect());
                for i in 0..70 {
                    let mut col: Vec<f64> = ins.iter().map(|v| v[i]).collect();
                    col.sort_by(f64::total_cmp);
                    col.dedup();
                    assert_eq!(col.len(), n as usize, "{dt} n={n} element {i}");
                }
            }
        }
    }
}
