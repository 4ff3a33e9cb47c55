//! fp8 Sum and Prod 64 values a step on AVX-512 (F, BW and VBMI, detected
//! at run time), bit for bit `Element`'s arithmetic (checked on every pair
//! of values, on each path alone and through [`fold`]).
//!
//! Most groups never leave the bytes ([`product_bytes`], [`sum_bytes`]):
//! each magnitude is normalised by one `vpermi2b` (subnormals get the
//! implicit bit and a smaller exponent), exponents are added or compared
//! as byte fields, and what depends on the significands is looked up in
//! small tables: the rounded product of two fractions, or the smaller
//! significand shifted by the exponent difference (rounded to odd) and the
//! normalised, rounded result of the integer sum or difference. That is
//! about 25 (Prod) to 36 (E4M3 Sum) instructions per 64 values, against
//! about 45 in f32 (below), and no `vcvtps2ph`.
//! A group with a lane these do not round (a result below the smallest
//! normal, which rounds to a coarser step; an infinity or NaN; E4M3 sums
//! from 512 up) goes the f32 way instead ([`steps`]): rare in data, and
//! exact either way.
//!
//! The f32 way, which was the only one until 2026-12-04:
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
        (false, false) => sums::<false>(acc, src, &E4M3_SUMS, &E4M3_TABLES),
        (true, false) => products::<false>(acc, src, &E4M3_PRODUCTS, &E4M3_PROD_TABLES),
        (false, true) => sums::<true>(acc, src, &E5M2_SUMS, &E5M2_TABLES),
        (true, true) => products::<true>(acc, src, &E5M2_PRODUCTS, &E5M2_TABLES),
    }
}

/// What Prod's byte lanes ([`product_bytes`]) look up: each magnitude
/// normalised, and each pair of significands' rounded product.
struct Products {
    /// Magnitude `m` as `e' << M | f`: a normal value's exponent field
    /// plus `M` (so that subnormals, normalised, keep `e'` at least 1),
    /// 0 for zero, 0xff for infinities and NaNs (never a normal `e'`).
    norm: [u8; 128],
    /// Byte `fx | fy << M` (E5M2: repeated over bits 4 and 5): the
    /// product of significands `1.fx * 1.fy` rounded to nearest even to
    /// `M` fraction bits, as what it adds to `er << M`: `(p - 1) << M`
    /// below 2, `(1 << M) + (p / 2 - 1) << M` from 2 (the exponent's
    /// carry included).
    product: [u8; 64],
    /// `(2 M + bias) << M`: the sum of two `e' << M` less this is the
    /// product's biased exponent `er << M` (before the carry).
    offset: u8,
    /// The largest finite magnitude, where products saturate.
    largest: u8,
}

/// `n / 2^s` rounded to nearest even.
const fn rne_shift(n: u32, s: u32) -> u32 {
    (n + (1 << (s - 1)) - 1 + ((n >> s) & 1)) >> s
}

const fn product_tables(f: &Format) -> Products {
    let m = f.mantissa_bits;
    let mut p = Products {
        norm: normalised(f, m as i32),
        product: [0; 64],
        offset: ((2 * m as i32 + f.bias) << m) as u8,
        largest: if f.e5m2 { 0x7b } else { 0x7e },
    };
    let mut i = 0;
    while i < 64 {
        let (fx, fy) = (i as u32 & ((1 << m) - 1), (i as u32 >> m) & ((1 << m) - 1));
        // The product of significands in units of 2^-2M.
        let n = ((1 << m) + fx) * ((1 << m) + fy);
        p.product[i] = if n < 1 << (2 * m + 1) {
            rne_shift(n, m) - (1 << m)
        } else {
            rne_shift(n, m + 1)
        } as u8;
        i += 1;
    }
    p
}

static E4M3_PRODUCTS: Products = product_tables(&E4M3_FORMAT);
static E5M2_PRODUCTS: Products = product_tables(&E5M2_FORMAT);

/// Guard bits of Sum's integer significands: a guard, a round and a
/// sticky bit, so that a difference that loses its leading bit still
/// rounds right.
const GUARD: u32 = 3;

