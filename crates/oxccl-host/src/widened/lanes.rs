//! x86-64 vector folds for the narrow floats (AVX2 and F16C, detected at
//! run time): 16 bytes of each operand at a time are widened to f32 in AVX
//! registers, combined, and rounded back. The conversions are the scalar
//! ones of [`super`] (and so `half`'s and `float8`'s) lane for lane:
//!
//! - f16: the F16C instructions, rounding to nearest even (what `half`
//!   itself uses on CPUs that have them: same NaN quieting and payloads).
//! - bf16: a shift, and the same round-to-nearest-even integer add.
//! - fp8: bits placed as f16 and widened by F16C (E4M3 scaled by 2^8, its
//!   NaN set apart); rounding back by the integer add for normal results,
//!   an f32 add of a power of two whose ulp is the subnormal step for
//!   subnormal ones, saturation to the largest finite value past the
//!   rounding threshold (infinities included) and NaN kept, as
//!   `float8::from_f32` (CUDA's `__nv_cvt_float_to_fp8` with `satfinite`).
//!
//! Max and Min are `f32::max`/`f32::min` as LLVM lowers them on x86
//! (`maxps(b, a)`, then `b` where `a` is NaN), so equal operands (±0) give
//! the same one as the scalar loop.

use std::arch::x86_64::*;

use oxccl_core::BaseOp;

use super::Narrow;

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

/// Folds the whole 16-byte groups of `acc` and `src` (values of `kind`:
/// `acc[i] = acc[i] (base) src[i]`) and returns how many elements it
/// folded; the caller folds the rest. Callers check [`available`] first.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn fold(acc: &mut [u8], src: &[u8], base: BaseOp, kind: Narrow) -> usize {
    let bytes = match kind {
        Narrow::F16 => each(acc, src, base, |x| f16_widen(x), |v| f16_narrow(v)),
        Narrow::Bf16 => each(acc, src, base, |x| bf16_widen(x), |v| bf16_narrow(v)),
        Narrow::E4M3 => each(acc, src, base, |x| e4m3_widen(x), |v| e4m3_narrow(v)),
        Narrow::E5M2 => each(acc, src, base, |x| e5m2_widen(x), |v| e5m2_narrow(v)),
    };
    bytes / kind.size()
}

/// The op chosen outside the loop; `N` registers of f32 per 16 bytes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn each<const N: usize>(
    acc: &mut [u8],
    src: &[u8],
    base: BaseOp,
    widen: impl Fn(__m128i) -> [__m256; N],
    narrow: impl Fn([__m256; N]) -> __m128i,
) -> usize {
    match base {
        BaseOp::Sum => blocks(acc, src, &widen, &narrow, |a, b| _mm256_add_ps(a, b)),
        BaseOp::Prod => blocks(acc, src, &widen, &narrow, |a, b| _mm256_mul_ps(a, b)),
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
    widen: &impl Fn(__m128i) -> [__m256; N],
    narrow: &impl Fn([__m256; N]) -> __m128i,
    op: impl Fn(__m256, __m256) -> __m256,
) -> usize {
    let mut done = 0;
    for (a, s) in acc.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
        let (x, y) = (widen(load(a)), widen(load(s)));
        let mut r = x;
        for i in 0..N {
            r[i] = op(x[i], y[i]);
        }
        store(a, narrow(r));
        done += 16;
    }
    done
}

fn load(c: &[u8]) -> __m128i {
    assert!(c.len() >= 16);
    // SAFETY: 16 readable bytes (checked above); no alignment needed.
    unsafe { _mm_loadu_si128(c.as_ptr().cast()) }
}

fn store(c: &mut [u8], v: __m128i) {
    assert!(c.len() >= 16);
    // SAFETY: 16 writable bytes (checked above); no alignment needed.
    unsafe { _mm_storeu_si128(c.as_mut_ptr().cast(), v) }
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn splat(x: u32) -> __m256i {
    _mm256_set1_epi32(x as i32)
}

/// Where a lane's |x| (f32 bits) exceeds `bits`, `then`; else `r`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn above(a: __m256i, bits: u32, then: __m256i, r: __m256i) -> __m256i {
    _mm256_blendv_epi8(r, then, _mm256_cmpgt_epi32(a, splat(bits)))
}

/// The f32 lanes whose bits are NaN replaced by `half`'s widened NaN
/// (`0x7fff` as f16: positive, every payload bit set).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn canonical_nan(f: __m256, nan: __m256) -> __m256 {
    _mm256_blendv_ps(f, _mm256_castsi256_ps(splat(0x7fff_e000)), nan)
}

/// Eight f16 to f32 (F16C).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_widen(x: __m128i) -> [__m256; 1] {
    [_mm256_cvtph_ps(x)]
}

/// Eight f32 to f16, to nearest even (F16C).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_narrow([v]: [__m256; 1]) -> __m128i {
    _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)
}

