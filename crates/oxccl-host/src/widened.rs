//! Block arithmetic for the narrow float types, bit for bit what
//! `Element`'s per-element operations give (`from_f32(to_f32(a) op
//! to_f32(b))`, one rounding per fold), but fast:
//!
//! - On x86-64 with AVX2 and F16C (detected at run time), whole 32-byte
//!   groups go through [`lanes`]: 16 or 32 values widened to f32 in AVX
//!   registers, folded, rounded back (fp8 Max/Min compare the bytes);
//!   fp8 Sum and Prod 64 bytes a step where the CPU also has AVX-512 F, BW
//!   and VBMI, on the bytes themselves (table lookups and byte arithmetic,
//!   no f32) but for rare groups (results below the smallest normal,
//!   infinities, NaNs), which are widened by table lookup and folded in f32;
//!   fp8 Sum in binary16 (`vaddph`) where the CPU has AVX512-FP16.
//! - The rest (a group's tail, other CPUs): f16 and bf16 in one fused loop
//!   whose conversions are branch-free integer and f32 arithmetic the
//!   compiler vectorises (the `half` crate's scalar and slice conversions
//!   call a function per element or per 8 elements and do not vectorise);
//!   fp8 pairs (256 × 256 values) looked up in a table of the scalar
//!   results, made on first use.
//!
//! Only folds without a pre-scale take these paths (a pre-scale rounds the
//! scaled value to the narrow type first; those go element by element).

use std::any::TypeId;
use std::sync::OnceLock;

use oxccl_core::float8::{F8E4M3, F8E5M2};
use oxccl_core::half::slice::HalfFloatSliceExt;
use oxccl_core::half::{bf16, f16};
use oxccl_core::{BaseOp, Element};

#[cfg(target_arch = "x86_64")]
mod lanes;

/// Which narrow float a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Narrow {
    F16,
    Bf16,
    E4M3,
    E5M2,
}

impl Narrow {
    fn of<T: 'static>() -> Option<Narrow> {
        let t = TypeId::of::<T>();
        [
            (TypeId::of::<f16>(), Narrow::F16),
            (TypeId::of::<bf16>(), Narrow::Bf16),
            (TypeId::of::<F8E4M3>(), Narrow::E4M3),
            (TypeId::of::<F8E5M2>(), Narrow::E5M2),
        ]
        .into_iter()
        .find_map(|(id, n)| (id == t).then_some(n))
    }
}

/// Which folds a call may use: the tests run each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))] // only the tests pick a narrower path
enum Path {
    Scalar,
    /// AVX2 and F16C lanes, where the CPU has them.
    Avx2,
    /// Also AVX-512 lanes (fp8 Sum and Prod; Sum in binary16 with
    /// AVX512-FP16), where the CPU has them.
    Widest,
}

/// `acc[i] = acc[i] (base) src[i]` for a narrow float `T`; `false` when
/// `T` is not one (the caller then runs the generic loop).
pub(crate) fn fold<T: Element>(acc: &mut [T], src: &[T], base: BaseOp) -> bool {
    fold_via(acc, src, base, Path::Widest)
}

/// [`fold`] through the folds `path` allows.
fn fold_via<T: Element>(acc: &mut [T], src: &[T], base: BaseOp, path: Path) -> bool {
    let Some(kind) = Narrow::of::<T>() else {
        return false;
    };
    let n = acc.len().min(src.len());
    let (acc, src) = (&mut acc[..n], &src[..n]);
    let done = match path {
        Path::Scalar => 0,
        _ => vector_prefix(acc, src, base, kind, path == Path::Widest),
    };
    scalar(&mut acc[done..], &src[done..], base, kind);
    true
}

/// Folds what the vector path can (a prefix) and returns its length.
#[cfg(target_arch = "x86_64")]
fn vector_prefix<T: Element>(
    acc: &mut [T],
    src: &[T],
    base: BaseOp,
    kind: Narrow,
    wide: bool,
) -> usize {
    if !lanes::available() {
        return 0;
    }
    let bytes = std::mem::size_of_val(acc);
    // SAFETY: `T` is a narrow float (`kind`), a transparent wrapper of a
    // u8 or u16: its bytes are initialised and any byte pattern is a value.
    let a = unsafe { std::slice::from_raw_parts_mut(acc.as_mut_ptr().cast::<u8>(), bytes) };
    // SAFETY: as above; `src` has as many elements as `acc`.
    let s = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), bytes) };
    // SAFETY: the CPU has AVX2 and F16C (checked above).
    unsafe { lanes::fold(a, s, base, kind, wide) }
}

