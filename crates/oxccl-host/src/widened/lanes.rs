//! x86-64 vector folds for the narrow floats (AVX2 and F16C, detected at
//! run time): 32 bytes of each operand at a time are widened to f32 in AVX
//! registers, combined, and rounded back, giving what the scalar loops of
//! [`super`] (and so `half`'s and `float8`'s conversions) give:
//!
//! - f16: the F16C instructions, rounding to nearest even (what `half`
//!   itself uses on CPUs that have them: same NaN quieting and payloads).
//! - bf16: an unpack, and the same round-to-nearest-even integer add.
//! - fp8 ([`fp8`]): Sum and Prod through f16 by F16C, Max and Min on the
//!   bytes themselves. Where the CPU also has AVX-512 F, BW and VBMI, fp8
//!   Sum and Prod take 64 bytes a step through [`fp8_avx512`] first (on
//!   the bytes: lookups and byte arithmetic), these lanes the rest; where
//!   it also has AVX512-FP16, fp8 Sum goes through [`fp8_fp16`] instead
//!   (binary16 adds, no byte shuffles).
//!
//! Max and Min in f32 are `f32::max`/`f32::min` as LLVM lowers them on x86
//! (`maxps(b, a)`, then `b` where `a` is NaN), so equal operands (±0) give
//! the same one as the scalar loop.

use std::arch::x86_64::*;

use oxccl_core::BaseOp;

use super::Narrow;

mod fp8;
mod fp8_avx512;
mod fp8_fp16;

impl Narrow {
    fn size(self) -> usize {
        match self {
            Narrow::F16 | Narrow::Bf16 => 2,
            Narrow::E4M3 | Narrow::E5M2 => 1,
        }
    }
}

/// Whether this CPU can run [`fold`].
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// Folds the whole 32-byte groups of `acc` and `src` (values of `kind`:
/// `acc[i] = acc[i] (base) src[i]`) and returns how many elements it
/// folded; the caller folds the rest. fp8 Sum and Prod go 64 bytes a step
/// through [`fp8_avx512`] first when `wide` and the CPU has it, fp8 Sum
/// through [`fp8_fp16`] where the CPU has that. Callers check
/// [`available`] first.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn fold(acc: &mut [u8], src: &[u8], base: BaseOp, kind: Narrow, wide: bool) -> usize {
    let fp8 = matches!(kind, Narrow::E4M3 | Narrow::E5M2);
    let sum_or_prod = matches!(base, BaseOp::Sum | BaseOp::Prod);
    let mut done = 0;
    let (prod, e5m2) = (base == BaseOp::Prod, kind == Narrow::E5M2);
    if wide && fp8 && base == BaseOp::Sum && fp8_fp16::available() {
        // SAFETY: the CPU has AVX-512 F, BW, VBMI and FP16 (checked above).
        done = unsafe { fp8_fp16::fold(acc, src, e5m2) };
    } else if wide && fp8 && sum_or_prod && fp8_avx512::available() {
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (checked above).
        done = unsafe { fp8_avx512::fold(acc, src, prod, e5m2) };
    }
    done + fold32(&mut acc[done..], &src[done..], base, kind)
}

/// [`fold`] without the AVX-512 step.
#[target_feature(enable = "avx2,f16c")]
fn fold32(acc: &mut [u8], src: &[u8], base: BaseOp, kind: Narrow) -> usize {
    let bytes = match (kind, base) {
        (Narrow::F16, _) => each(acc, src, base, 1.0, |x| f16_widen(x), |v| f16_narrow(v)),
        (Narrow::Bf16, _) => each(acc, src, base, 1.0, |x| bf16_widen(x), |v| bf16_narrow(v)),
        (Narrow::E4M3, BaseOp::Max) => fp8::pick::<true, false>(acc, src),
        (Narrow::E4M3, BaseOp::Min) => fp8::pick::<false, false>(acc, src),
        (Narrow::E5M2, BaseOp::Max) => fp8::pick::<true, true>(acc, src),
        (Narrow::E5M2, BaseOp::Min) => fp8::pick::<false, true>(acc, src),
        (Narrow::E4M3, _) => each(
            acc,
            src,
            base,
            fp8::E4M3_PROD_SCALE,
            |x| fp8::e4m3_widen(x),
            |v| fp8::e4m3_narrow(v),
        ),
        (Narrow::E5M2, _) => each(
            acc,
            src,
            base,
            1.0,
            |x| fp8::e5m2_widen(x),
            |v| fp8::e5m2_narrow(v),
        ),
    };
    bytes / kind.size()
}

