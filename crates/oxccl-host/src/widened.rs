//! Block arithmetic for the narrow float types, bit for bit what
//! `Element`'s per-element operations give, but fast: f16 blocks are
//! widened to f32 with the `half` crate's slice conversions (F16C vector
//! instructions where the CPU has them, detected at run time), combined in
//! f32 and rounded back once per fold, exactly as the scalar
//! `from_f32(to_f32(a) op to_f32(b))` does; fp8 pairs (256 × 256 values)
//! are looked up in a table of the scalar results, made on first use.
//! bf16 stays element by element: its conversions are shifts the compiler
//! vectorises already, and the slice path measured slower
//! (`host_reduce_speed`).
//!
//! Only folds without a pre-scale take these paths (a pre-scale rounds the
//! scaled value to the narrow type first; those go element by element).

use std::any::TypeId;
use std::sync::OnceLock;

use oxccl_core::float8::{F8E4M3, F8E5M2};
use oxccl_core::half::f16;
use oxccl_core::half::slice::HalfFloatSliceExt;
use oxccl_core::{BaseOp, Element};

/// Elements widened at a time (the caller's blocks are at most this).
const CHUNK: usize = 1024;

/// `acc[i] = acc[i] (base) src[i]` for a narrow float `T`; `false` when
/// `T` is not one (the caller then runs the generic loop).
pub(crate) fn fold<T: Element>(acc: &mut [T], src: &[T], base: BaseOp) -> bool {
    let t = TypeId::of::<T>();
    if t == TypeId::of::<f16>() {
        // SAFETY: `T` is `f16` (same TypeId), so the cast is the identity.
        let (a, s) = unsafe { cast::<T, f16>(acc, src) };
        fold_half(a, s, base);
    } else if t == TypeId::of::<F8E4M3>() {
        // SAFETY: `T` is `F8E4M3`.
        let (a, s) = unsafe { cast::<T, F8E4M3>(acc, src) };
        fold_table(
            a,
            s,
            table::<F8E4M3>(base),
            F8E4M3::to_bits,
            F8E4M3::from_bits,
        );
    } else if t == TypeId::of::<F8E5M2>() {
        // SAFETY: `T` is `F8E5M2`.
        let (a, s) = unsafe { cast::<T, F8E5M2>(acc, src) };
        fold_table(
            a,
            s,
            table::<F8E5M2>(base),
            F8E5M2::to_bits,
            F8E5M2::from_bits,
        );
    } else {
        return false;
    }
    true
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

fn fold_half<H>(acc: &mut [H], src: &[H], base: BaseOp)
where
    [H]: HalfFloatSliceExt,
{
    let mut a = [0f32; CHUNK];
    let mut b = [0f32; CHUNK];
    for (ac, sc) in acc.chunks_mut(CHUNK).zip(src.chunks(CHUNK)) {
        let n = ac.len();
        let (a, b) = (&mut a[..n], &mut b[..n]);
        ac.convert_to_f32_slice(a);
        sc.convert_to_f32_slice(b);
        match base {
            BaseOp::Sum => a.iter_mut().zip(&*b).for_each(|(x, y)| *x += y),
            BaseOp::Prod => a.iter_mut().zip(&*b).for_each(|(x, y)| *x *= y),
            BaseOp::Max => a.iter_mut().zip(&*b).for_each(|(x, y)| *x = x.max(*y)),
            BaseOp::Min => a.iter_mut().zip(&*b).for_each(|(x, y)| *x = x.min(*y)),
        }
        ac.convert_from_f32_slice(a);
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

    /// Every pair of values of `T`, folded both ways: bit for bit equal
    /// (NaNs: any NaN).
    fn agrees<T: Element + std::fmt::Debug>(values: &[T]) {
        for base in [BaseOp::Sum, BaseOp::Prod, BaseOp::Max, BaseOp::Min] {
            let n = values.len();
            let mut acc: Vec<T> = (0..n * n).map(|i| values[i / n]).collect();
            let src: Vec<T> = (0..n * n).map(|i| values[i % n]).collect();
            let want: Vec<T> = acc
                .iter()
                .zip(&src)
                .map(|(a, b)| base.apply(*a, *b))
                .collect();
            assert!(fold(&mut acc, &src, base));
            for (i, (g, w)) in acc.iter().zip(&want).enumerate() {
                // NaN payloads are not specified (which operand's NaN an
                // f32 add propagates is the compiler's choice): a NaN
                // must give a NaN, everything else the same bits.
                let nan = |x: T| x.to_f64().is_nan();
                assert!(
                    g.bits_eq(*w) || (nan(*g) && nan(*w)),
                    "{} {base:?} {:?} {:?}: {g:?} != {w:?} (element {i})",
                    std::any::type_name::<T>(),
                    values[i / n],
                    values[i % n]
                );
            }
        }
    }

    #[test]
    fn fp8_tables_match_element_arithmetic_on_every_pair() {
        agrees(&(0..=255).map(F8E4M3::from_bits).collect::<Vec<_>>());
        agrees(&(0..=255).map(F8E5M2::from_bits).collect::<Vec<_>>());
    }

    #[test]
    fn half_blocks_match_element_arithmetic() {
        // Every 97th bit pattern (normals, subnormals, infinities, NaNs),
        // all pairs: 676 values, 457k pairs per op.
        let f: Vec<f16> = (0..=u16::MAX).step_by(97).map(f16::from_bits).collect();
        agrees(&f);
    }

    #[test]
    fn other_types_are_left_to_the_caller() {
        let mut a = [1.0f32; 4];
        assert!(!fold(&mut a, &[2.0; 4], BaseOp::Sum));
        assert_eq!(a, [1.0; 4], "untouched");
    }
}
