//! fp8 Sum 64 values a step in binary16 arithmetic (`vaddph`, AVX512-FP16,
//! detected at run time; Intel from Sapphire Rapids), bit for bit
//! `Element`'s arithmetic (`from_f32(to_f32(a) + to_f32(b))`, checked on
//! every pair of both formats). No permutes and no unpacks: on Intel
//! every byte shuffle issues on port 5 alone, which bounds
//! [`super::fp8_avx512`]'s byte lanes there.
//!
//! Widening is bit placement. An E5M2 byte is the high byte of the
//! binary16 of its value (same bias, subnormals included); an E4M3 byte
//! below its sign, shifted into bits 7-13 (the sign to 15), is the
//! binary16 of its value times 2^-8 (exponent field e is 2^(e - 15), and
//! E4M3's subnormals m * 2^-9 land on binary16's m * 2^-17). Even bytes
//! are shifted into the high half of each word, odd bytes masked in place:
//! two registers of 32 words per operand, each summed by one `vaddph`
//! (round to nearest even, MXCSR's default; the FP16 instructions ignore
//! DAZ and FTZ).
//!
//! Rounding back is an integer round to nearest even of the low 8 (E5M2)
//! or 7 (E4M3) bits of each binary16 word, as the AVX2 and AVX-512 lanes
//! already do after `vcvtps2ph`; both grids agree below the smallest
//! normal (fixed point: 2^-16 for E5M2, 2^-17 for scaled E4M3), so one
//! integer round serves normals and subnormals and carries into the
//! exponent where it must. Rounding twice (binary16, then fp8) is
//! rounding once here. Take |x| ≥ |y|, binary16 exponents ex ≥ ey
//! (subnormals at the format's least, -14), p = 3 (E5M2) or 4 (E4M3)
//! significand bits, gap g = ex - ey:
//!
//! - g ≤ 11 - p - 1 (7 for E5M2, 6 for E4M3): `x ± y` is a multiple of
//!   y's last place 2^(ey - p + 1) below 2^(ex + 2), at most g + p + 1 ≤ 11
//!   significant bits: exact in binary16 (below 2^-14 it is a multiple of
//!   the fp8 step, exact too). One rounding.
//! - larger g: |y| < 2^(ey + 1) ≤ 2^(ex - p - 3), below half the smaller
//!   fp8 step next to x (2^(ex - p - 1), the step under a power of two),
//!   so the correctly rounded result is x. Binary16 rounding is monotone
//!   and x ± 2^(ex - p - 3) are binary16 values (its step at ex is
//!   2^(ex - 10)), so the binary16 sum stays within that of x and the
//!   second rounding gives x too.
//!
//! `Element`'s f32 sum rounds as well (not every pair is exact in f32) and
//! comes to the same correctly rounded value by the same argument, so the
//! two agree wherever the result is finite and below the saturation
//! point. The rest, as `float8::from_f32` does it:
//!
//! - E5M2: results from 61440 (halfway to 65536) round to magnitude 0x7c,
//!   as do binary16 overflows (from 65520) and infinities (an infinite
//!   operand gives an infinite sum, which `from_f32` saturates too): one
//!   step on the packed bytes takes 0x7c to 0x7b. NaN stays NaN: `vaddph`
//!   returns an operand's NaN quieted or the default NaN (0xfe00), low
//!   byte 0, so the round never carries out of a NaN's high byte.
//! - E4M3 has no infinities and one NaN (0x7f) per sign, which as scaled
//!   binary16 is the finite 1.875: NaN operands are found on the bytes
//!   and their lanes set to 0x7f at the end. A sum of two scaled E4M3
//!   values is at most 3.5 (never binary16's overflow); its magnitude
//!   rounds to at most 0x86, and everything past 0x7e (from 464, halfway
//!   to 480 which rounds to even 448) saturates to 0x7e.
//! - Zeros: `vaddph` gives +0 for x + (-x) and -0 for -0 + -0, as f32.
//!
//! Per 64 values the compiled loops have 16 vector instructions for E5M2
//! (4 to widen, 2 `vaddph`, 4 to round, 2 to merge, 4 to saturate) and 29
//! for E4M3 (10 to widen, 2, 6 to round doubled magnitudes, 3 to merge and
//! saturate, 3 for the signs, 5 for NaNs); 3 and 4 of them (the tests and
//! compares that make masks) issue on port 5 alone on Intel. The byte
//! lanes take about 31 (E5M2: 4 permutes) and 35 (E4M3: 5 permutes).
//!
//! A cheaper f32 route does not exist there: `vcvtph2ps` and `vcvtps2ph`
//! on zmm are two uops each on Intel, one of them a port-5 shuffle, and
//! 64 values need four of each plus four `vaddps`.