/// Eight bf16 (as u16) to f32, NaNs quieted (`bf16::to_f32`).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn bf16_widen(x: __m128i) -> [__m256; 1] {
    let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x));
    let quiet = above(
        _mm256_and_si256(w, splat(0x7fff_ffff)),
        0x7f80_0000,
        splat(0x0040_0000),
        _mm256_setzero_si256(),
    );
    [_mm256_castsi256_ps(_mm256_or_si256(w, quiet))]
}

/// Eight f32 to bf16 (`bf16::from_f32`: nearest even, NaNs quieted).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn bf16_narrow([v]: [__m256; 1]) -> __m128i {
    let x = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), splat(1));
    let rounded =
        _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(x, splat(0x7fff)), lsb));
    let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(x), splat(0x40));
    let r = above(
        _mm256_and_si256(x, splat(0x7fff_ffff)),
        0x7f80_0000,
        nan,
        rounded,
    );
    pack32(r)
}

/// Eight 32-bit lanes holding values below 2^16 to eight u16.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn pack32(r: __m256i) -> __m128i {
    _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r))
}

/// The low eight E4M3 bytes of `x` to f32, as `F8E4M3::to_f32`: the bits
/// below the sign shifted into an f16 are the value times 2^-8
/// (subnormals included), widened and scaled back exactly; 0x7f and 0xff
/// are NaN (positive, as the f16 `0x7fff` it goes through).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e4m3_half(x: __m128i) -> __m256 {
    let b = _mm_cvtepu8_epi16(x);
    let em = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(b, _mm_set1_epi16(0x80)));
    let f = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16::<7>(em), sign)),
        _mm256_set1_ps(256.0),
    );
    let nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(em, _mm_set1_epi16(0x7f)));
    canonical_nan(f, _mm256_castsi256_ps(nan))
}

/// The low eight E5M2 bytes of `x` to f32, as `F8E5M2::to_f32`: E5M2 is
/// the top byte of an f16; NaNs become the f16 `0x7fff`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e5m2_half(x: __m128i) -> __m256 {
    let f = _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), x));
    canonical_nan(f, _mm256_cmp_ps::<_CMP_UNORD_Q>(f, f))
}

/// An fp8 format as [`fp8_narrow`] needs it.
struct Fp8 {
    /// Mantissa bits.
    m: u32,
    /// f32 bits of the smallest normal value.
    min_normal: u32,
    /// f32 bits of the last value that rounds to a finite one.
    last_finite: u32,
    /// Encoding of the largest finite value.
    max: u32,
    /// f32 whose ulp is the smallest subnormal.
    sub_step: f32,
    /// Whether NaN keeps the top two mantissa bits (E5M2) or is all ones.
    nan_payload: bool,
}

const E4M3: Fp8 = Fp8 {
    m: 3,
    min_normal: 0x3c80_0000,  // 2^-6
    last_finite: 0x43e8_0000, // 464: halfway to 480 rounds to even 448
    max: 0x7e,
    sub_step: 16384.0, // ulp 2^-9
    nan_payload: false,
};

const E5M2: Fp8 = Fp8 {
    m: 2,
    min_normal: 0x3880_0000,  // 2^-14
    last_finite: 0x476f_ffff, // below 61440, halfway to 65536 (inf)
    max: 0x7b,
    sub_step: 128.0, // ulp 2^-16
    nan_payload: true,
};

/// Eight f32 to fp8 in the low byte of eight u16 lanes, as
/// `float8::from_f32` rounds (see the module comment).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn fp8_narrow(v: __m256, f: &Fp8) -> __m128i {
    let x = _mm256_castps_si256(v);
    let a = _mm256_and_si256(x, splat(0x7fff_ffff));
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(x), splat(0x80));
    // Normal results: drop 23 - m bits rounding to nearest even, rebias.
    let shift = _mm_cvtsi32_si128(23 - f.m as i32);
    let lsb = _mm256_and_si256(_mm256_srl_epi32(a, shift), splat(1));
    let half = splat((1 << (22 - f.m)) - 1);
    let rounded = _mm256_srl_epi32(_mm256_add_epi32(_mm256_add_epi32(a, half), lsb), shift);
    // f32's bias minus the fp8 one: the f32 exponent of 2^(1 - bias), less 1.
    let bias = (f.min_normal >> 23) - 1;
    let normal = _mm256_sub_epi32(rounded, splat(bias << f.m));
    // Subnormal results: the FPU rounds |x| + step to a multiple of the
    // subnormal step; the difference of the bits counts the steps.
    let step = _mm256_set1_ps(f.sub_step);
    let sub = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), step)),
        _mm256_castps_si256(step),
    );
    let small = _mm256_cmpgt_epi32(splat(f.min_normal), a);
    let r = _mm256_blendv_epi8(normal, sub, small);
    let r = above(a, f.last_finite, splat(f.max), r);
    let nan = if f.nan_payload {
        _mm256_or_si256(
            splat(0x7e),
            _mm256_and_si256(_mm256_srli_epi32::<21>(a), splat(3)),
        )
    } else {
        splat(0x7f)
    };
    let r = above(a, 0x7f80_0000, nan, r);
    pack32(_mm256_or_si256(r, sign))
}