/// What Sum's byte lanes ([`sum_bytes`]) look up.
struct Sums {
    /// As [`Products::norm`] with `e'` the exponent field plus
    /// [`sum_offset`]: 8 or more for every value but zero, which stays 0,
    /// so that a zero `B` lies 8 or more binades below any `A`.
    norm: [u8; 128],
    /// `norm` for the second operand: infinities and NaNs 0xfe, so that
    /// two of them never look like magnitudes that cancel.
    norm_y: [u8; 128],
    /// Byte `(d << M) + F - fb` (`F` = 2^M - 1: what `(A | F) - B` gives),
    /// `d` the exponent difference, up to the last byte (`d` from 7 on:
    /// the same value): the smaller significand `1.fb` shifted right by
    /// `d`, in units of the larger one's last place over 2^GUARD, rounded
    /// to odd (bit 0 set where bits were lost: the sticky bit).
    align: [u8; 64],
    /// Byte `t`: a sum or difference `t` of those units as what it adds to
    /// `A | F` (the larger operand's `e' << M`, plus `F`) to give the
    /// result's byte, rounded to nearest even (bytes 128-255 in the second
    /// half: E4M3 only).
    result: [u8; 256],
}

/// What Sum's normalised exponent fields add to the format's: subnormals
/// normalised reach down to `1 - M`, so 7 + M lifts every nonzero value
/// to 8 or more (at most 25 for E4M3, 39 for E5M2: bytes up to 207).
const fn sum_offset(f: &Format) -> i32 {
    7 + f.mantissa_bits as i32
}

/// Magnitude `m` as `(e + offset) << M | f` (subnormals normalised), 0 for
/// zero, 0xff for infinities and NaNs.
const fn normalised(f: &Format, offset: i32) -> [u8; 128] {
    let m = f.mantissa_bits;
    let mut norm = [0; 128];
    let mut b = 1;
    while b < 128 {
        let nan_or_inf = if f.e5m2 { b >= 0x7c } else { b == 0x7f };
        let (mut e, mut frac) = ((b >> m) as i32, (b & ((1 << m) - 1)) as u32);
        if e == 0 {
            e = 1;
            while frac & (1 << m) == 0 {
                frac <<= 1;
                e -= 1;
            }
            frac &= (1 << m) - 1;
        }
        norm[b] = if nan_or_inf {
            0xff
        } else {
            (((e + offset) << m) as u32 | frac) as u8
        };
        b += 1;
    }
    norm
}

const fn sum_tables(f: &Format) -> Sums {
    let m = f.mantissa_bits;
    let norm = normalised(f, sum_offset(f));
    let mut norm_y = norm;
    let mut b = 0;
    while b < 128 {
        if norm_y[b] == 0xff {
            norm_y[b] = 0xfe;
        }
        b += 1;
    }
    let mut t = Sums {
        norm,
        norm_y,
        align: [0; 64],
        result: [0; 256],
    };
    let mut i = 0;
    while i < 64 {
        let f_max = (1 << m) - 1;
        let (fb, d) = (f_max - (i as u32 & f_max), i as u32 >> m);
        let v = ((1 << m) + fb) << GUARD;
        let q = v >> d;
        t.align[i] = (if q << d == v { q } else { q | 1 }) as u8;
        i += 1;
    }
    let mut n = 1u32;
    while n < 256 {
        let lead = 31 - n.leading_zeros();
        // The result's significand, 2^M to 2^(M + 1) (a carry included).
        let significand = if lead > m {
            rne_shift(n, lead - m)
        } else {
            n << (m - lead)
        };
        // Its exponent is the larger operand's plus lead - M - GUARD; the
        // byte's exponent field is e' less the offset.
        let k = lead as i32 - m as i32 - GUARD as i32 - sum_offset(f);
        let f_max = (1 << m) - 1;
        t.result[n as usize] = ((k << m) + significand as i32 - (1 << m) - f_max) as u8;
        n += 1;
    }
    t
}