use std::arch::x86_64::*;

use super::fp8_avx512::{e5m2_saturate, load, round_high_byte, splat16, store};

/// Whether this CPU can run [`fold`]: AVX-512 F, BW and VBMI (the byte
/// lanes' helpers are shared) and AVX512-FP16.
pub(in crate::widened) fn available() -> bool {
    super::fp8_avx512::available() && is_x86_feature_detected!("avx512fp16")
}

/// `acc[i] = acc[i] + src[i]` over whole 64-byte groups of E4M3 (`e5m2`
/// false) or E5M2 bytes; returns how many it folded.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512fp16")]
pub(in crate::widened) fn fold(acc: &mut [u8], src: &[u8], e5m2: bool) -> usize {
    // SAFETY: the CPU has AVX512-FP16 (this function's target features).
    let add = |a, b| unsafe { add_ph(a, b) };
    if e5m2 {
        sums::<true>(acc, src, add)
    } else {
        sums::<false>(acc, src, add)
    }
}

/// 32 binary16 sums (`vaddph`, round to nearest even). Only AVX-512 F
/// as a target feature, so that it inlines into [`sums`] (a function with
/// fewer features than its callee is never inlined into).
///
/// # Safety
///
/// The CPU must have AVX512-FP16.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn add_ph(a: __m512i, b: __m512i) -> __m512i {
    let sum: __m512i;
    // SAFETY: `vaddph` reads and writes registers only; the CPU has
    // AVX512-FP16 (the caller's promise). The asm, not an intrinsic:
    // Rust's binary16 intrinsics are unstable.
    unsafe {
        core::arch::asm!(
            "vaddph {sum}, {a}, {b}",
            sum = lateout(zmm_reg) sum,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    sum
}

/// [`fold`] with the binary16 add given (the tests give others).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn sums<const E5M2: bool>(
    acc: &mut [u8],
    src: &[u8],
    add: impl Fn(__m512i, __m512i) -> __m512i,
) -> usize {
    let mut done = 0;
    for (a, s) in acc.chunks_exact_mut(64).zip(src.chunks_exact(64)) {
        let out = if E5M2 {
            e5m2_sum(load(a), load(s), &add)
        } else {
            e4m3_sum(load(a), load(s), &add)
        };
        store(a, out);
        done += 64;
    }
    done
}

/// (even, odd) bytes of `x` in the high byte of each word, low byte 0.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn high_bytes(x: __m512i) -> [__m512i; 2] {
    [
        _mm512_slli_epi16::<8>(x),
        _mm512_and_si512(x, splat16(0xff00)),
    ]
}

/// (even, odd) bytes' high bytes of `r` as the low and high bytes of
/// each word, the 64 bytes in order again.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn merge([even, odd]: [__m512i; 2]) -> __m512i {
    // mask ? odd : even >> 8.
    _mm512_ternarylogic_epi32::<0xd8>(_mm512_srli_epi16::<8>(even), odd, splat16(0xff00))
}

/// 64 E5M2 sums: the bytes are the high bytes of binary16 words.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn e5m2_sum(x: __m512i, y: __m512i, add: &impl Fn(__m512i, __m512i) -> __m512i) -> __m512i {
    let ([xe, xo], [ye, yo]) = (high_bytes(x), high_bytes(y));
    // |sum| is at most 0x7e00 (a NaN's) or 0x7c00 plus a low byte, so
    // rounding never reaches the sign.
    let rounded = [add(xe, ye), add(xo, yo)].map(|h| round_high_byte(h));
    e5m2_saturate::<false>(merge(rounded))
}

