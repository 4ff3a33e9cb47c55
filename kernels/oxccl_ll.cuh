// The LL (low-latency) protocol for FIFO connections.
//
// An LL slot is a run of 16-byte lines {data 4 B, flag 4 B, data 4 B,
// flag 4 B}: line k carries bytes [8k, 8k + 8) of the message. The sender
// writes a whole line with one 16-byte volatile store, so each {data, flag}
// half lands at once and no fence is needed; the receiver polls the lines
// it reads until both flags equal the message's flag. The flag is
// ox_ll_flag(message index), where the index is the connection's tail
// (sender) or head (receiver): counters that only grow, so a connection
// needs no reset between calls and graph replays stay correct. The flag is
// never 0 (zeroed memory never passes for data); it repeats only after
// 2^32 - 1 messages on one connection. A message always has at least one
// line, so an empty message still orders the receiver after the sender,
// as under Simple.
//
// Elements of 1, 2, 4 or 8 bytes pack into the 8 data bytes of a line; the
// last line of a message may be partly used (the rest is zero). Reductions
// run element by element in the same order and with the same arithmetic
// as ox_reduce_copy, so LL and Simple produce the same bits.

__device__ __forceinline__ u32 ox_ll_flag(u64 count) {
  return (u32)(count % 0xFFFFFFFFull) + 1;
}

__device__ __forceinline__ uint4 ox_ll_load(const char* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void ox_ll_store(char* p, u32 lo, u32 hi, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(lo), "r"(flag),
               "r"(hi), "r"(flag)
               : "memory");
}

// The 8 data bytes of a line, as elements.
template <typename T>
union OxWord {
  u64 d;
  u32 w[2];
  T e[8 / sizeof(T)];
};

// Polls one line until both flags equal `flag`; returns its data bytes.
// Every 1024 polls it checks the block's failure word (another thread of
// the block gave up), the host's abort flag, the world's failure word and
// the deadline; a failure is recorded with {rank, peer, channel, step}.
__device__ bool ox_ll_wait(const OxDesc& d, const char* line, u32 flag, u64* out, u32 peer,
                           u32 step, volatile int* block_fail) {
  uint4 v = ox_ll_load(line);
  if (v.y == flag && v.w == flag) {
    *out = (u64)v.x | ((u64)v.z << 32);
    return true;
  }
  const u64 t0 = ox_globaltimer();
  for (u32 spins = 1;; ++spins) {
    v = ox_ll_load(line);
    if (v.y == flag && v.w == flag) {
      *out = (u64)v.x | ((u64)v.z << 32);
      return true;
    }
    if ((spins & 1023) == 0) {
      if (*block_fail) return false;
      const u64 waited = ox_globaltimer() - t0;
      u32 code = 0;
      if (*d.abort_flag != 0)
        code = OXE_ABORTED;
      else if (*d.world_fail != 0)
        code = OXE_PEER_FAILED;
      else if (waited > d.timeout_ns)
        code = OXE_TIMEOUT;
      if (code != 0) {
        ox_fail(d, code, peer, step, OXA_MESSAGE, waited);
        *block_fail = 1;
        return false;
      }
    }
  }
}

// Loads the `m` valid elements of a line's worth of plain memory (the
// rest zero): one 8-byte load when the line is full and aligned.
template <typename T>
__device__ __forceinline__ u64 ox_ll_ld_mem(const char* p, int m) {
  constexpr int E = 8 / sizeof(T);
  OxWord<T> x;
  if (m == E && ((u64)p & 7) == 0) return ox_ld1<u64>(p);
  x.d = 0;
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (j < m) x.e[j] = ox_ld1<T>(p + j * sizeof(T));
  return x.d;
}
template <typename T>
__device__ __forceinline__ void ox_ll_st_mem(char* p, u64 v, int m) {
  constexpr int E = 8 / sizeof(T);
  OxWord<T> x;
  x.d = v;
  if (m == E && ((u64)p & 7) == 0) {
    ox_st1<u64>(p, v);
    return;
  }
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (j < m) ox_st1<T>(p + j * sizeof(T), x.e[j]);
}

// Writes line k's reduced word to every destination (as a line with its
// flag when an LL slot).
template <typename T>
__device__ __forceinline__ void ox_ll_put(char* const* dst, int ndst, const u32* dflags, u64 k,
                                          OxWord<T> acc, int m) {
  for (int k2 = 0; k2 < ndst; ++k2) {
    if (dflags[k2] != 0)
      ox_ll_store(dst[k2] + k * 16, acc.w[0], acc.w[1], dflags[k2]);
    else
      ox_ll_st_mem<T>(dst[k2] + k * 8, acc.d, m);
  }
}

// Elements of line k that hold data (0 for the line of an empty message).
__device__ __forceinline__ int ox_ll_valid(u64 n, u64 k, int E) {
  const u64 i0 = k * E;
  return n > i0 ? (n - i0 < (u64)E ? (int)(n - i0) : E) : 0;
}