/// Sixteen E4M3 bytes to f32.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e4m3_widen(x: __m128i) -> [__m256; 2] {
    [e4m3_half(x), e4m3_half(_mm_srli_si128::<8>(x))]
}

/// Sixteen E5M2 bytes to f32.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e5m2_widen(x: __m128i) -> [__m256; 2] {
    [e5m2_half(x), e5m2_half(_mm_srli_si128::<8>(x))]
}

/// Sixteen f32 to E4M3 bytes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e4m3_narrow([lo, hi]: [__m256; 2]) -> __m128i {
    _mm_packus_epi16(fp8_narrow(lo, &E4M3), fp8_narrow(hi, &E4M3))
}

/// Sixteen f32 to E5M2 bytes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e5m2_narrow([lo, hi]: [__m256; 2]) -> __m128i {
    _mm_packus_epi16(fp8_narrow(lo, &E5M2), fp8_narrow(hi, &E5M2))
}

#[cfg(test)]
mod tests {
    use oxccl_core::float8::{F8E4M3, F8E5M2};
    use oxccl_core::half::{bf16, f16};

    use super::super::tests::hard_f32s;
    use super::*;

    const KINDS: [Narrow; 4] = [Narrow::F16, Narrow::Bf16, Narrow::E4M3, Narrow::E5M2];

    /// 16 bytes of `kind` values widened: 8 or 16 f32.
    #[target_feature(enable = "avx2,f16c")]
    fn widened(kind: Narrow, bytes: &[u8; 16]) -> Vec<f32> {
        let x = load(bytes);
        let regs = match kind {
            Narrow::F16 => f16_widen(x).to_vec(),
            Narrow::Bf16 => bf16_widen(x).to_vec(),
            Narrow::E4M3 => e4m3_widen(x).to_vec(),
            Narrow::E5M2 => e5m2_widen(x).to_vec(),
        };
        let mut out = vec![0f32; 8 * regs.len()];
        for (r, o) in regs.into_iter().zip(out.chunks_exact_mut(8)) {
            // SAFETY: `o` has room for 8 f32; no alignment needed.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), r) };
        }
        out
    }

    /// 8 (16-bit types) or 16 (fp8) f32 rounded to `kind`: 16 bytes.
    #[target_feature(enable = "avx2,f16c")]
    fn narrowed(kind: Narrow, f: &[f32; 16]) -> [u8; 16] {
        // SAFETY: `f` holds 16 f32, so 8 from 0 or 8; no alignment needed.
        let reg = |i: usize| unsafe { _mm256_loadu_ps(f[i..].as_ptr()) };
        let v = match kind {
            Narrow::F16 => f16_narrow([reg(0)]),
            Narrow::Bf16 => bf16_narrow([reg(0)]),
            Narrow::E4M3 => e4m3_narrow([reg(0), reg(8)]),
            Narrow::E5M2 => e5m2_narrow([reg(0), reg(8)]),
        };
        let mut out = [0u8; 16];
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
            for group in values.chunks_exact(16 / kind.size()) {
                let bytes: Vec<u8> = group
                    .iter()
                    .flat_map(|v| v.to_le_bytes()[..kind.size()].to_vec())
                    .collect();
                // SAFETY: the CPU has AVX2 and F16C (`runs`).
                let got = unsafe { widened(kind, bytes.as_slice().try_into().unwrap()) };
                for (v, g) in group.iter().zip(got) {
                    let want = to_f32(*v).to_bits();
                    assert_eq!(g.to_bits(), want, "{kind:?} {v:#06x}");
                }
            }
        }
    }

    #[test]
    fn lanes_round_every_decisive_f32_as_the_scalar_conversions() {
        if !runs() {
            return;
        }
        for kind in KINDS {
            let (to_f32, from_f32) = scalar(kind);
            let last = if kind.size() == 2 { u16::MAX } else { 0xff };
            let mut values = hard_f32s(last, |v| to_f32(v).to_bits());
            // Where fp8 saturates (464, 61440) and f16 overflows (65520),
            // with their neighbours, both signs.
            for edge in [464.0f32, 61440.0, 65520.0, 448.0, 57344.0] {
                for d in [-1i32, 0, 1] {
                    let b = edge.to_bits().wrapping_add_signed(d);
                    values.extend([f32::from_bits(b), -f32::from_bits(b)]);
                }
            }
            values.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN]);
            let per = 16 / kind.size();
            for group in values.chunks(per) {
                let mut f = [0f32; 16];
                f[..group.len()].copy_from_slice(group);
                // SAFETY: the CPU has AVX2 and F16C (`runs`).
                let got = unsafe { narrowed(kind, &f) };
                for (i, x) in group.iter().enumerate() {
                    let at = i * kind.size();
                    let want = from_f32(*x);
                    assert_eq!(
                        &got[at..at + kind.size()],
                        &want[..],
                        "{kind:?} {:#010x}",
                        x.to_bits()
                    );
                }
            }
        }
    }
}