static E4M3_SUMS: Sums = sum_tables(&E4M3_FORMAT);
static E5M2_SUMS: Sums = sum_tables(&E5M2_FORMAT);

/// [`steps`] on groups the byte lanes leave, out of line: the byte lanes'
/// loop keeps its tables in registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[cold]
#[inline(never)]
fn rare<const PROD: bool, const E5M2: bool>(acc: &mut [u8], src: &[u8], t: &Tables) {
    steps::<PROD, E5M2>(acc, src, t);
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

/// Prod over whole 64-byte groups: [`product_bytes`] on the bytes, and
/// where a group has a lane that needs it (see there), [`steps`] on that
/// group and the [`F32_RUN`] - 1 after it.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn products<const E5M2: bool>(acc: &mut [u8], src: &[u8], p: &Products, t: &Tables) -> usize {
    let norm = (load(&p.norm[..64]), load(&p.norm[64..]));
    let table = load(&p.product);
    groups(
        acc,
        src,
        |x, y| product_bytes::<E5M2>(x, y, norm, table, p),
        |a, b| rare::<true, E5M2>(a, b, t),
    )
}

/// Sum over whole 64-byte groups: [`sum_bytes`] on the bytes, and where a
/// group has a lane that needs it (see there), [`steps`] on that group and
/// the [`F32_RUN`] - 1 after it.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn sums<const E5M2: bool>(acc: &mut [u8], src: &[u8], sums: &Sums, t: &Tables) -> usize {
    let s = SumTables::load(sums);
    groups(
        acc,
        src,
        |x, y| sum_bytes::<E5M2>(x, y, &s),
        |a, b| rare::<false, E5M2>(a, b, t),
    )
}

/// Groups the f32 way once one needed it: data that has such lanes tends
/// to have more, and a group the byte lanes try and leave costs both ways.
/// From a group that needed it to the end of its block of `F32_RUN`
/// groups, and then 1, 2, 4 ... up to [`MAX_F32_BLOCKS`] blocks after as
/// blocks keep needing it (uniformly random bytes: nearly every block),
/// back to 1 after a block the byte lanes folded whole.
const F32_RUN: usize = 8;

/// The longest run of blocks [`groups`] leaves to the f32 lanes.
const MAX_F32_BLOCKS: usize = 64;

/// Whole 64-byte groups of `acc` and `src`: `bytes` where it answers
/// (returns an empty mask), else `f32` (see [`F32_RUN`]); returns how many
/// bytes it folded.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn groups(
    acc: &mut [u8],
    src: &[u8],
    bytes: impl Fn(__m512i, __m512i) -> (__m512i, u64),
    f32: impl Fn(&mut [u8], &[u8]),
) -> usize {
    let whole = acc.len().min(src.len()) / 64 * 64;
    let (acc, src) = (&mut acc[..whole], &src[..whole]);
    let (blocks, rest) = acc.as_chunks_mut::<{ 64 * F32_RUN }>();
    let (src_blocks, src_rest) = src.as_chunks::<{ 64 * F32_RUN }>();
    let (mut skip, mut next_skip) = (0, 1);
    for (a, b) in blocks.iter_mut().zip(src_blocks) {
        if skip > 0 {
            f32(a, b);
            skip -= 1;
            continue;
        }
        let (gs, bs) = (a.as_chunks_mut::<64>().0, b.as_chunks::<64>().0);
        let mut whole_block = true;
        for g in 0..F32_RUN {
            let (out, left) = bytes(load(&gs[g]), load(&bs[g]));
            if left != 0 {
                f32(&mut a[64 * g..], &b[64 * g..]);
                whole_block = false;
                break;
            }
            store(&mut gs[g], out);
        }
        if whole_block {
            next_skip = 1;
        } else {
            skip = next_skip;
            next_skip = MAX_F32_BLOCKS.min(2 * next_skip);
        }
    }
    // Fewer than F32_RUN groups left: one by one.
    let (gs, bs) = (rest.as_chunks_mut::<64>().0, src_rest.as_chunks::<64>().0);
    for (a, b) in gs.iter_mut().zip(bs) {
        let (out, left) = bytes(load(a), load(b));
        if left != 0 {
            f32(a, b);
        } else {
            store(a, out);
        }
    }
    whole
}

