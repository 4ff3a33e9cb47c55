//! fp8 lanes, bit for bit `float8`'s conversions around f32 arithmetic
//! (checked on every pair of values by `widened`'s tests):
//!
//! - Sum and Prod go through f16. The bytes placed as f16 bits are the
//!   value (E5M2: its top byte) or the value times 2^-8 (E4M3 below the
//!   sign shifted by 7: under that scale E4M3's exponents and subnormals
//!   line up with f16's); F16C widens them, the f32 result is rounded to
//!   f16 by F16C, then to fp8 by an integer round to nearest even that
//!   saturates at the largest finite value as `float8::from_f32` does
//!   (infinities included; NaN stays NaN, E5M2 keeping the top payload
//!   bits). Rounding twice is rounding once here: a sum or product of two
//!   fp8 values is exact in f16, or its part beyond f16 lies far below
//!   half an fp8 step. Thirty-two values per 32-byte step, four registers:
//!   43 instructions per 16 values, most of the time in the F16C
//!   widenings. Where the CPU has AVX-512 F, BW and VBMI, 64-byte groups
//!   go through [`super::fp8_avx512`] instead (on the bytes, with no f32
//!   but for rare groups), and these lanes fold what is left and serve
//!   CPUs without it.
//! - Max and Min need no arithmetic: `f32::max`/`min` of two widened fp8
//!   values is one of them, so the result is that operand's byte rounded
//!   through f32 (NaN becomes 0x7f; E5M2 ±inf saturates to ±0x7b). The
//!   bytes are compared as signed-magnitude keys, 32 per step.

use std::arch::x86_64::*;

use super::{halves, load, store};

/// E4M3 products come out scaled by 2^-16; this returns them to 2^-8.
pub(super) const E4M3_PROD_SCALE: f32 = 256.0;

/// Sixteen f16 (bits) to f32.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn widen_halves(h: __m256i) -> [__m256; 2] {
    [
        _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
    ]
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn splat16(x: u16) -> __m256i {
    _mm256_set1_epi16(x as i16)
}

/// NaN lanes of f16 bits `h` (`nan`) become `half`'s widened NaN source
/// (`0x7fff`: positive, every payload bit set), as `to_f32` gives.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn canonical_nan(h: __m256i, nan: __m256i) -> __m256i {
    _mm256_blendv_epi8(h, splat16(0x7fff), nan)
}

/// Sixteen E4M3 bytes to f32 times 2^-8.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e4m3_widen16(x: __m128i) -> [__m256; 2] {
    // Sign-extended and shifted by 7, the bits below the sign land on
    // 7..13 and the sign fills 14 and 15: clearing 14 leaves the f16.
    let h = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(x));
    let h = _mm256_and_si256(h, splat16(0xbf80));
    let em = _mm256_and_si256(h, splat16(0x3f80));
    widen_halves(canonical_nan(h, _mm256_cmpeq_epi16(em, splat16(0x3f80))))
}

/// Sixteen E5M2 bytes to f32.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e5m2_widen16(x: __m128i) -> [__m256; 2] {
    let h = _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(x));
    let nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, splat16(0x7fff)), splat16(0x7c00));
    widen_halves(canonical_nan(h, nan))
}

/// Sixteen f32 to f16 bits (F16C, to nearest even), then to fp8 bytes:
/// the low `S` bits dropped to nearest even, |h| first clamped to `last`
/// (f16 bits that round to the largest finite fp8), NaN lanes `nan(|h|)`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn narrow<const S: i32>(
    [lo, hi]: [__m256; 2],
    last: u16,
    nan: impl Fn(__m256i) -> __m256i,
) -> __m128i {
    let h = _mm256_set_m128i(
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi),
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo),
    );
    let a = _mm256_and_si256(h, splat16(0x7fff));
    let c = _mm256_min_epu16(a, splat16(last));
    let lsb = _mm256_and_si256(_mm256_srli_epi16::<S>(c), splat16(1));
    let half = splat16((1 << (S - 1)) - 1);
    let r = _mm256_srli_epi16::<S>(_mm256_add_epi16(_mm256_add_epi16(c, half), lsb));
    let r = _mm256_blendv_epi8(r, nan(a), _mm256_cmpgt_epi16(a, splat16(0x7c00)));
    let sign = _mm256_srli_epi16::<8>(_mm256_andnot_si256(splat16(0x7fff), h));
    let r = _mm256_or_si256(r, sign);
    _mm_packus_epi16(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r))
}