/// The op chosen outside the loop; `N` registers of f32 per 32 bytes.
/// Products are multiplied by `prod_scale` (for values widened scaled).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn each<const N: usize>(
    acc: &mut [u8],
    src: &[u8],
    base: BaseOp,
    prod_scale: f32,
    widen: impl Fn(__m256i) -> [__m256; N],
    narrow: impl Fn([__m256; N]) -> __m256i,
) -> usize {
    match base {
        BaseOp::Sum => blocks(acc, src, &widen, &narrow, |a, b| _mm256_add_ps(a, b)),
        BaseOp::Prod if prod_scale == 1.0 => {
            blocks(acc, src, &widen, &narrow, |a, b| _mm256_mul_ps(a, b))
        }
        BaseOp::Prod => blocks(acc, src, &widen, &narrow, |a, b| {
            _mm256_mul_ps(_mm256_mul_ps(a, b), _mm256_set1_ps(prod_scale))
        }),
        BaseOp::Max => blocks(acc, src, &widen, &narrow, |a, b| {
            _mm256_blendv_ps(_mm256_max_ps(b, a), b, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
        }),
        BaseOp::Min => blocks(acc, src, &widen, &narrow, |a, b| {
            _mm256_blendv_ps(_mm256_min_ps(b, a), b, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
        }),
    }
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn blocks<const N: usize>(
    acc: &mut [u8],
    src: &[u8],
    widen: &impl Fn(__m256i) -> [__m256; N],
    narrow: &impl Fn([__m256; N]) -> __m256i,
    op: impl Fn(__m256, __m256) -> __m256,
) -> usize {
    let mut done = 0;
    for (a, s) in acc.chunks_exact_mut(32).zip(src.chunks_exact(32)) {
        let (x, y) = (widen(load(a)), widen(load(s)));
        let mut r = x;
        for i in 0..N {
            r[i] = op(x[i], y[i]);
        }
        store(a, narrow(r));
        done += 32;
    }
    done
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn load(c: &[u8]) -> __m256i {
    assert!(c.len() >= 32);
    // SAFETY: 32 readable bytes (checked above); no alignment needed.
    unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn store(c: &mut [u8], v: __m256i) {
    assert!(c.len() >= 32);
    // SAFETY: 32 writable bytes (checked above); no alignment needed.
    unsafe { _mm256_storeu_si256(c.as_mut_ptr().cast(), v) }
}

/// The low and high 128 bits of `x`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn halves(x: __m256i) -> [__m128i; 2] {
    [_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x)]
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn splat(x: u32) -> __m256i {
    _mm256_set1_epi32(x as i32)
}

/// Sixteen f16 to f32 (F16C).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_widen(x: __m256i) -> [__m256; 2] {
    halves(x).map(|h| _mm256_cvtph_ps(h))
}

/// Sixteen f32 to f16, to nearest even (F16C).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_narrow([lo, hi]: [__m256; 2]) -> __m256i {
    _mm256_set_m128i(
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi),
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo),
    )
}

/// Sixteen bf16 to f32, in the order [`bf16_narrow`] undoes (elements
/// 0-3 and 8-11, then 4-7 and 12-15: AVX2 unpacks within 128-bit halves).
/// As `bf16::to_f32` but for the quiet bit of signalling NaNs, which
/// nothing downstream can tell: the f32 ops quiet a NaN they return,
/// Max/Min return it unchanged, and [`bf16_narrow`] quiets every NaN.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn bf16_widen(x: __m256i) -> [__m256; 2] {
    let zero = _mm256_setzero_si256();
    [
        _mm256_unpacklo_epi16(zero, x),
        _mm256_unpackhi_epi16(zero, x),
    ]
    .map(|w| _mm256_castsi256_ps(w))
}

