//! fp8 Sum and Prod 64 values a step on AVX-512 (F, BW and VBMI, detected
//! at run time), bit for bit what [`super::fp8`]'s AVX2 lanes give, in
//! fewer and cheaper instructions: those spend most of their time in F16C
//! widenings, which this skips.
//!
//! - Widening is a lookup. Every fp8 value is exact in bf16, the top half
//!   of an f32, so two `vpermi2b` (128-entry byte tables, indexed by the
//!   magnitude) give the high and low byte of each magnitude's bf16, the
//!   sign is or-ed in, one unpack makes bf16 words and a shift or a mask
//!   makes them f32s. E4M3 values are held times 2^-8 as in the AVX2
//!   lanes; NaNs widen to a quiet NaN.
//! - Rounding back starts as in the AVX2 lanes: `vcvtps2ph` to f16 (exact
//!   for the reason given there, and checked on every pair), then a round
//!   to nearest even of each word's low byte with one test and one masked
//!   add, the fp8 byte being the word's high byte (E4M3: of the word
//!   doubled). Saturation and NaN are left to one step on the 64 packed
//!   bytes ([`e5m2_saturate`], [`e4m3_saturate`]), where the AVX2 lanes
//!   spend a clamp, a NaN compare and a blend on every 16 values.
//! - Prod widens and rounds magnitudes and puts the sign (the signs' xor)
//!   back once on the packed bytes; E4M3 Prod's tables hold each factor
//!   times 2^-4, so a product comes out at the rounding's 2^-8 scale with
//!   no multiply.
//! - The unpack interleaves within 128-bit lanes and `vcvtps2ph` packs
//!   across them; one constant two-register byte permutation ([`ORDER`])
//!   takes the high bytes back in element order.

use std::arch::x86_64::*;

/// Whether this CPU can run [`fold`].
pub(in crate::widened) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
}

/// The high and low bytes of the bf16 of each fp8 magnitude.
struct Tables {
    hi: [u8; 128],
    lo: [u8; 128],
}

/// An fp8 format as the tables need it.
struct Format {
    mantissa_bits: u32,
    bias: i32,
    /// log2 of the factor values are held times.
    scale: i32,
    e5m2: bool,
}

const E4M3_FORMAT: Format = Format {
    mantissa_bits: 3,
    bias: 7,
    scale: -8,
    e5m2: false,
};

/// E4M3 for Prod: each factor times 2^-4, so that a product comes out
/// times 2^-8, the scale the rounding takes, without a multiply.
const E4M3_PROD_FORMAT: Format = Format {
    mantissa_bits: 3,
    bias: 7,
    scale: -4,
    e5m2: false,
};

const E5M2_FORMAT: Format = Format {
    mantissa_bits: 2,
    bias: 15,
    scale: 0,
    e5m2: true,
};

/// bf16 bits of magnitude `m` (times 2^`scale`): E5M2 has infinities
/// (0x7c) and NaNs above them, E4M3 one NaN (0x7f) and no infinity.
const fn bf16_of(m: u8, f: &Format) -> u16 {
    let nan = if f.e5m2 { m > 0x7c } else { m == 0x7f };
    if nan {
        return 0x7fc0;
    }
    if f.e5m2 && m == 0x7c {
        return 0x7f80;
    }
    if m == 0 {
        return 0;
    }
    let mb = f.mantissa_bits;
    let e = (m >> mb) as i32;
    let mut frac = (m & ((1 << mb) - 1)) as u16;
    // The value is 2^exp * (1 + frac / 2^mb) once normalised.
    let mut exp = e - f.bias + f.scale;
    if e == 0 {
        // Subnormal: 2^(1 - bias + scale) * frac / 2^mb; shift the
        // leading one up to the implicit bit.
        exp = 1 - f.bias + f.scale;
        frac <<= 1;
        exp -= 1;
        while frac & (1 << mb) == 0 {
            frac <<= 1;
            exp -= 1;
        }
        frac &= (1 << mb) - 1;
    }
    (((exp + 127) as u16) << 7) | (frac << (7 - mb))
}

const fn tables(f: &Format) -> Tables {
    let mut t = Tables {
        hi: [0; 128],
        lo: [0; 128],
    };
    let mut m = 0;
    while m < 128 {
        let b = bf16_of(m as u8, f);
        t.hi[m] = (b >> 8) as u8;
        t.lo[m] = b as u8;
        m += 1;
    }
    t
}