#[cfg(not(target_arch = "x86_64"))]
fn vector_prefix<T: Element>(_: &mut [T], _: &[T], _: BaseOp, _: Narrow, _: bool) -> usize {
    0
}

/// The scalar folds: fused f16/bf16 loops, fp8 pair tables.
fn scalar<T: Element>(acc: &mut [T], src: &[T], base: BaseOp, kind: Narrow) {
    match kind {
        Narrow::F16 => {
            // SAFETY: `T` is `f16` (`kind` comes from its TypeId).
            let (a, s) = unsafe { cast::<T, f16>(acc, src) };
            let (a, s) = (a.reinterpret_cast_mut(), s.reinterpret_cast());
            fold_bits(a, s, base, f16_to_f32, f32_to_f16);
        }
        Narrow::Bf16 => {
            // SAFETY: `T` is `bf16`.
            let (a, s) = unsafe { cast::<T, bf16>(acc, src) };
            let (a, s) = (a.reinterpret_cast_mut(), s.reinterpret_cast());
            fold_bits(a, s, base, bf16_to_f32, f32_to_bf16);
        }
        Narrow::E4M3 => {
            // SAFETY: `T` is `F8E4M3`.
            let (a, s) = unsafe { cast::<T, F8E4M3>(acc, src) };
            let table = table::<F8E4M3>(base);
            fold_table(a, s, table, F8E4M3::to_bits, F8E4M3::from_bits);
        }
        Narrow::E5M2 => {
            // SAFETY: `T` is `F8E5M2`.
            let (a, s) = unsafe { cast::<T, F8E5M2>(acc, src) };
            let table = table::<F8E5M2>(base);
            fold_table(a, s, table, F8E5M2::to_bits, F8E5M2::from_bits);
        }
    }
}

/// # Safety
/// `T` and `U` must be the same type.
unsafe fn cast<'a, T, U>(acc: &'a mut [T], src: &'a [T]) -> (&'a mut [U], &'a [U]) {
    // SAFETY: same type (caller), so same layout, length and lifetime.
    unsafe {
        (
            std::slice::from_raw_parts_mut(acc.as_mut_ptr().cast::<U>(), acc.len()),
            std::slice::from_raw_parts(src.as_ptr().cast::<U>(), src.len()),
        )
    }
}

/// f16 bits as `f16::to_f32` widens them (NaNs quieted, payload kept).
/// Exponent and mantissa shifted into place are the f32 bits of the value
/// scaled by 2^-112, subnormals included; the multiplication is exact.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let finite = (f32::from_bits(em << 13) * f32::from_bits((127 + 112) << 23)).to_bits();
    let quiet = if em > 0x7c00 { 0x0040_0000 } else { 0 };
    let special = 0x7f80_0000 | ((em & 0x3ff) << 13) | quiet;
    f32::from_bits(sign | if em >= 0x7c00 { special } else { finite })
}

/// f32 to f16 bits as `f16::from_f32` rounds (to nearest even; past 65520
/// infinity; NaNs quieted with the payload's top bits).
#[inline(always)]
fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7fff_ffff;
    // Normal results: rebias, round the 13 dropped bits to nearest even.
    let rounded = a.wrapping_add(0xfff + ((a >> 13) & 1)) >> 13;
    let normal = rounded.wrapping_sub((127 - 15) << 10);
    // Subnormal results: adding 0.5 (whose ulp is 2^-24, the f16
    // subnormal step) rounds to nearest even in the FPU.
    let sub = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0.5f32.to_bits());
    let nan = 0x7e00 | ((a & 0x007f_ffff) >> 13);
    let o = if a > 0x7f80_0000 {
        nan
    } else if a >= 0x477f_f000 {
        0x7c00
    } else if a < 0x3880_0000 {
        sub
    } else {
        normal
    };
    (o | sign) as u16
}

/// bf16 bits as `bf16::to_f32` widens them (NaNs quieted).
#[inline(always)]
fn bf16_to_f32(b: u16) -> f32 {
    let quiet = if b & 0x7fff > 0x7f80 { 0x40 } else { 0 };
    f32::from_bits(u32::from(b | quiet) << 16)
}