/// Sixteen f32 (in [`bf16_widen`]'s order) to bf16 (`bf16::from_f32`:
/// nearest even, NaNs quieted), for the NaNs a fold of bf16 values makes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn bf16_narrow(v: [__m256; 2]) -> __m256i {
    // Multiplying by one quiets a NaN and leaves every other value as it
    // is; a NaN made from bf16 operands has its low 16 bits clear (x86
    // returns an operand's payload or the default NaN), so the rounding
    // add below keeps its top half: `(x >> 16) | 0x40`, as `from_f32`.
    let [lo, hi] = v.map(|f| {
        let x = _mm256_castps_si256(_mm256_mul_ps(f, _mm256_set1_ps(1.0)));
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), splat(1));
        _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(x, splat(0x7fff)), lsb))
    });
    _mm256_packus_epi32(lo, hi)
}

#[cfg(test)]
mod tests {
    use oxccl_core::float8::{F8E4M3, F8E5M2};
    use oxccl_core::half::{bf16, f16};

    use super::super::tests::hard_f32s;
    use super::*;

    const KINDS: [Narrow; 4] = [Narrow::F16, Narrow::Bf16, Narrow::E4M3, Narrow::E5M2];

    /// E4M3 lanes hold values times 2^-8 (see [`fp8`]).
    fn lane_scale(kind: Narrow) -> f32 {
        if kind == Narrow::E4M3 {
            1.0 / 256.0
        } else {
            1.0
        }
    }

    /// 32 bytes of `kind` values widened: 16 or 32 f32 (unscaled, in
    /// element order).
    #[target_feature(enable = "avx2,f16c")]
    fn widened(kind: Narrow, bytes: &[u8; 32]) -> Vec<f32> {
        let x = load(bytes);
        let regs = match kind {
            Narrow::F16 => f16_widen(x).to_vec(),
            Narrow::Bf16 => {
                let [lo, hi] = bf16_widen(x);
                // Back to element order (see `bf16_widen`).
                let (l, h) = (_mm256_castps_si256(lo), _mm256_castps_si256(hi));
                vec![
                    _mm256_castsi256_ps(_mm256_permute2x128_si256::<0x20>(l, h)),
                    _mm256_castsi256_ps(_mm256_permute2x128_si256::<0x31>(l, h)),
                ]
            }
            Narrow::E4M3 => fp8::e4m3_widen(x).to_vec(),
            Narrow::E5M2 => fp8::e5m2_widen(x).to_vec(),
        };
        let mut out = vec![0f32; 8 * regs.len()];
        for (r, o) in regs.into_iter().zip(out.chunks_exact_mut(8)) {
            // SAFETY: `o` has room for 8 f32; no alignment needed.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), r) };
        }
        out.iter().map(|f| f / lane_scale(kind)).collect()
    }

    /// 16 (16-bit types) or 32 (fp8) f32 (as the lanes hold them, in
    /// element order) rounded to `kind`: 32 bytes.
    #[target_feature(enable = "avx2,f16c")]
    fn narrowed(kind: Narrow, f: &[f32; 32]) -> [u8; 32] {
        // SAFETY: `f` holds 32 f32, so 8 from 0, 8, 16 or 24; no
        // alignment needed.
        let reg = |i: usize| unsafe { _mm256_loadu_ps(f[i..].as_ptr()) };
        let v = match kind {
            Narrow::F16 => f16_narrow([reg(0), reg(8)]),
            Narrow::Bf16 => {
                // Into `bf16_widen`'s order.
                let (a, b) = (_mm256_castps_si256(reg(0)), _mm256_castps_si256(reg(8)));
                bf16_narrow([
                    _mm256_castsi256_ps(_mm256_permute2x128_si256::<0x20>(a, b)),
                    _mm256_castsi256_ps(_mm256_permute2x128_si256::<0x31>(a, b)),
                ])
            }
            Narrow::E4M3 => fp8::e4m3_narrow([reg(0), reg(8), reg(16), reg(24)]),
            Narrow::E5M2 => fp8::e5m2_narrow([reg(0), reg(8), reg(16), reg(24)]),
        };
        let mut out = [0u8; 32];
        store(&mut out, v);
        out
    }

    /// Bits to f32, and f32 to little-endian bytes.
    type Conversions = (fn(u16) -> f32, fn(f32) -> Vec<u8>);

