// Element arithmetic, bit for bit as oxccl-core/src/element.rs computes on
// the CPU: integers wrap; f32/f64 compute natively (compiled with
// --fmad=false so no multiply-add is contracted); f16, bf16 and both fp8
// formats widen to f32, compute, and round back to nearest-even. The
// conversions (out of line for f16 and fp8, which keeps NVRTC's compile
// time and code size small) are written out here (not taken from cuda_fp16.h and
// friends) so they match the Rust `half` and `float8` crates exactly,
// NaN payloads included, and NVRTC needs no toolkit headers.

struct ox_f16 { u16 b; };
struct ox_bf16 { u16 b; };
struct ox_e4m3 { u8 b; };
struct ox_e5m2 { u8 b; };

#define OX_SUM 0
#define OX_PROD 1
#define OX_MAX 2
#define OX_MIN 3

__device__ __forceinline__ float ox_bits_f32(u32 b) { return __uint_as_float(b); }
__device__ __forceinline__ u32 ox_f32_bits(float f) { return __float_as_uint(f); }

// ---- binary16 ----
__device__ __noinline__ float ox_f16_to_f32(u16 i) {
  if ((i & 0x7FFFu) == 0) return ox_bits_f32((u32)i << 16);
  u32 hs = i & 0x8000u, he = i & 0x7C00u, hm = i & 0x03FFu;
  if (he == 0x7C00u) {
    if (hm == 0) return ox_bits_f32((hs << 16) | 0x7F800000u);
    return ox_bits_f32((hs << 16) | 0x7FC00000u | (hm << 13));
  }
  u32 sign = hs << 16;
  i32 ue = ((i32)he >> 10) - 15;
  if (he == 0) {
    i32 e = (__clz(hm) - 16) - 6;
    u32 exp = (u32)(127 - 15 - e) << 23;
    u32 man = (hm << (14 + e)) & 0x7FFFFFu;
    return ox_bits_f32(sign | exp | man);
  }
  return ox_bits_f32(sign | ((u32)(ue + 127) << 23) | ((hm & 0x3FFu) << 13));
}

__device__ __noinline__ u16 ox_f32_to_f16(float v) {
  u32 x = ox_f32_bits(v);
  u32 sign = x & 0x80000000u, exp = x & 0x7F800000u, man = x & 0x007FFFFFu;
  if (exp == 0x7F800000u) {
    u32 nan_bit = man == 0 ? 0 : 0x0200u;
    return (u16)((sign >> 16) | 0x7C00u | nan_bit | (man >> 13));
  }
  u32 hs = sign >> 16;
  i32 he = (i32)(exp >> 23) - 127 + 15;
  if (he >= 0x1F) return (u16)(hs | 0x7C00u);
  if (he <= 0) {
    if (14 - he > 24) return (u16)hs;
    u32 m = man | 0x00800000u;
    u32 hm = m >> (14 - he);
    u32 rb = 1u << (13 - he);
    if ((m & rb) != 0 && (m & (3 * rb - 1)) != 0) hm += 1;
    return (u16)(hs | hm);
  }
  u32 r = hs | ((u32)he << 10) | (man >> 13);
  u32 rb = 0x1000u;
  if ((man & rb) != 0 && (man & (3 * rb - 1)) != 0) r += 1;
  return (u16)r;
}

// ---- bfloat16 ----
__device__ __forceinline__ float ox_bf16_to_f32(u16 i) {
  if ((i & 0x7FFFu) > 0x7F80u) return ox_bits_f32(((u32)i | 0x40u) << 16);
  return ox_bits_f32((u32)i << 16);
}
__device__ __forceinline__ u16 ox_f32_to_bf16(float v) {
  u32 x = ox_f32_bits(v);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((x >> 16) | 0x40u);
  u32 rb = 0x8000u;
  if ((x & rb) != 0 && (x & (3 * rb - 1)) != 0) return (u16)((x >> 16) + 1);
  return (u16)(x >> 16);
}

// ---- fp8 (E4M3 / E5M2), saturating to the largest finite value ----
template <bool E4M3>
__device__ __noinline__ u8 ox_f32_to_fp8(float f) {
  u64 xb = (u64)__double_as_longlong((double)f);
  const u8 maxnorm = E4M3 ? 0x7E : 0x7B;
  const u8 mmask = E4M3 ? 0x7 : 0x3;
  const u32 bias = E4M3 ? 7 : 15;
  const u64 sigbits = E4M3 ? 4 : 3;
  const u64 mindenorm_o2 = E4M3 ? 0x3F50000000000000ull : 0x3EE0000000000000ull;
  const u64 overflow = E4M3 ? 0x407D000000000000ull : (0x40EE000000000000ull - 1);
  const u64 minnorm = E4M3 ? 0x3F90000000000000ull : 0x3F10000000000000ull;
  const u64 half_ulp = 1ull << (53 - sigbits - 1);
  u8 sign = (u8)((xb >> 63) << 7);
  u8 exp = (u8)(((u32)((xb >> 52) & 0x7FF) - 1023u + bias) & 0xFFFFu);
  u8 mant = (u8)((xb >> (53 - sigbits)) & mmask);
  u64 absx = xb & 0x7FFFFFFFFFFFFFFFull;
  u8 res;
  if (absx <= mindenorm_o2) {
    res = 0;
  } else if (absx > 0x7FF0000000000000ull) {
    res = E4M3 ? 0x7F : (u8)(0x7E | mant);
  } else if (absx > overflow) {
    res = maxnorm;
  } else if (absx >= minnorm) {
    res = (u8)((exp << (sigbits - 1)) | mant);
    u64 round = xb & ((half_ulp << 1) - 1);
    if (round > half_ulp || (round == half_ulp && (mant & 1))) res = (u8)(res + 1);
  } else {
    u8 shift = (u8)(1 - exp);
    u8 m = (u8)(mant | (1 << (sigbits - 1)));
    res = (u8)(m >> shift);
    u64 round = (xb | (1ull << 52)) & ((half_ulp << (shift + 1)) - 1);
    u64 h = half_ulp << shift;
    if (round > h || (round == h && (res & 1))) res = (u8)(res + 1);
  }
  return (u8)(res | sign);
}

