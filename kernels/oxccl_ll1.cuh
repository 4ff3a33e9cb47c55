// The one-step LL AllReduce ("LL one-shot", OXD_LL1): one block per rank,
// no plan. Each rank owns LL slots (world/oneshot_ll.rs): 2 parities x n
// senders x ll1_lines lines of 16 bytes, the FIFO LL line of oxccl_ll.cuh
// ({data 4 B, flag 4 B, data 4 B, flag 4 B}, one 16-byte volatile store,
// so each {data, flag} half lands at once and no fence is needed).
//
// The epoch is this rank's count of finished one-shot calls, in device
// memory, advanced by the kernel itself at its end, so a call captured in
// a graph gets a fresh epoch each replay. Call e uses the flag
// ox_ll_flag(e) (never 0: zeroed slots are never data) and parity e & 1.
//
// Rank r: (1) stores its input, pre-scaled by its own factor (a
// PreMulSum's factor is each rank's, so the sender applies it), as lines
// tagged with the flag into slot [parity][r] of every rank, itself
// included; (2) reads slot [parity][q] for q = 0..n-1, polling each line
// until its flags are the call's, and reduces the n contributions in rank
// order (post-divide at the end, as the FIFO one-shot plan does), so every
// rank computes the same bits as the sequential reference; (3) advances
// its epoch.
//
// No exit barrier. Rank r overwrites parity p of a peer q's slots only at
// call e + 2, and its kernel for e + 2 starts after its kernel for e + 1
// finished (one stream), which read q's e + 1 lines; q stored those in
// its kernel for e + 1, which started after its kernel for e finished,
// reads of slot [p][r] included. So a line of call e is never overwritten
// while its reader still needs it. The kernel boundaries on each rank's
// stream order the accesses; the flags order the ranks.
//
// Every poll checks, every 1024 polls, the abort flag, the clique's
// failure word and the deadline (ox_ll_wait), and records {rank, peer,
// channel 0, step 0} on failure, as the executor's waits do.

// Sources reduced per batch of loads: a thread issues the loads of up to
// this many senders' lines before it uses the first.
#define OX_LL1_BATCH 8

// Reduces line k of every sender's slot (srcs[q] + k * 16) in rank order
// into the output; false once the block failed.
template <typename T, int OP>
__device__ bool ox_ll1_line(const OxDesc& d, char* const* srcs, u32 n, u32 flag, u64 k,
                            char* out, u32 post, volatile int* block_fail) {
  constexpr int E = 8 / sizeof(T);
  OxWord<T> acc;
  acc.d = 0;
  for (u32 q0 = 0; q0 < n; q0 += OX_LL1_BATCH) {
    uint4 v[OX_LL1_BATCH];
#pragma unroll
    for (int u = 0; u < OX_LL1_BATCH; ++u)
      if (q0 + u < n) v[u] = ox_ll_load(srcs[q0 + u] + k * 16);
#pragma unroll
    for (int u = 0; u < OX_LL1_BATCH; ++u) {
      const u32 q = q0 + u;
      if (q >= n) break;
      OxWord<T> x;
      if (v[u].y == flag && v[u].w == flag) {
        x.d = (u64)v[u].x | ((u64)v[u].z << 32);
      } else if (!ox_ll_wait(d, srcs[q] + k * 16, flag, &x.d, q, 0, block_fail)) {
        return false;
      }
      if (q == 0) {
        acc.d = x.d;
      } else {
#pragma unroll
        for (int j = 0; j < E; ++j) acc.e[j] = ox_apply<T, OP>(acc.e[j], x.e[j]);
      }
    }
  }
  if (post) {
#pragma unroll
    for (int j = 0; j < E; ++j) acc.e[j] = OxNum<T>::div(acc.e[j], post);
  }
  ox_ll_st_mem<T>(out + k * 8, acc.d, ox_ll_valid(d.ll1_count, k, E));
  return true;
}