/// [`Sums`] in registers.
struct SumTables {
    norm: (__m512i, __m512i),
    norm_y: (__m512i, __m512i),
    align: __m512i,
    low: (__m512i, __m512i),
    high: (__m512i, __m512i),
}

impl SumTables {
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn load(t: &Sums) -> SumTables {
        let pair = |b: &[u8]| (load(&b[..64]), load(&b[64..128]));
        SumTables {
            norm: pair(&t.norm),
            norm_y: pair(&t.norm_y),
            align: load(&t.align),
            low: pair(&t.result[..128]),
            high: pair(&t.result[128..]),
        }
    }
}

/// 64 fp8 sums on the bytes, with no f32. With `A` the larger magnitude
/// and `B` the smaller (both normalised by [`Sums::norm`]), `A +- B` is
/// `(1.fa << GUARD) +- (1.fb << GUARD >> d)` units of `A`'s last place over
/// 2^GUARD: the shifted significand is looked up ([`Sums::align`], rounded
/// to odd; a zero `B` gives the sticky bit alone, which rounds away), the
/// integers are added or subtracted (at most 240), and the result's byte
/// is `A`'s exponent field plus a lookup of that integer ([`Sums::result`]:
/// normalised and rounded to nearest even), at most the largest finite
/// value. The sign is the larger operand's, `+0` where they cancel. The lanes this does not round are set in the returned mask,
/// and the caller folds their group the other way: a byte under `1 << M`
/// as an i8 is a result below the smallest normal (or out of range: E4M3
/// from 512 up) and every lane with an infinity or NaN (`A` 0xfe or 0xff:
/// its byte comes out negative; two never cancel, see [`Sums::norm_y`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn sum_bytes<const E5M2: bool>(x: __m512i, y: __m512i, s: &SumTables) -> (__m512i, u64) {
    let m: u32 = if E5M2 { 2 } else { 3 };
    let fraction = _mm512_set1_epi8(((1u32 << m) - 1) as i8);
    // `vpermi2b` reads the low 7 bits of each index: the magnitude.
    let nx = _mm512_permutex2var_epi8(s.norm.0, x, s.norm.1);
    let ny = _mm512_permutex2var_epi8(s.norm_y.0, y, s.norm_y.1);
    let (a, b) = (_mm512_max_epu8(nx, ny), _mm512_min_epu8(nx, ny));
    let opposite = _mm512_movepi8_mask(_mm512_xor_si512(x, y));
    // (A | F) - B = (d << M) + F - fb, at most the last byte of the
    // table (`vpermb` reads the low 6 bits; E5M2 uses 32).
    let af = _mm512_or_si512(a, fraction);
    let last = _mm512_set1_epi8(((8 << m) - 1) as i8);
    let aligned = _mm512_permutexvar_epi8(_mm512_min_epu8(_mm512_sub_epi8(af, b), last), s.align);
    // (1 << M | fa) << GUARD: a word shift moves bits across bytes only
    // into bits the mask clears.
    let big = _mm512_ternarylogic_epi32::<0xf8>(
        _mm512_set1_epi8((1 << (m + GUARD)) as i8),
        _mm512_slli_epi16::<{ GUARD }>(a),
        _mm512_set1_epi8(((((1u32 << m) - 1) << GUARD) as u8) as i8),
    );
    let total = _mm512_mask_sub_epi8(_mm512_add_epi8(big, aligned), opposite, big, aligned);
    let mut step = _mm512_permutex2var_epi8(s.low.0, total, s.low.1);
    if !E5M2 {
        let high = _mm512_permutex2var_epi8(s.high.0, total, s.high.1);
        step = _mm512_mask_blend_epi8(_mm512_movepi8_mask(total), step, high);
    }
    let out = _mm512_add_epi8(af, step);
    // Live lanes: not both zero, and not cancelling (a total of 0: equal
    // magnitudes, opposite signs, zeros included; never two infinities or
    // NaNs, see [`Sums::norm_y`]). The others are zero.
    let nonzero_total = _mm512_test_epi8_mask(total, total);
    let live = _mm512_mask_test_epi8_mask(nonzero_total, a, a);
    let small = _mm512_mask_cmplt_epi8_mask(live, out, _mm512_set1_epi8(1 << m));
    let largest = _mm512_set1_epi8(if E5M2 { 0x7b } else { 0x7e });
    let out = _mm512_maskz_min_epi8(live, out, largest);
    // The larger operand's sign (both zero: x's, which is y's where the
    // total is not 0); +0 where the total is 0.
    let larger = _mm512_mask_blend_epi8(_mm512_cmpgt_epu8_mask(ny, nx), x, y);
    let out = _mm512_ternarylogic_epi32::<0xf8>(out, larger, _mm512_set1_epi8(i8::MIN));
    (_mm512_maskz_mov_epi8(nonzero_total, out), small)
}