/// 64 E4M3 sums through binary16 words holding the values times 2^-8.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn e4m3_sum(x: __m512i, y: __m512i, add: &impl Fn(__m512i, __m512i) -> __m512i) -> __m512i {
    // The sign shifted arithmetically into bits 15 and 14, the magnitude
    // into 7-13; bit 14 and the bits below 7 cleared.
    let widen = |x: __m512i| {
        high_bytes(x).map(|w| _mm512_and_si512(_mm512_srai_epi16::<1>(w), splat16(0xbf80)))
    };
    let ([xe, xo], [ye, yo]) = (widen(x), widen(y));
    let (he, ho) = (add(xe, ye), add(xo, yo));
    // |h| doubled (h + h drops the sign): the magnitude's byte is the high
    // byte, at most 0x86 after rounding (|h| at most 3.5, 0x4300).
    let magnitude = merge([he, ho].map(|h| round_high_byte(_mm512_add_epi16(h, h))));
    let magnitude = _mm512_min_epu8(magnitude, _mm512_set1_epi8(0x7e));
    // Signs: bit 15 of `ho`, bit 7 of `he >> 8`.
    let signs = _mm512_ternarylogic_epi32::<0xd8>(_mm512_srli_epi16::<8>(he), ho, splat16(0x8000));
    // magnitude | (signs & 0x80 in every byte).
    let out = _mm512_ternarylogic_epi32::<0xf8>(magnitude, signs, _mm512_set1_epi8(i8::MIN));
    // Lanes where neither operand is NaN (magnitude 0x7f) keep `out`.
    let top = _mm512_set1_epi8(i8::MIN);
    let all = _mm512_set1_epi8(-1);
    let x_ok = _mm512_cmpneq_epi8_mask(_mm512_or_si512(x, top), all);
    let ok = _mm512_mask_cmpneq_epi8_mask(x_ok, _mm512_or_si512(y, top), all);
    _mm512_mask_mov_epi8(_mm512_set1_epi8(0x7f), ok, out)
}

#[cfg(test)]
mod tests {
    use oxccl_core::float8::{F8E4M3, F8E5M2};
    use oxccl_core::half::f16;

    use super::super::fp8_avx512::tests::pair_mismatches;
    use super::*;
    use oxccl_core::BaseOp;