/// Sixteen f32 (times 2^-8) to E4M3: past 464 (halfway to 480, which
/// rounds to even 448) 0x7e; NaN 0x7f.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e4m3_narrow16(v: [__m256; 2]) -> __m128i {
    // 464 * 2^-8 = 1.8125 is f16 0x3f40.
    narrow::<7>(v, 0x3f40, |_| splat16(0x7f))
}

/// Sixteen f32 to E5M2: below 61440 (halfway to 65536) 0x7b at most;
/// NaN 0x7e with the top two payload bits.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn e5m2_narrow16(v: [__m256; 2]) -> __m128i {
    // 0x7b7f: the last f16 below 61440 (0x7b80).
    narrow::<8>(v, 0x7b7f, |a| {
        _mm256_or_si256(_mm256_srli_epi16::<8>(a), splat16(0x7e))
    })
}

/// Thirty-two bytes widened sixteen at a time.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn widen32(x: __m256i, widen16: impl Fn(__m128i) -> [__m256; 2]) -> [__m256; 4] {
    let [lo, hi] = halves(x);
    let ([a, b], [c, d]) = (widen16(lo), widen16(hi));
    [a, b, c, d]
}

/// Thirty-two f32 rounded sixteen at a time.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn narrow32([a, b, c, d]: [__m256; 4], narrow16: impl Fn([__m256; 2]) -> __m128i) -> __m256i {
    _mm256_set_m128i(narrow16([c, d]), narrow16([a, b]))
}

/// Thirty-two E4M3 bytes to f32 times 2^-8.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn e4m3_widen(x: __m256i) -> [__m256; 4] {
    widen32(x, |h| e4m3_widen16(h))
}

/// Thirty-two E5M2 bytes to f32.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn e5m2_widen(x: __m256i) -> [__m256; 4] {
    widen32(x, |h| e5m2_widen16(h))
}

/// Thirty-two f32 (times 2^-8) to E4M3 bytes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn e4m3_narrow(v: [__m256; 4]) -> __m256i {
    narrow32(v, |v| e4m3_narrow16(v))
}

/// Thirty-two f32 to E5M2 bytes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn e5m2_narrow(v: [__m256; 4]) -> __m256i {
    narrow32(v, |v| e5m2_narrow16(v))
}

/// `acc[i] = max or min(acc[i], src[i])` over whole 32-byte groups of
/// E4M3 (`E5M2` false) or E5M2 bytes; returns how many it folded.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn pick<const MAX: bool, const E5M2: bool>(acc: &mut [u8], src: &[u8]) -> usize {
    let mut done = 0;
    for (a, s) in acc.chunks_exact_mut(32).zip(src.chunks_exact(32)) {
        let (x, y) = (load(a), load(s));
        store(a, pick32::<MAX, E5M2>(x, y));
        done += 32;
    }
    done
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn pick32<const MAX: bool, const E5M2: bool>(x: __m256i, y: __m256i) -> __m256i {
    let low7 = _mm256_set1_epi8(0x7f);
    let nan = |v: __m256i| {
        let m = _mm256_and_si256(v, low7);
        if E5M2 {
            _mm256_cmpgt_epi8(m, _mm256_set1_epi8(0x7c))
        } else {
            _mm256_cmpeq_epi8(m, low7)
        }
    };
    // Signed magnitude to two's complement: ±0 meet at 0, order kept.
    let key = |v: __m256i| _mm256_sign_epi8(_mm256_and_si256(v, low7), v);
    let (kx, ky) = (key(x), key(y));
    let y_wins = if MAX {
        _mm256_cmpgt_epi8(ky, kx)
    } else {
        _mm256_cmpgt_epi8(kx, ky)
    };
    // A NaN loses; equal operands keep `x` (f32::max's x86 lowering).
    let take_y = _mm256_or_si256(nan(x), _mm256_andnot_si256(nan(y), y_wins));
    let r = _mm256_blendv_epi8(x, y, take_y);
    let r = _mm256_blendv_epi8(r, low7, nan(r));
    if E5M2 {
        // ±inf (0x7c, 0xfc) saturate to ±0x7b: the mask is -1 there.
        let inf = _mm256_cmpeq_epi8(_mm256_and_si256(r, low7), _mm256_set1_epi8(0x7c));
        _mm256_add_epi8(r, inf)
    } else {
        r
    }
}