static E4M3_TABLES: Tables = tables(&E4M3_FORMAT);
static E4M3_PROD_TABLES: Tables = tables(&E4M3_PROD_FORMAT);
static E5M2_TABLES: Tables = tables(&E5M2_FORMAT);

/// Output byte `j` of a step is byte `ORDER[j]` of the two rounded
/// registers (bytes 0-63 and 64-127), each fp8 value the high byte of a
/// word. [`widen`] puts element `16k + 8w + 2j + odd` (`k` a 128-bit lane,
/// `j` a 32-bit slot in it) in f32 register `2w + odd`; `vcvtps2ph` of
/// registers 0 and 1 (2 and 3) fills words 0-15 and 16-31 of rounded
/// register 0 (1), word `4k + j` of each half.
const ORDER: [u8; 64] = {
    let mut order = [0u8; 64];
    let mut at = 0;
    while at < 64 {
        let (reg, word) = (at / 32, at % 32);
        let (odd, slot) = (word / 16, word % 16);
        let element = 16 * (slot / 4) + 8 * reg + 2 * (slot % 4) + odd;
        order[element] = (64 * reg + 2 * word + 1) as u8;
        at += 1;
    }
    order
};

/// `acc[i] = acc[i] + src[i]` (or `*`, `prod`) over whole 64-byte groups
/// of E4M3 (`e5m2` false) or E5M2 bytes; returns how many it folded.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(in crate::widened) fn fold(acc: &mut [u8], src: &[u8], prod: bool, e5m2: bool) -> usize {
    match (prod, e5m2) {
        (false, false) => steps::<false, false>(acc, src, &E4M3_TABLES),
        (true, false) => steps::<true, false>(acc, src, &E4M3_PROD_TABLES),
        (false, true) => steps::<false, true>(acc, src, &E5M2_TABLES),
        (true, true) => steps::<true, true>(acc, src, &E5M2_TABLES),
    }
}

/// [`fold`] with its tables given (the tests corrupt one).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn steps<const PROD: bool, const E5M2: bool>(acc: &mut [u8], src: &[u8], t: &Tables) -> usize {
    let pair = |b: &[u8; 128]| (load(&b[..64]), load(&b[64..]));
    let (hi, lo) = (pair(&t.hi), pair(&t.lo));
    let order = load(&ORDER);
    let mut done = 0;
    for (a, s) in acc.chunks_exact_mut(64).zip(src.chunks_exact(64)) {
        let (xb, yb) = (load(a), load(s));
        // A product's sign is the signs' xor: Prod widens and rounds
        // magnitudes and puts the sign back once, on the packed bytes.
        let x = widen::<PROD>(xb, hi, lo);
        let y = widen::<PROD>(yb, hi, lo);
        let mut r = x;
        for i in 0..4 {
            r[i] = if PROD {
                _mm512_mul_ps(x[i], y[i])
            } else {
                _mm512_add_ps(x[i], y[i])
            };
        }
        let [r0, r1, r2, r3] = r;
        let (h0, h1) = (f16_bits(r0, r1), f16_bits(r2, r3));
        let pack = |n0, n1| _mm512_permutex2var_epi8(n0, order, n1);
        let mut out = if E5M2 {
            e5m2_saturate::<PROD>(pack(e5m2_narrow(h0), e5m2_narrow(h1)))
        } else {
            let magnitude = e4m3_saturate(pack(e4m3_narrow(h0), e4m3_narrow(h1)));
            if PROD {
                magnitude
            } else {
                // magnitude | (sign & 0x80), the signs packed as the values.
                let sign = pack(h0, h1);
                _mm512_ternarylogic_epi32::<0xf8>(magnitude, sign, _mm512_set1_epi8(i8::MIN))
            }
        };
        if PROD {
            // out | ((x ^ y) & 0x80): the rounded magnitudes have bit 7
            // clear (or are NaN, which any sign leaves NaN).
            let sign = _mm512_ternarylogic_epi32::<0x28>(xb, yb, _mm512_set1_epi8(i8::MIN));
            out = _mm512_or_si512(out, sign);
        }
        store(a, out);
        done += 64;
    }
    done
}