    /// The scalar conversions (`half`'s, `float8`'s) of `kind`: bits to
    /// f32, and f32 to little-endian bytes.
    fn scalar(kind: Narrow) -> Conversions {
        match kind {
            Narrow::F16 => (
                |h| f16::from_bits(h).to_f32(),
                |f| f16::from_f32(f).to_bits().to_le_bytes().to_vec(),
            ),
            Narrow::Bf16 => (
                |h| bf16::from_bits(h).to_f32(),
                |f| bf16::from_f32(f).to_bits().to_le_bytes().to_vec(),
            ),
            Narrow::E4M3 => (
                |b| F8E4M3::from_bits(b as u8).to_f32(),
                |f| vec![F8E4M3::from_f32(f).to_bits()],
            ),
            Narrow::E5M2 => (
                |b| F8E5M2::from_bits(b as u8).to_f32(),
                |f| vec![F8E5M2::from_f32(f).to_bits()],
            ),
        }
    }

    /// Whether the CPU runs these lanes; says so when not.
    fn runs() -> bool {
        let ok = available();
        if !ok {
            println!("skipped: no AVX2 and F16C on this CPU");
        }
        ok
    }

    #[test]
    fn lanes_widen_every_value_as_the_scalar_conversions() {
        if !runs() {
            return;
        }
        for kind in KINDS {
            let (to_f32, _) = scalar(kind);
            let last = if kind.size() == 2 { u16::MAX } else { 0xff };
            let values: Vec<u16> = (0..=last).collect();
            for group in values.chunks_exact(32 / kind.size()) {
                let bytes: Vec<u8> = group
                    .iter()
                    .flat_map(|v| v.to_le_bytes()[..kind.size()].to_vec())
                    .collect();
                // SAFETY: the CPU has AVX2 and F16C (`runs`).
                let got = unsafe { widened(kind, bytes.as_slice().try_into().unwrap()) };
                for (v, g) in group.iter().zip(got) {
                    let want = to_f32(*v).to_bits();
                    // bf16 lanes leave signalling NaNs unquieted (see
                    // `bf16_widen`): the quiet bit is all that may differ.
                    let quiet = if kind == Narrow::Bf16 && g.is_nan() {
                        0x0040_0000
                    } else {
                        0
                    };
                    assert_eq!(g.to_bits() | quiet, want, "{kind:?} {v:#06x}");
                }
            }
        }
    }

    /// (what the lanes round, the value the scalar conversion rounds).
    fn rounding_cases(kind: Narrow) -> Vec<(f32, f32)> {
        let (to_f32, _) = scalar(kind);
        if kind.size() == 1 {
            // fp8 rounds the result's f16 (F16C rounds the f32 first):
            // every f16 value, scaled as the lanes hold it.
            let k = lane_scale(kind);
            return (0..=u16::MAX)
                .map(|h| f16::from_bits(h).to_f32())
                .map(|x| (x, x / k))
                .collect();
        }
        let mut values = hard_f32s(u16::MAX, |v| to_f32(v).to_bits());
        // Where f16 overflows (65520), with neighbours, both signs.
        for d in [-1i32, 0, 1] {
            let b = 65520.0f32.to_bits().wrapping_add_signed(d);
            values.extend([f32::from_bits(b), -f32::from_bits(b)]);
        }
        values.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN]);
        // bf16 lanes round only the NaNs a fold of bf16 values makes: low
        // 16 bits clear (see `bf16_narrow`).
        let foldable = |x: &f32| kind != Narrow::Bf16 || !x.is_nan() || x.to_bits() & 0xffff == 0;
        values
            .into_iter()
            .filter(foldable)
            .map(|x| (x, x))
            .collect()
    }

    #[test]
    fn lanes_round_every_decisive_value_as_the_scalar_conversions() {
        if !runs() {
            return;
        }
        for kind in KINDS {
            let (_, from_f32) = scalar(kind);
            let cases = rounding_cases(kind);
            let per = 32 / kind.size();
            for group in cases.chunks(per) {
                let mut f = [0f32; 32];
                for (slot, case) in f.iter_mut().zip(group) {
                    *slot = case.0;
                }
                // SAFETY: the CPU has AVX2 and F16C (`runs`).
                let got = unsafe { narrowed(kind, &f) };
                for (i, (lane, x)) in group.iter().enumerate() {
                    let at = i * kind.size();
                    let want = from_f32(*x);
                    assert_eq!(
                        &got[at..at + kind.size()],
                        &want[..],
                        "{kind:?} {:#010x} (lane {:#010x})",
                        x.to_bits(),
                        lane.to_bits()
                    );
                }
            }
        }
    }
}