/// 64 fp8 products on the bytes, with no f32: a product of normal values
/// is `2^(ex + ey - bias)` times the product of their significands, so
/// its byte is `(ex + ey - bias) << M` plus a looked-up rounded product
/// of the two `M`-bit fractions (a carry into the exponent included), at
/// most the largest finite value (`float8` saturates). Subnormal factors
/// are normalised by a lookup first; zero factors give zero. The lanes
/// this does not round (a result below the smallest normal, which rounds
/// to a coarser step; an infinity or NaN factor) are set in the returned
/// mask, and the caller folds their group the other way.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn product_bytes<const E5M2: bool>(
    x: __m512i,
    y: __m512i,
    norm: (__m512i, __m512i),
    table: __m512i,
    p: &Products,
) -> (__m512i, u64) {
    let m: u32 = if E5M2 { 2 } else { 3 };
    // `vpermi2b` reads the low 7 bits of each index: the magnitude.
    let nx = _mm512_permutex2var_epi8(norm.0, x, norm.1);
    let ny = _mm512_permutex2var_epi8(norm.0, y, norm.1);
    let fraction = _mm512_set1_epi8(((1u32 << m) - 1) as i8);
    // fx | fy << M: a word shift moves bits across bytes only into bits
    // the fraction mask takes from `nx`; `vpermb` reads the low 6 bits.
    let fy = if E5M2 {
        _mm512_slli_epi16::<2>(ny)
    } else {
        _mm512_slli_epi16::<3>(ny)
    };
    let index = _mm512_ternarylogic_epi32::<0xd8>(fy, nx, fraction);
    let product = _mm512_permutexvar_epi8(index, table);
    // (ex' + ey') << M, saturating (only ever far past the largest).
    let sum = _mm512_adds_epu8(
        _mm512_andnot_si512(fraction, nx),
        _mm512_andnot_si512(fraction, ny),
    );
    let base = _mm512_subs_epu8(sum, _mm512_set1_epi8(p.offset as i8));
    let out = _mm512_min_epu8(
        _mm512_add_epi8(base, product),
        _mm512_set1_epi8(p.largest as i8),
    );
    let zero = _mm512_testn_epi8_mask(_mm512_min_epu8(nx, ny), _mm512_set1_epi8(-1));
    // `base` under 1 << M: the biased exponent is 0 or less.
    let small = _mm512_cmplt_epu8_mask(base, _mm512_set1_epi8(1 << m));
    let special = _mm512_cmpeq_epi8_mask(_mm512_max_epu8(nx, ny), _mm512_set1_epi8(-1));
    let out = _mm512_maskz_mov_epi8(!zero, out);
    // out | ((x ^ y) & 0x80): the product's sign.
    let sign = _mm512_xor_si512(x, y);
    let out = _mm512_ternarylogic_epi32::<0xf8>(out, sign, _mm512_set1_epi8(i8::MIN));
    (out, special | (small & !zero))
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
pub(super) fn splat16(x: u16) -> __m512i {
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
pub(super) fn round_high_byte(c: __m512i) -> __m512i {
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
pub(super) fn e5m2_saturate<const MAGNITUDE: bool>(b: __m512i) -> __m512i {
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
pub(super) fn load(c: &[u8]) -> __m512i {
    assert!(c.len() >= 64);
    // SAFETY: 64 readable bytes (checked above); no alignment needed.
    unsafe { _mm512_loadu_si512(c.as_ptr().cast()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub(super) fn store(c: &mut [u8], v: __m512i) {
    assert!(c.len() >= 64);
    // SAFETY: 64 writable bytes (checked above); no alignment needed.
    unsafe { _mm512_storeu_si512(c.as_mut_ptr().cast(), v) }
}

#[cfg(test)]
pub(super) mod tests {
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

    /// Pairs (`a << 8 | b`) where `run` on every pair (`acc` the first
    /// bytes, `src` the second) differs from `Element`'s arithmetic (NaN for
    /// NaN counts as equal: payloads are not specified).
    pub(in crate::widened) fn pair_mismatches<T: Element>(
        from: impl Fn(u8) -> T,
        base: BaseOp,
        run: impl FnOnce(&mut [u8], &[u8]) -> usize,
    ) -> Vec<u16> {
        let mut acc: Vec<u8> = (0..=u16::MAX).map(|i| (i >> 8) as u8).collect();
        let src: Vec<u8> = (0..=u16::MAX).map(|i| i as u8).collect();
        assert_eq!(
            run(&mut acc, &src),
            acc.len(),
            "65536 is whole 64-byte groups"
        );
        (0..=u16::MAX)
            .filter(|&i| {
                let got = from(acc[usize::from(i)]);
                let want = base.apply(from((i >> 8) as u8), from(i as u8));
                let nan = |x: T| x.to_f64().is_nan();
                !(got.bits_eq(want) || nan(got) && nan(want))
            })
            .collect()
    }

    /// [`pair_mismatches`] of [`steps`] with `t`.
    fn mismatches<T: Element, const PROD: bool, const E5M2: bool>(
        from: impl Fn(u8) -> T,
        t: &Tables,
    ) -> Vec<u16> {
        let base = if PROD { BaseOp::Prod } else { BaseOp::Sum };
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (callers check `runs`).
        pair_mismatches(from, base, |acc, src| unsafe {
            steps::<PROD, E5M2>(acc, src, t)
        })
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

    /// [`pair_mismatches`] of `fold`: the byte lanes, and [`steps`] on the
    /// groups they leave.
    fn fold_mismatches<T: Element>(from: impl Fn(u8) -> T, prod: bool, e5m2: bool) -> Vec<u16> {
        let base = if prod { BaseOp::Prod } else { BaseOp::Sum };
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (callers check `runs`).
        pair_mismatches(from, base, |acc, src| unsafe { fold(acc, src, prod, e5m2) })
    }

    #[test]
    fn fold_matches_element_arithmetic_on_every_pair() {
        if !runs() {
            return;
        }
        let (e4, e5) = (|b| F8E4M3::from_bits(b), |b| F8E5M2::from_bits(b));
        for prod in [false, true] {
            assert_eq!(fold_mismatches(e4, prod, false), [], "E4M3 prod {prod}");
            assert_eq!(fold_mismatches(e5, prod, true), [], "E5M2 prod {prod}");
        }
    }

    /// Every pair through [`product_bytes`] or [`sum_bytes`] alone (`fold`
    /// folds whole groups the other way where one lane needs it): pairs
    /// where the byte lanes answer and differ from `Element`'s arithmetic,
    /// and how many they leave to [`steps`].
    fn byte_lanes<T: Element>(
        from: impl Fn(u8) -> T,
        base: BaseOp,
        group: impl Fn(&[u8], &[u8]) -> ([u8; 64], u64),
    ) -> (Vec<u16>, usize) {
        let (mut bad, mut left) = (Vec::new(), 0);
        for g in 0..1024u16 {
            let pair = |k: u16| (g << 6) | k;
            let xs: Vec<u8> = (0..64).map(|k| (pair(k) >> 8) as u8).collect();
            let ys: Vec<u8> = (0..64).map(|k| pair(k) as u8).collect();
            let (out, mask) = group(&xs, &ys);
            for k in 0..64 {
                if mask >> k & 1 == 1 {
                    left += 1;
                    continue;
                }
                let (got, want) = (from(out[k]), base.apply(from(xs[k]), from(ys[k])));
                if !got.bits_eq(want) {
                    bad.push(pair(k as u16));
                }
            }
        }
        (bad, left)
    }

    /// [`product_bytes`] of 64 pairs, as bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn product_group<const E5M2: bool>(xs: &[u8], ys: &[u8], p: &Products) -> ([u8; 64], u64) {
        let norm = (load(&p.norm[..64]), load(&p.norm[64..]));
        let (o, mask) = product_bytes::<E5M2>(load(xs), load(ys), norm, load(&p.product), p);
        let mut out = [0u8; 64];
        store(&mut out, o);
        (out, mask)
    }

    /// [`sum_bytes`] of 64 pairs, as bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn sum_group<const E5M2: bool>(xs: &[u8], ys: &[u8], sums: &Sums) -> ([u8; 64], u64) {
        let (o, mask) = sum_bytes::<E5M2>(load(xs), load(ys), &SumTables::load(sums));
        let mut out = [0u8; 64];
        store(&mut out, o);
        (out, mask)
    }

    fn product_lanes<T: Element, const E5M2: bool>(
        from: impl Fn(u8) -> T,
        p: &Products,
    ) -> (Vec<u16>, usize) {
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (callers check `runs`).
        byte_lanes(from, BaseOp::Prod, |x, y| unsafe {
            product_group::<E5M2>(x, y, p)
        })
    }

    #[test]
    fn byte_lanes_match_element_arithmetic_where_they_answer() {
        if !runs() {
            return;
        }
        let (e4, e5) = (|b| F8E4M3::from_bits(b), |b| F8E5M2::from_bits(b));
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (`runs`).
        let e4_sums = |x: &[u8], y: &[u8]| unsafe { sum_group::<false>(x, y, &E4M3_SUMS) };
        // SAFETY: the CPU has AVX-512 F, BW and VBMI (`runs`).
        let e5_sums = |x: &[u8], y: &[u8]| unsafe { sum_group::<true>(x, y, &E5M2_SUMS) };
        for (name, (bad, left)) in [
            ("E4M3 Prod", product_lanes::<_, false>(e4, &E4M3_PRODUCTS)),
            ("E5M2 Prod", product_lanes::<_, true>(e5, &E5M2_PRODUCTS)),
            ("E4M3 Sum", byte_lanes(e4, BaseOp::Sum, e4_sums)),
            ("E5M2 Sum", byte_lanes(e5, BaseOp::Sum, e5_sums)),
        ] {
            assert_eq!(bad, [], "{name}");
            println!("{name}: {left} of 65536 pairs left to the f32 lanes");
            // Results under the smallest normal, NaN and infinite operands.
            assert!(left < 16384, "{name}: {left}");
        }
    }

    /// The check above can fail: one wrong rounded product (E4M3 1.0 * 1.0
    /// read as 1.125) shows up in pairs of significands 1.0, and only there.
    #[test]
    fn a_corrupted_product_entry_is_caught() {
        if !runs() {
            return;
        }
        let mut p = product_tables(&E4M3_FORMAT);
        p.product[0] += 1;
        let (bad, _) = product_lanes::<_, false>(F8E4M3::from_bits, &p);
        assert!(bad.contains(&0x3838), "1 * 1 read the bad entry: {bad:x?}");
        // Only there: both factors' normalised fractions are 0.
        let fraction = |b: u16| p.norm[usize::from(b & 0x7f)] & 0x07;
        assert!(bad
            .iter()
            .all(|&i| fraction(i >> 8) == 0 && fraction(i) == 0));
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