template <typename T, int OP>
__device__ void ox_ll1(const OxDesc& d) {
  constexpr int E = 8 / sizeof(T);
  // This rank's slot of each sender (sources), then the output (the one
  // destination, plain memory): the operand arrays ox_ll_reduce_copy takes.
  __shared__ char* s_src[OX_MAX_OPERANDS];
  // Every rank's slot base (the table never changes after setup).
  __shared__ char* s_base[OX_MAX_OPERANDS];
  __shared__ char* s_dst[1];
  __shared__ u8 s_pre[OX_MAX_OPERANDS];
  __shared__ u32 s_flag[OX_MAX_OPERANDS + 1];
  __shared__ u32 s_peer[OX_MAX_OPERANDS + 1];
  __shared__ int s_fail;
  const u32 tid = threadIdx.x;
  const u32 n = d.nranks;
  const T scale = (d.flags & OXD_PRE_AT) ? *reinterpret_cast<const T*>(d.scale_bits)
                                         : ox_from_bits<T>(d.scale_bits);
  const bool pre = (d.flags & OXD_PRE) != 0;
  // Written only by this rank's previous kernel (same stream).
  const u64 epoch = ox_ld_volatile(d.ll1_epoch);
  const u32 flag = ox_ll_flag(epoch);
  const u64 parity = epoch & 1;
  const u64 count = d.ll1_count;
  const u64 bytes = count * sizeof(T);
  const u64 nlines = bytes == 0 ? 1 : (bytes + 7) / 8;
  const u64 stride = d.ll1_lines * 16;
  const char* in = (const char*)(d.bufs[0] & OX_ADDR_MASK);
  char* out = (char*)(d.bufs[1] & OX_ADDR_MASK);
  char* mine = (char*)d.ll1_slots[d.rank];
  if (tid == 0) {
    s_fail = 0;  // only ever set to 1 afterwards, before a barrier
    s_dst[0] = out;
    s_flag[n] = 0;
    s_peer[n] = d.rank;
  }
  for (u32 q = tid; q < n; q += blockDim.x) {
    s_base[q] = (char*)d.ll1_slots[q];
    s_src[q] = mine + (parity * n + q) * stride;
    s_pre[q] = 0;  // the senders scaled their own lines
    s_flag[q] = flag;
    s_peer[q] = q;
  }
  __syncthreads();
  // (1) This rank's lines to every rank, the next rank first (so the
  // ranks' first stores spread over the clique).
  const u64 at = (parity * n + d.rank) * stride;
  for (u64 k = tid; k < nlines; k += blockDim.x) {
    OxWord<T> x;
    x.d = ox_ll_ld_mem<T>(in + k * 8, ox_ll_valid(count, k, E));
    if (pre) {
#pragma unroll
      for (int j = 0; j < E; ++j) x.e[j] = OxNum<T>::mul(x.e[j], scale);
    }
    for (u32 j = 1; j <= n; ++j) {
      const u32 q = (d.rank + j) % n;
      ox_ll_store(s_base[q] + at + k * 16, x.w[0], x.w[1], flag);
    }
  }
  // In place, every input line is read before any output line is written.
  __syncthreads();
  // (2) Every sender's lines, reduced in rank order. A small call gives
  // each (line, sender) a thread of its own, so all senders are polled at
  // once (ox_ll_reduce_copy's small path); a larger one has each thread
  // issue a batch of senders' loads before using the first.
  if (n > 1 && nlines * n <= blockDim.x) {
    if (!ox_ll_reduce_copy<T, OP>(d, s_src, s_pre, (int)n, s_dst, 1, s_flag, s_peer, count, scale,
                                  d.post_div, 0, &s_fail))
      atomicExch(&s_fail, 1);
  } else {
    for (u64 k = tid; k < nlines; k += blockDim.x) {
      if (!ox_ll1_line<T, OP>(d, s_src, n, flag, k, out, d.post_div, &s_fail)) {
        atomicExch(&s_fail, 1);
        break;
      }
    }
  }
  __syncthreads();
  if (s_fail) return;
  // (3) The next call's epoch (the failure left above: the clique is
  // unusable then, and its counters out of step anyway).
  if (tid == 0) *(volatile u64*)d.ll1_epoch = epoch + 1;
}