/// f32 to bf16 bits as `bf16::from_f32` rounds (to nearest even; NaNs
/// quieted).
#[inline(always)]
fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x40;
    (if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

#[inline(always)]
fn fold_bits(
    acc: &mut [u16],
    src: &[u16],
    base: BaseOp,
    widen: impl Fn(u16) -> f32,
    narrow: impl Fn(f32) -> u16,
) {
    let mut each = |f: fn(f32, f32) -> f32| {
        for (a, s) in acc.iter_mut().zip(src) {
            *a = narrow(f(widen(*a), widen(*s)));
        }
    };
    match base {
        BaseOp::Sum => each(|x, y| x + y),
        BaseOp::Prod => each(|x, y| x * y),
        BaseOp::Max => each(f32::max),
        BaseOp::Min => each(f32::min),
    }
}

fn fold_table<T: Copy>(
    acc: &mut [T],
    src: &[T],
    table: &[u8],
    bits: impl Fn(&T) -> u8,
    from: impl Fn(u8) -> T,
) {
    for (a, s) in acc.iter_mut().zip(src) {
        *a = from(table[usize::from(bits(a)) << 8 | usize::from(bits(s))]);
    }
}

/// The 64 KiB table of `base` on an fp8 type: entry `a << 8 | b` holds the
/// bits of `a (base) b` as `Element` computes it.
fn table<T: Element + Fp8>(base: BaseOp) -> &'static [u8] {
    let slot = &T::tables()[base as usize];
    slot.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| {
                let (a, b) = (T::from_u8((i >> 8) as u8), T::from_u8(i as u8));
                base.apply(a, b).into_u8()
            })
            .collect()
    })
}

/// What the tables need of an fp8 type.
trait Fp8: Sized {
    fn from_u8(b: u8) -> Self;
    fn into_u8(self) -> u8;
    /// One table per base op (Sum, Prod, Max, Min), made on first use.
    fn tables() -> &'static [OnceLock<Vec<u8>>; 4];
}

macro_rules! fp8 {
    ($t:ty, $tables:ident) => {
        static $tables: [OnceLock<Vec<u8>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        impl Fp8 for $t {
            fn from_u8(b: u8) -> Self {
                <$t>::from_bits(b)
            }
            fn into_u8(self) -> u8 {
                self.to_bits()
            }
            fn tables() -> &'static [OnceLock<Vec<u8>>; 4] {
                &$tables
            }
        }
    };
}