/// 64 fp8 bytes to f32 (see [`ORDER`] for which value lands where).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn widen<const MAGNITUDE: bool>(
    x: __m512i,
    hi: (__m512i, __m512i),
    lo: (__m512i, __m512i),
) -> [__m512; 4] {
    // `vpermi2b` reads the low 7 bits of each index: the magnitude.
    let mut h = _mm512_permutex2var_epi8(hi.0, x, hi.1);
    if !MAGNITUDE {
        // h | (x & 0x80): the sign.
        h = _mm512_ternarylogic_epi32::<0xf8>(h, x, _mm512_set1_epi8(i8::MIN));
    }
    let l = _mm512_permutex2var_epi8(lo.0, x, lo.1);
    // bf16 words: elements 16k + 0..8 of lane k, then 16k + 8..16.
    let (w0, w1) = (_mm512_unpacklo_epi8(l, h), _mm512_unpackhi_epi8(l, h));
    // Even words shifted up and odd words masked are f32s: a shift and an
    // and, which run on more units than the shuffles unpacking would take.
    let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    [
        _mm512_slli_epi32::<16>(w0),
        _mm512_and_si512(w0, high),
        _mm512_slli_epi32::<16>(w1),
        _mm512_and_si512(w1, high),
    ]
    .map(|v| _mm512_castsi512_ps(v))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn splat16(x: u16) -> __m512i {
    _mm512_set1_epi16(x as i16)
}

/// 32 f32 to f16 bits (`vcvtps2ph`, to nearest even).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn f16_bits(lo: __m512, hi: __m512) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo)),
        _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi),
    )
}

/// The high byte of each word rounded to nearest even: half up (0x80
/// added), except where bits 0-6 and 8 are all clear. That is a tie
/// whose kept bit is even, or a low byte of 0, where adding would not
/// change the high byte anyway: one test instead of an and and a compare.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn round_high_byte(c: __m512i) -> __m512i {
    let stay = _mm512_testn_epi16_mask(c, splat16(0x17f));
    _mm512_mask_add_epi16(c, !stay, c, splat16(0x80))
}

/// f16 bits `h` of E4M3 values times 2^-8 to the E4M3 magnitude in the
/// high byte of each word, before saturation. E4M3's bits sit one lower
/// in the f16 than a high byte, so this doubles |h| (`h + h`, which also
/// drops the sign) and rounds the low byte off. Magnitudes from 0x7f up
/// are finite values to saturate (at most 0xc4: 784, the largest product)
/// and NaN comes out as 0xfc (f16 0x7e00 or 0xfe00: the only NaNs here
/// are the tables' and the default NaN, without payload); [`e4m3_saturate`]
/// sorts them out on the packed bytes, one step for 64 values instead of a
/// clamp and NaN case per 32.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn e4m3_narrow(h: __m512i) -> __m512i {
    round_high_byte(_mm512_add_epi16(h, h))
}

/// Packed magnitude bytes from [`e4m3_narrow`]: 0xfc (NaN) becomes 0x7f,
/// the others at most 0x7e, as `float8::from_f32` saturates.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn e4m3_saturate(b: __m512i) -> __m512i {
    let nan = _mm512_cmpeq_epi8_mask(b, _mm512_set1_epi8(0xfc_u8 as i8));
    let b = _mm512_min_epu8(b, _mm512_set1_epi8(0x7e));
    _mm512_mask_mov_epi8(b, nan, _mm512_set1_epi8(0x7f))
}

/// f16 bits `h` to E5M2 in the high byte of each word, sign included,
/// before saturation: E5M2 is the top byte of an f16, so rounding the low
/// byte off to nearest even is all it takes. Finite values from 61440 up
/// and infinities come out as magnitude 0x7c, which
/// [`e5m2_saturate`] takes down to 0x7b on the packed bytes, one step
/// for 64 values instead of a clamp and NaN case per 32. NaN stays NaN:
/// the only NaNs here are quiet ones without payload (the tables' and
/// the default NaN), f16 0x7e00 or 0xfe00, magnitude 0x7e after rounding
/// (a payload reaching 0x7f80 would carry into the sign).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn e5m2_narrow(h: __m512i) -> __m512i {
    // |h| is at most 0x7e00, so rounding never reaches the sign.
    round_high_byte(h)
}