    /// Whether this CPU runs `vaddph`; says so when not, and fails then if
    /// `OXCCL_REQUIRE_FP16=1` (set where the CPU must have it).
    fn fp16_runs() -> bool {
        if available() {
            return true;
        }
        let required = std::env::var("OXCCL_REQUIRE_FP16").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "OXCCL_REQUIRE_FP16=1 but this CPU lacks avx512fp16"
        );
        println!("skipped: no avx512fp16");
        false
    }

    /// Whether this CPU runs the integer part (with [`emulated_add`]).
    fn integer_runs() -> bool {
        let ok = super::super::fp8_avx512::available();
        if !ok {
            println!("skipped: no AVX-512 F, BW and VBMI on this CPU");
        }
        ok
    }

    /// `vaddph` in software: the exact sum (f64 holds any sum of two
    /// binary16) rounded to nearest even by `half`; NaNs as x86 gives
    /// them (the first NaN operand quieted, else the default NaN 0xfe00).
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn emulated_add(a: __m512i, b: __m512i) -> __m512i {
        let (mut x, mut y) = ([0u8; 64], [0u8; 64]);
        store(&mut x, a);
        store(&mut y, b);
        for (p, q) in x.chunks_exact_mut(2).zip(y.chunks_exact(2)) {
            let (u, v) = (
                u16::from_le_bytes([p[0], p[1]]),
                u16::from_le_bytes([q[0], q[1]]),
            );
            let (fu, fv) = (f16::from_bits(u), f16::from_bits(v));
            let s = if fu.is_nan() {
                u | 0x200
            } else if fv.is_nan() {
                v | 0x200
            } else {
                let s = f16::from_f64(fu.to_f64() + fv.to_f64());
                if s.is_nan() {
                    0xfe00
                } else {
                    s.to_bits()
                }
            };
            p.copy_from_slice(&s.to_le_bytes());
        }
        load(&x)
    }

    /// Pairs where [`sums`] with `add` differs from `Element`'s Sum.
    fn mismatches(e5m2: bool, add: impl Fn(__m512i, __m512i) -> __m512i) -> Vec<u16> {
        if e5m2 {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (callers check
            // `integer_runs` or `fp16_runs`).
            let run = |a: &mut [u8], s: &[u8]| unsafe { sums::<true>(a, s, add) };
            pair_mismatches(F8E5M2::from_bits, BaseOp::Sum, run)
        } else {
            // SAFETY: as above.
            let run = |a: &mut [u8], s: &[u8]| unsafe { sums::<false>(a, s, add) };
            pair_mismatches(F8E4M3::from_bits, BaseOp::Sum, run)
        }
    }

    /// `vaddph` with 0x100 added to word 0's result: one lane per group
    /// (byte 0 or 1) reads one fp8 step too high.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn corrupt(sum: __m512i) -> __m512i {
        _mm512_mask_add_epi16(sum, 1, sum, splat16(0x100))
    }

    /// Every pair of one format through real `vaddph`, checked.
    fn every_pair_through_vaddph(e5m2: bool) {
        if !fp16_runs() {
            return;
        }
        // SAFETY: the CPU has AVX512-FP16 (`fp16_runs`).
        let bad = mismatches(e5m2, |a, b| unsafe { add_ph(a, b) });
        let name = if e5m2 { "E5M2" } else { "E4M3" };
        println!(
            "{name} Sum through vaddph: {} of 65536 pairs differ",
            bad.len()
        );
        assert_eq!(bad, []);
    }

    #[test]
    fn e5m2_sum_matches_element_arithmetic_on_every_pair() {
        every_pair_through_vaddph(true);
    }

    #[test]
    fn e4m3_sum_matches_element_arithmetic_on_every_pair() {
        every_pair_through_vaddph(false);
    }

    /// Through `fold`, the entry the dispatch calls.
    #[test]
    fn fold_matches_element_arithmetic_on_every_pair() {
        if !fp16_runs() {
            return;
        }
        // SAFETY: the CPU has AVX512-FP16 (`fp16_runs`).
        let e5 = pair_mismatches(F8E5M2::from_bits, BaseOp::Sum, |a, s| unsafe {
            fold(a, s, true)
        });
        assert_eq!(e5, [], "E5M2");
        // SAFETY: as above.
        let e4 = pair_mismatches(F8E4M3::from_bits, BaseOp::Sum, |a, s| unsafe {
            fold(a, s, false)
        });
        assert_eq!(e4, [], "E4M3");
    }

    /// The checks above can fail: a `vaddph` result off by one fp8 step in
    /// one lane per group shows up there, and only there.
    #[test]
    fn a_corrupted_vaddph_result_is_caught() {
        if !fp16_runs() {
            return;
        }
        for e5m2 in [true, false] {
            // SAFETY: the CPU has AVX512-FP16 (`fp16_runs`).
            let bad = mismatches(e5m2, |a, b| unsafe { corrupt(add_ph(a, b)) });
            assert_corrupted_lanes(e5m2, &bad);
        }
    }

    /// Corrupted results show where they were put: pairs in bytes 0 and 1
    /// of a group (an E4M3 word's step is 0x80, so 0x100 is two steps).
    fn assert_corrupted_lanes(e5m2: bool, bad: &[u16]) {
        assert!(bad.len() > 100, "e5m2 {e5m2}: {} caught", bad.len());
        assert!(bad.iter().all(|i| i % 64 < 2), "e5m2 {e5m2}: {bad:x?}");
    }

    /// The integer part on CPUs without AVX512-FP16 (this one included),
    /// with `vaddph` in software.
    #[test]
    fn emulated_sums_match_element_arithmetic_on_every_pair() {
        if !integer_runs() {
            return;
        }
        for e5m2 in [true, false] {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (`integer_runs`).
            let bad = mismatches(e5m2, |a, b| unsafe { emulated_add(a, b) });
            assert_eq!(bad, [], "e5m2 {e5m2}");
            // SAFETY: as above.
            let bad = mismatches(e5m2, |a, b| unsafe { corrupt(emulated_add(a, b)) });
            assert_corrupted_lanes(e5m2, &bad);
        }
    }
}