template <bool E4M3>
__device__ __noinline__ float ox_fp8_to_f32(u8 x) {
  u16 ur = (u16)((u16)x << 8);
  if (!E4M3) {
    if ((ur & 0x7FFFu) > 0x7C00u) ur = 0x7FFF;
  } else {
    u16 sign = ur & 0x8000u;
    u16 exponent = (u16)(((ur & 0x7800u) >> 1) + 0x2000u);
    u16 mantissa = (u16)((ur & 0x0700u) >> 1);
    u8 absx = 0x7F & x;
    if (absx == 0x7F) {
      ur = 0x7FFF;
    } else if (exponent == 0x2000u) {
      if (mantissa != 0) {
        mantissa = (u16)(mantissa << 1);
        while ((mantissa & 0x0400u) == 0) {
          mantissa = (u16)(mantissa << 1);
          exponent = (u16)(exponent - 0x0400u);
        }
        mantissa &= 0x03FFu;
      } else {
        exponent = 0;
      }
      ur = (u16)(sign | exponent | mantissa);
    } else {
      ur = (u16)(sign | exponent | mantissa);
    }
  }
  return ox_f16_to_f32(ur);
}

// ---- per-type arithmetic: add, mul, max, min, div by a rank count ----
template <typename T> struct OxNum;

#define OX_INT_NUM(T, U)                                                         \
  template <> struct OxNum<T> {                                                  \
    static __device__ __forceinline__ T add(T a, T b) { return (T)((U)a + (U)b); } \
    static __device__ __forceinline__ T mul(T a, T b) { return (T)((U)a * (U)b); } \
    static __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }  \
    static __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }  \
    static __device__ __forceinline__ T div(T a, u32 n) { return (T)(a / (T)n); } \
  };
OX_INT_NUM(i8, u32)
OX_INT_NUM(u8, u32)
OX_INT_NUM(i32, u32)
OX_INT_NUM(u32, u32)
OX_INT_NUM(i64, u64)
OX_INT_NUM(u64, u64)

template <> struct OxNum<float> {
  static __device__ __forceinline__ float add(float a, float b) { return a + b; }
  static __device__ __forceinline__ float mul(float a, float b) { return a * b; }
  static __device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
  static __device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
  static __device__ __forceinline__ float div(float a, u32 n) { return a / (float)n; }
};
template <> struct OxNum<double> {
  static __device__ __forceinline__ double add(double a, double b) { return a + b; }
  static __device__ __forceinline__ double mul(double a, double b) { return a * b; }
  static __device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }
  static __device__ __forceinline__ double min(double a, double b) { return fmin(a, b); }
  static __device__ __forceinline__ double div(double a, u32 n) { return a / (double)n; }
};

#define OX_WIDE_NUM(T, TO, FROM)                                                             \
  template <> struct OxNum<T> {                                                              \
    static __device__ __forceinline__ T mk(float f) { T r; r.b = FROM(f); return r; }          \
    static __device__ __forceinline__ T add(T a, T b) { return mk(TO(a.b) + TO(b.b)); }       \
    static __device__ __forceinline__ T mul(T a, T b) { return mk(TO(a.b) * TO(b.b)); }       \
    static __device__ __forceinline__ T max(T a, T b) { return mk(fmaxf(TO(a.b), TO(b.b))); } \
    static __device__ __forceinline__ T min(T a, T b) { return mk(fminf(TO(a.b), TO(b.b))); } \
    static __device__ __forceinline__ T div(T a, u32 n) { return mk(TO(a.b) / (float)n); }    \
  };
OX_WIDE_NUM(ox_f16, ox_f16_to_f32, ox_f32_to_f16)
OX_WIDE_NUM(ox_bf16, ox_bf16_to_f32, ox_f32_to_bf16)
OX_WIDE_NUM(ox_e4m3, ox_fp8_to_f32<true>, ox_f32_to_fp8<true>)
OX_WIDE_NUM(ox_e5m2, ox_fp8_to_f32<false>, ox_f32_to_fp8<false>)

template <typename T, int OP>
__device__ __forceinline__ T ox_apply(T a, T b) {
  if (OP == OX_SUM) return OxNum<T>::add(a, b);
  if (OP == OX_PROD) return OxNum<T>::mul(a, b);
  if (OP == OX_MAX) return OxNum<T>::max(a, b);
  return OxNum<T>::min(a, b);
}
