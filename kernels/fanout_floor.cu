// The fan-out experiment's kernels (crates/oxccl-bench/examples/
// fanout_floor.rs, which describes them): read one buffer once and write
// it into several, in the access patterns an executor could use, next to
// a plain copy and a plain fill of the same run. Compiled with NVRTC on
// their own. FoParams is mirrored by `Params` there (both sides check its
// size).

typedef unsigned int u32;
typedef unsigned long long u64;

#define FO_MAX_DST 8

// Mirrors `Params` in fanout_floor.rs.
struct FoParams {
  u64 src;              // const uint4*
  u64 dst[FO_MAX_DST];  // uint4*, the first ndst used
  u64 begin;            // this launch's vectors: [begin, end)
  u64 end;
  u32 ndst;
  u32 seed;             // fo_pattern's value base
};
static_assert(sizeof(FoParams) == 96, "FoParams must mirror Params");

__device__ __forceinline__ uint4 fo_value(u64 i, u32 seed) {
  u32 x = (u32)i * 2654435761u + seed;
  return make_uint4(x, x ^ 0x9e3779b9u, x + 1u, (u32)(i >> 32));
}

// src[i] = fo_value(i): the input every pattern copies (checked after).
extern "C" __global__ void fo_pattern(const __grid_constant__ FoParams p) {
  uint4* s = (uint4*)p.src;
  for (u64 i = p.begin + blockIdx.x * (u64)blockDim.x + threadIdx.x; i < p.end;
       i += (u64)gridDim.x * blockDim.x)
    s[i] = fo_value(i, p.seed);
}

// The copy ceiling: dst[0][i] = src[i], grid-stride, 4 loads in flight.
extern "C" __global__ void fo_copy(const __grid_constant__ FoParams p) {
  const uint4* s = (const uint4*)p.src;
  uint4* d = (uint4*)p.dst[0];
  const u64 nt = blockDim.x, stride = (u64)gridDim.x * nt * 4;
  for (u64 b = p.begin + blockIdx.x * nt * 4 + threadIdx.x; b < p.end; b += stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (b + u * nt < p.end) v[u] = s[b + u * nt];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (b + u * nt < p.end) d[b + u * nt] = v[u];
  }
}

// The write ceiling: every dst[k][i] = a constant, grid-stride.
extern "C" __global__ void fo_fill(const __grid_constant__ FoParams p) {
  const uint4 v = make_uint4(p.seed, p.seed, p.seed, p.seed);
  for (u32 k = 0; k < p.ndst; ++k) {
    uint4* d = (uint4*)p.dst[k];
    for (u64 i = p.begin + blockIdx.x * (u64)blockDim.x + threadIdx.x; i < p.end;
         i += (u64)gridDim.x * blockDim.x)
      d[i] = v;
  }
}

template <bool CS>
__device__ __forceinline__ void fo_st(uint4* a, uint4 v) {
  if (CS)
    __stcs(a, v);
  else
    *a = v;
}

// Each block owns one contiguous slice of [begin, end) (the executor's
// layout: a channel's range); per pass every thread loads U vectors, then
// stores them into every destination, destination by destination.
template <int U, bool CS>
__device__ void fo_fan_slice(const FoParams& p) {
  const u64 n = p.end - p.begin, per = (n + gridDim.x - 1) / gridDim.x;
  const u64 lo = p.begin + blockIdx.x * per, hi = lo + per < p.end ? lo + per : p.end;
  const uint4* s = (const uint4*)p.src;
  const u64 nt = blockDim.x;
  for (u64 b = lo + threadIdx.x; b < hi; b += nt * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (b + u * nt < hi) v[u] = s[b + u * nt];
    for (u32 k = 0; k < p.ndst; ++k) {
      uint4* d = (uint4*)p.dst[k];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b + u * nt < hi) fo_st<CS>(d + b + u * nt, v[u]);
    }
  }
}
extern "C" __global__ void fo_fan_slice4(const __grid_constant__ FoParams p) {
  fo_fan_slice<4, false>(p);
}
extern "C" __global__ void fo_fan_slice8(const __grid_constant__ FoParams p) {
  fo_fan_slice<8, false>(p);
}
extern "C" __global__ void fo_fan_slice4_cs(const __grid_constant__ FoParams p) {
  fo_fan_slice<4, true>(p);
}

// Grid-stride instead: at any moment all blocks together write one
// window of each destination (the fill's locality), U vectors per thread.
template <int U, bool CS>
__device__ void fo_fan_grid(const FoParams& p) {
  const uint4* s = (const uint4*)p.src;
  const u64 nt = blockDim.x, stride = (u64)gridDim.x * nt * U;
  for (u64 b = p.begin + blockIdx.x * nt * U + threadIdx.x; b < p.end; b += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (b + u * nt < p.end) v[u] = s[b + u * nt];
    for (u32 k = 0; k < p.ndst; ++k) {
      uint4* d = (uint4*)p.dst[k];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b + u * nt < p.end) fo_st<CS>(d + b + u * nt, v[u]);
    }
  }
}
extern "C" __global__ void fo_fan_grid4(const __grid_constant__ FoParams p) {
  fo_fan_grid<4, false>(p);
}
extern "C" __global__ void fo_fan_grid4_cs(const __grid_constant__ FoParams p) {
  fo_fan_grid<4, true>(p);
}

// One destination per block: the slice is read once per destination
// (L2 serves the repeats when the blocks of one slice run together).
extern "C" __global__ void fo_fan_perdst(const __grid_constant__ FoParams p) {
  const u32 k = blockIdx.x % p.ndst, g = blockIdx.x / p.ndst, groups = gridDim.x / p.ndst;
  const u64 n = p.end - p.begin, per = (n + groups - 1) / groups;
  const u64 lo = p.begin + g * per, hi = lo + per < p.end ? lo + per : p.end;
  const uint4* s = (const uint4*)p.src;
  uint4* d = (uint4*)p.dst[k];
  const u64 nt = blockDim.x;
  for (u64 b = lo + threadIdx.x; b < hi; b += nt * 4) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (b + u * nt < hi) v[u] = s[b + u * nt];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (b + u * nt < hi) d[b + u * nt] = v[u];
  }
}