/// Packed E5M2 bytes from [`e5m2_narrow`]: magnitude 0x7c (what
/// saturates) becomes 0x7b, as `float8::from_f32` saturates.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn e5m2_saturate<const MAGNITUDE: bool>(b: __m512i) -> __m512i {
    // Magnitudes need no mask: a NaN there (0xfe) is not 0x7c either.
    let m = if MAGNITUDE {
        b
    } else {
        _mm512_and_si512(b, _mm512_set1_epi8(0x7f))
    };
    let over = _mm512_cmpeq_epi8_mask(m, _mm512_set1_epi8(0x7c));
    _mm512_mask_sub_epi8(b, over, b, _mm512_set1_epi8(1))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn load(c: &[u8]) -> __m512i {
    assert!(c.len() >= 64);
    // SAFETY: 64 readable bytes (checked above); no alignment needed.
    unsafe { _mm512_loadu_si512(c.as_ptr().cast()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn store(c: &mut [u8], v: __m512i) {
    assert!(c.len() >= 64);
    // SAFETY: 64 writable bytes (checked above); no alignment needed.
    unsafe { _mm512_storeu_si512(c.as_mut_ptr().cast(), v) }
}

#[cfg(test)]
mod tests {
    use oxccl_core::float8::{F8E4M3, F8E5M2};
    use oxccl_core::{BaseOp, Element};

    use super::*;

    /// Whether the CPU runs these lanes; says so when not.
    fn runs() -> bool {
        let ok = available();
        if !ok {
            println!("skipped: no AVX-512 F, BW and VBMI on this CPU");
        }
        ok
    }

    #[test]
    fn tables_hold_every_magnitude_as_float8_widens_it() {
        for m in 0..128u8 {
            for (t, want, k) in [
                (&E4M3_TABLES, F8E4M3::from_bits(m).to_f32(), 256.0),
                (&E4M3_PROD_TABLES, F8E4M3::from_bits(m).to_f32(), 16.0),
                (&E5M2_TABLES, F8E5M2::from_bits(m).to_f32(), 1.0),
            ] {
                let m = usize::from(m);
                let got = f32::from_bits(u32::from_be_bytes([t.hi[m], t.lo[m], 0, 0]));
                let same = (got * k).to_bits() == want.to_bits() || got.is_nan() && want.is_nan();
                assert!(same, "{m:#04x}: {got} * {k} != {want}");
            }
        }
    }

    /// Pairs (`a << 8 | b`) where [`steps`] with `t` differs from
    /// `Element`'s arithmetic (NaN for NaN counts as equal: payloads are
    /// not specified).
    fn mismatches<T: Element, const PROD: bool, const E5M2: bool>(
        from: impl Fn(u8) -> T,
        t: &Tables,
    ) -> Vec<u16> {
        let base = if PROD { BaseOp::Prod } else { BaseOp::Sum };
        let mut acc: Vec<u8> = (0..=u16::MAX).map(|i| (i >> 8) as u8).collect();
        let src: Vec<u8> = (0..=u16::MAX).map(|i| i as u8).collect();
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (callers check `runs`).
        let done = unsafe { steps::<PROD, E5M2>(&mut acc, &src, t) };
        assert_eq!(done, acc.len(), "65536 is whole 64-byte groups");
        (0..=u16::MAX)
            .filter(|&i| {
                let (got, want) = (
                    from(acc[usize::from(i)]),
                    base.apply(from((i >> 8) as u8), from(i as u8)),
                );
                let nan = |x: T| x.to_f64().is_nan();
                !(got.bits_eq(want) || nan(got) && nan(want))
            })
            .collect()
    }

    #[test]
    fn every_pair_matches_element_arithmetic() {
        if !runs() {
            return;
        }
        let (e4, e5) = (|b| F8E4M3::from_bits(b), |b| F8E5M2::from_bits(b));
        assert_eq!(mismatches::<_, false, false>(e4, &E4M3_TABLES), []);
        assert_eq!(mismatches::<_, true, false>(e4, &E4M3_PROD_TABLES), []);
        assert_eq!(mismatches::<_, false, true>(e5, &E5M2_TABLES), []);
        assert_eq!(mismatches::<_, true, true>(e5, &E5M2_TABLES), []);
    }

    /// The check above can fail: one wrong table byte (E4M3 1.0 read as
    /// 1.25) shows up in pairs that read it, and only there.
    #[test]
    fn a_corrupted_table_entry_is_caught() {
        if !runs() {
            return;
        }
        let mut t = Tables {
            hi: E4M3_TABLES.hi,
            lo: E4M3_TABLES.lo,
        };
        t.lo[0x38] ^= 0x20;
        let bad = mismatches::<_, false, false>(F8E4M3::from_bits, &t);
        assert!(bad.contains(&0x3838), "1 + 1 read the bad entry: {bad:x?}");
        assert!(bad
            .iter()
            .all(|i| [i >> 8, i & 0xff].iter().any(|b| b & 0x7f == 0x38)));
    }
}