// Relaunch mode: whether every line of every LL source (flags[s] != 0) of
// an nlines-line message has arrived, by the whole block: 0 if so, else
// 1 + a source with a line missing. Every thread reaches the barrier.
__device__ int ox_ll_missing(char* const* src, int nsrc, const u32* flags, u64 nlines) {
  __shared__ int s_missing;
  if (threadIdx.x == 0) s_missing = 0;
  __syncthreads();
  for (int s = 0; s < nsrc; ++s) {
    if (flags[s] == 0) continue;
    for (u64 k = threadIdx.x; k < nlines; k += blockDim.x) {
      const uint4 v = ox_ll_load(src[s] + k * 16);
      if (v.y != flags[s] || v.w != flags[s]) atomicExch(&s_missing, 1 + s);
    }
  }
  __syncthreads();
  return s_missing;
}

// A small message from several sources: thread (k, s) fetches line k of
// source s, so every source's line is polled at once and the step waits
// for its last arrival once, not for each source in turn (a one-shot
// reduction's sources arrive together, and polling them one after another
// cost a memory round trip each). Then thread k reduces its line in
// source order, as the general path does, so the bits are the same.
// Needs nlines * nsrc <= blockDim.x. Every thread reaches the barrier.
template <typename T, int OP>
__device__ bool ox_ll_reduce_small(const OxDesc& d, char* const* src, const u8* pre, int nsrc,
                                   char* const* dst, int ndst, const u32* flags,
                                   const u32* peers, u64 n, u64 nlines, T scale, u32 post,
                                   u32 step, volatile int* block_fail) {
  constexpr int E = 8 / sizeof(T);
  __shared__ u64 s_word[OX_THREADS];
  const u32 tid = threadIdx.x;
  const u64 k = tid / nsrc;
  const int s = tid % nsrc;
  if (k < nlines) {
    OxWord<T> x;
    x.d = 0;
    bool ok = true;
    if (flags[s] != 0)
      ok = ox_ll_wait(d, src[s] + k * 16, flags[s], &x.d, peers[s], step, block_fail);
    else
      x.d = ox_ll_ld_mem<T>(src[s] + k * 8, ox_ll_valid(n, k, E));
    if (ok && pre[s]) {
#pragma unroll
      for (int j = 0; j < E; ++j) x.e[j] = OxNum<T>::mul(x.e[j], scale);
    }
    s_word[tid] = x.d;
  }
  __syncthreads();
  if (*block_fail) return false;
  if (tid < nlines) {
    OxWord<T> acc;
    acc.d = s_word[tid * nsrc];
    for (int s2 = 1; s2 < nsrc; ++s2) {
      OxWord<T> x;
      x.d = s_word[tid * nsrc + s2];
#pragma unroll
      for (int j = 0; j < E; ++j) acc.e[j] = ox_apply<T, OP>(acc.e[j], x.e[j]);
    }
    if (post) {
#pragma unroll
      for (int j = 0; j < E; ++j) acc.e[j] = OxNum<T>::div(acc.e[j], post);
    }
    ox_ll_put<T>(dst, ndst, flags + nsrc, tid, acc, ox_ll_valid(n, tid, E));
  }
  return true;
}

// The LL counterpart of ox_reduce_copy, by the whole block: line k of the
// message is read from every source (polled when it is an LL slot, `flag`
// non-zero), reduced, and written to every destination (as a line with
// its flag when an LL slot). Operand i's flag is flags[i] (sources first,
// then destinations), 0 for plain memory; peers[i] names the peer for
// errors. Returns false once the block has failed.
template <typename T, int OP>
__device__ bool ox_ll_reduce_copy(const OxDesc& d, char* const* src, const u8* pre, int nsrc,
                                  char* const* dst, int ndst, const u32* flags, const u32* peers,
                                  u64 n, T scale, u32 post, u32 step, volatile int* block_fail) {
  constexpr int E = 8 / sizeof(T);
  const u64 bytes = n * sizeof(T);
  const u64 nlines = bytes == 0 ? 1 : (bytes + 7) / 8;
  if (nsrc > 1 && nlines * nsrc <= blockDim.x)
    return ox_ll_reduce_small<T, OP>(d, src, pre, nsrc, dst, ndst, flags, peers, n, nlines, scale,
                                     post, step, block_fail);
  for (u64 k = threadIdx.x; k < nlines; k += blockDim.x) {
    const int m = ox_ll_valid(n, k, E);
    OxWord<T> acc;
    for (int s = 0; s < nsrc; ++s) {
      OxWord<T> x;
      if (flags[s] != 0) {
        if (!ox_ll_wait(d, src[s] + k * 16, flags[s], &x.d, peers[s], step, block_fail))
          return false;
      } else {
        x.d = ox_ll_ld_mem<T>(src[s] + k * 8, m);
      }
      if (pre[s]) {
#pragma unroll
        for (int j = 0; j < E; ++j) x.e[j] = OxNum<T>::mul(x.e[j], scale);
      }
      if (s == 0) {
        acc.d = x.d;
      } else {
#pragma unroll
        for (int j = 0; j < E; ++j) acc.e[j] = ox_apply<T, OP>(acc.e[j], x.e[j]);
      }
    }
    if (post) {
#pragma unroll
      for (int j = 0; j < E; ++j) acc.e[j] = OxNum<T>::div(acc.e[j], post);
    }
    ox_ll_put<T>(dst, ndst, flags + nsrc, k, acc, m);
  }
  return true;
}