fp8!(F8E4M3, E4M3_TABLES);
fp8!(F8E5M2, E5M2_TABLES);

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [BaseOp; 4] = [BaseOp::Sum, BaseOp::Prod, BaseOp::Max, BaseOp::Min];

    /// `got` is `want` bit for bit, or both are NaN: NaN payloads are not
    /// specified (which operand's NaN an f32 add propagates is the
    /// compiler's choice).
    fn same<T: Element>(got: T, want: T) -> bool {
        let nan = |x: T| x.to_f64().is_nan();
        got.bits_eq(want) || (nan(got) && nan(want))
    }

    /// Every pair of `values`, folded by [`fold_via`] (each path) and by
    /// `Element`'s arithmetic: the same (see [`same`]).
    fn agrees<T: Element + std::fmt::Debug>(values: &[T]) {
        for path in [Path::Scalar, Path::Avx2, Path::Widest] {
            for base in OPS {
                let n = values.len();
                let mut acc: Vec<T> = (0..n * n).map(|i| values[i / n]).collect();
                let src: Vec<T> = (0..n * n).map(|i| values[i % n]).collect();
                let want: Vec<T> = acc
                    .iter()
                    .zip(&src)
                    .map(|(a, b)| base.apply(*a, *b))
                    .collect();
                assert!(fold_via(&mut acc, &src, base, path));
                for (i, (g, w)) in acc.iter().zip(&want).enumerate() {
                    assert!(
                        same(*g, *w),
                        "{} {base:?} ({path:?}) {:?} {:?}: {g:?} != {w:?} (element {i})",
                        std::any::type_name::<T>(),
                        values[i / n],
                        values[i % n]
                    );
                }
            }
        }
    }

    #[test]
    fn fp8_folds_match_element_arithmetic_on_every_pair() {
        agrees(&(0..=255).map(F8E4M3::from_bits).collect::<Vec<_>>());
        agrees(&(0..=255).map(F8E5M2::from_bits).collect::<Vec<_>>());
    }

    /// Every 97th bit pattern (normals, subnormals, infinities, NaNs) and
    /// the edges (zeros, smallest subnormals, largest finite values,
    /// infinities, quiet and signalling NaNs, both signs).
    fn halves() -> Vec<u16> {
        let edges = [
            0x0000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0x7c01, 0x7e00,
        ];
        let edges16 = [0x0001, 0x007f, 0x0080, 0x7f7f, 0x7f80, 0x7f81, 0x7fc0];
        let mut v: Vec<u16> = (0..=u16::MAX).step_by(97).collect();
        for e in edges.into_iter().chain(edges16) {
            v.extend([e, e | 0x8000]);
        }
        v
    }

    #[test]
    fn half_blocks_match_element_arithmetic() {
        // 690 values: 476k pairs per op.
        agrees(&halves().into_iter().map(f16::from_bits).collect::<Vec<_>>());
    }

    #[test]
    fn bf16_blocks_match_element_arithmetic() {
        agrees(
            &halves()
                .into_iter()
                .map(bf16::from_bits)
                .collect::<Vec<_>>(),
        );
    }

    /// Random bits, lengths (tails of every size) and offsets (unaligned
    /// starts): the vector paths and the scalar one agree.
    fn paths_agree<T: Element + std::fmt::Debug>(
        from: impl Fn(u16) -> T,
        bits: &[(u16, u16)],
        skip: usize,
        op: usize,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let base = OPS[op];
        let bits = &bits[skip.min(bits.len())..];
        let src: Vec<T> = bits.iter().map(|p| from(p.1)).collect();
        let mut scalar: Vec<T> = bits.iter().map(|p| from(p.0)).collect();
        assert!(fold_via(&mut scalar, &src, base, Path::Scalar));
        for path in [Path::Avx2, Path::Widest] {
            let mut vector: Vec<T> = bits.iter().map(|p| from(p.0)).collect();
            assert!(fold_via(&mut vector, &src, base, path));
            for (i, (v, s)) in vector.iter().zip(&scalar).enumerate() {
                proptest::prop_assert!(
                    same(*v, *s),
                    "{base:?} {path:?} element {i}: {v:?} != {s:?}"
                );
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn vector_and_scalar_paths_agree(
            bits in proptest::collection::vec((0..=u16::MAX, 0..=u16::MAX), 0..160),
            skip in 0usize..4,
            op in 0usize..4,
        ) {
            paths_agree(f16::from_bits, &bits, skip, op)?;
            paths_agree(bf16::from_bits, &bits, skip, op)?;
            paths_agree(|b| F8E4M3::from_bits(b as u8), &bits, skip, op)?;
            paths_agree(|b| F8E5M2::from_bits(b as u8), &bits, skip, op)?;
        }
    }

    /// f32 values where rounding to a narrow type is decided: every 4099th
    /// bit pattern, and for each value of `T` up to `last` (`upper` gives
    /// its f32 bits) the midpoint to the next value and its neighbours.
    pub(super) fn hard_f32s(last: u16, upper: impl Fn(u16) -> u32) -> Vec<f32> {
        let mut v: Vec<u32> = (0..=u32::MAX).step_by(4099).collect();
        for h in 0..=last {
            let (lo, hi) = (upper(h), upper(h.wrapping_add(1)));
            if hi > lo {
                let mid = lo + (hi - lo) / 2;
                v.extend([mid - 1, mid, mid + 1]);
            }
        }
        v.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn f16_conversions_are_half_s_bit_for_bit() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_to_f32(h).to_bits(), want, "widen {h:#06x}");
        }
        let upper = |h: u16| f16::from_bits(h).to_f32().to_bits();
        for f in hard_f32s(u16::MAX, upper) {
            let want = f16::from_f32(f).to_bits();
            assert_eq!(f32_to_f16(f), want, "narrow {:#010x}", f.to_bits());
        }
    }

    #[test]
    fn bf16_conversions_are_half_s_bit_for_bit() {
        for b in 0..=u16::MAX {
            let want = bf16::from_bits(b).to_f32().to_bits();
            assert_eq!(bf16_to_f32(b).to_bits(), want, "widen {b:#06x}");
        }
        for f in hard_f32s(u16::MAX, |b| u32::from(b) << 16) {
            let want = bf16::from_f32(f).to_bits();
            assert_eq!(f32_to_bf16(f), want, "narrow {:#010x}", f.to_bits());
        }
    }

    #[test]
    fn other_types_are_left_to_the_caller() {
        let mut a = [1.0f32; 4];
        assert!(!fold(&mut a, &[2.0; 4], BaseOp::Sum));
        assert_eq!(a, [1.0; 4], "untouched");
    }
}
