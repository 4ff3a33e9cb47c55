// The device plan executor: block b of a launch walks channel b's steps.
//
// Synchronisation follows the Simple protocol (docs/ARCHITECTURE.md): a FIFO message is "data, fence,
// counter store"; the receiver acquire-polls the counter. A few threads of
// the block's first warp poll and update counters, one per semaphore or
// operand, in parallel; __syncthreads() hands the result to the rest of
// the block. Every OX_SPIN_CHECK polls a wait checks
// the host's abort flag, the world's failure word and a deadline
// (%globaltimer); a failed wait records {code, rank, peer, channel, step}
// before the block returns. Fences and counters use device scope when all
// ranks share one GPU, system scope otherwise (OXD_SYS).

__device__ __forceinline__ u64 ox_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ u64 ox_ld_acquire(const u64* p, bool sys) {
  u64 v;
  if (sys)
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void ox_st_release(u64* p, u64 v, bool sys) {
  if (sys)
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Release/acquire fence: orders this thread's (and, through a preceding
// barrier, its block's) earlier accesses before its later ones. acq_rel
// is all the protocols need; __threadfence() is fence.sc, which costs more.
__device__ __forceinline__ void ox_fence(bool sys) {
  if (sys)
    asm volatile("fence.acq_rel.sys;" ::: "memory");
  else
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// *p += v as a release: the signal of a semaphore. One instruction where
// a fence and a relaxed atomic were two.
__device__ __forceinline__ void ox_red_release_add(u64* p, u64 v, bool sys) {
  if (sys)
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ox_ld_volatile(const u64* p) {
  return *(const volatile u64*)p;
}

// Loads that bypass L1: slots and peers' buffers are written by other SMs
// (or GPUs), and L1 is not coherent.
__device__ __forceinline__ uint4 ox_ld16(const char* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void ox_st16(char* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
template <typename T>
__device__ __forceinline__ T ox_ld1(const char* p) {
  union { T t; u8 b[sizeof(T)]; u16 h; u32 w; u64 d; } u;
  if (sizeof(T) == 1) {
    u32 v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(v) : "l"(p));
    u.b[0] = (u8)v;
  } else if (sizeof(T) == 2) {
    unsigned short v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    u.h = v;
  } else if (sizeof(T) == 4) {
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(u.w) : "l"(p));
  } else {
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(u.d) : "l"(p));
  }
  return u.t;
}
template <typename T>
__device__ __forceinline__ void ox_st1(char* p, T v) {
  *(T*)p = v;
}

// Records the first failure of this rank and tells the world.
__device__ void ox_fail(const OxDesc& d, u32 code, u32 peer, u32 step, u32 awaited, u64 waited) {
  if (atomicCAS(&d.err->code, 0u, code) == 0u) {
    d.err->awaited = awaited;
    d.err->rank = d.rank;
    d.err->peer = peer;
    d.err->channel = blockIdx.x;
    d.err->step = step;
    d.err->waited_ns = waited;
  }
  __threadfence_system();
  *d.world_fail = 1;
}

// Polls after which a wait backs off (sleeps between polls): a wait that
// long is waiting for a late launch, not for a flag in flight.
#define OX_SPIN_FAST 4096
// Polls between checks of the abort and failure words (host-mapped: a
// read crosses PCIe) and the deadline.
#define OX_SPIN_CHECK 1024

// Polls *p until it reaches `want` (counters only grow: >=, never ==).
// Returns false (after recording why) on abort, on a peer's failure, or
// past the deadline.
__device__ bool ox_wait_geq(const OxDesc& d, const u64* p, u64 want, u32 peer, u32 step,
                            u32 awaited) {
  const bool sys = d.flags & OXD_SYS;
  if (ox_ld_acquire(p, sys) >= want) return true;
  const u64 t0 = ox_globaltimer();
  for (u32 spins = 1;; ++spins) {
    if (spins > OX_SPIN_FAST) asm volatile("nanosleep.u32 256;");
    if (ox_ld_acquire(p, sys) >= want) return true;
    if ((spins & (OX_SPIN_CHECK - 1)) == 0) {
      u64 waited = ox_globaltimer() - t0;
      if (*d.abort_flag != 0) {
        ox_fail(d, OXE_ABORTED, peer, step, awaited, waited);
        return false;
      }
      if (*d.world_fail != 0) {
        ox_fail(d, OXE_PEER_FAILED, peer, step, awaited, waited);
        return false;
      }
      if (waited > d.timeout_ns) {
        ox_fail(d, OXE_TIMEOUT, peer, step, awaited, waited);
        return false;
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ T ox_from_bits(u64 bits) {
  union { u64 b; T t; } u;
  u.b = bits;
  return u.t;
}

// Element type for 16-byte vectors.
template <typename T>
union OxVec {
  uint4 v;
  T e[16 / sizeof(T)];
};

template <typename T>
__device__ __forceinline__ uint4 ox_vpre(uint4 a, T s) {
  OxVec<T> x;
  x.v = a;
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); ++k) x.e[k] = OxNum<T>::mul(x.e[k], s);
  return x.v;
}
template <typename T, int OP>
__device__ __forceinline__ uint4 ox_vop(uint4 a, uint4 b) {
  OxVec<T> x, y;
  x.v = a;
  y.v = b;
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); ++k) x.e[k] = ox_apply<T, OP>(x.e[k], y.e[k]);
  return x.v;
}
template <typename T>
__device__ __forceinline__ uint4 ox_vpost(uint4 a, u32 n) {
  OxVec<T> x;
  x.v = a;
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); ++k) x.e[k] = OxNum<T>::div(x.e[k], n);
  return x.v;
}

// How n elements of sz bytes split for 16-byte vectors when every operand
// lies at offset `mis` within 16 bytes (`same`; otherwise all scalar):
// elements [0, head) scalar up to the first 16-byte boundary, nvec
// vectors up to vend, the rest scalar.
struct OxSplit {
  u64 head, nvec, vend;
};
__device__ __forceinline__ OxSplit ox_split(bool same, u32 mis, u64 n, u64 sz) {
  OxSplit r;
  r.head = n;
  if (same) r.head = mis == 0 ? 0 : ((16 - mis) / sz < n ? (16 - mis) / sz : n);
  r.nvec = (n - r.head) / (16 / sz);
  r.vend = r.head + r.nvec * (16 / sz);
  return r;
}

#define OX_UNROLL 4
// Sources whose loads a small reduction issues before using the first.
#define OX_BATCH 8

// dst[k][i] = post(op_s(pre_s(src[s][i]))) for i < n, by the whole block.
template <typename T, int OP>
__device__ void ox_reduce_copy(char* const* src, const u8* pre, int nsrc, char* const* dst, int ndst,
                               u64 n, T scale, u32 post) {
  const u64 sz = sizeof(T);
  const u32 nt = blockDim.x;
  const u32 tid = threadIdx.x;
  // Vectorise when every operand has the same offset within 16 bytes.
  u32 mis = (u32)((u64)src[0] & 15);
  bool same = (mis % sz) == 0;
  for (int s = 1; s < nsrc; ++s) same = same && (((u64)src[s] & 15) == mis);
  for (int k = 0; k < ndst; ++k) same = same && (((u64)dst[k] & 15) == mis);
  const OxSplit sp = ox_split(same, mis, n, sz);
  const u64 head = sp.head, nvec = sp.nvec, vend = sp.vend;

  // Scalar part: the unaligned head and the tail. The loads of up to
  // OX_BATCH sources are all in flight before the first is used: a tiny
  // message is one element per thread, and its time is the loads' latency.
  for (u64 j = tid; j < head + (n - vend); j += nt) {
    u64 i = j < head ? j : vend + (j - head);
    T acc;
    for (int s0 = 0; s0 < nsrc; s0 += OX_BATCH) {
      T x[OX_BATCH];
#pragma unroll
      for (int b = 0; b < OX_BATCH; ++b)
        if (s0 + b < nsrc) x[b] = ox_ld1<T>(src[s0 + b] + i * sz);
#pragma unroll
      for (int b = 0; b < OX_BATCH; ++b) {
        if (s0 + b >= nsrc) break;
        T v = x[b];
        if (pre[s0 + b]) v = OxNum<T>::mul(v, scale);
        acc = s0 + b == 0 ? v : ox_apply<T, OP>(acc, v);
      }
    }
    if (post) acc = OxNum<T>::div(acc, post);
    for (int k = 0; k < ndst; ++k) ox_st1<T>(dst[k] + i * sz, acc);
  }
  if (nvec == 0) return;

  // Vector part, small: at most one vector per thread. As above, the
  // loads of OX_BATCH sources go out together.
  const u64 hb = head * sz;
  if (nvec <= nt) {
    if (tid < nvec) {
      const u64 at = hb + (u64)tid * 16;
      uint4 acc;
      for (int s0 = 0; s0 < nsrc; s0 += OX_BATCH) {
        uint4 x[OX_BATCH];
#pragma unroll
        for (int b = 0; b < OX_BATCH; ++b)
          if (s0 + b < nsrc) x[b] = ox_ld16(src[s0 + b] + at);
#pragma unroll
        for (int b = 0; b < OX_BATCH; ++b) {
          if (s0 + b >= nsrc) break;
          uint4 v = pre[s0 + b] ? ox_vpre<T>(x[b], scale) : x[b];
          acc = s0 + b == 0 ? v : ox_vop<T, OP>(acc, v);
        }
      }
      if (post) acc = ox_vpost<T>(acc, post);
      for (int k = 0; k < ndst; ++k) ox_st16(dst[k] + at, acc);
    }
    return;
  }

  // Vector part: OX_UNROLL independent 16-byte loads per source in flight.
  for (u64 base = tid; base < nvec; base += (u64)nt * OX_UNROLL) {
    uint4 acc[OX_UNROLL];
#pragma unroll
    for (int u = 0; u < OX_UNROLL; ++u) {
      u64 v = base + (u64)u * nt;
      if (v < nvec) acc[u] = ox_ld16(src[0] + hb + v * 16);
    }
    if (pre[0]) {
#pragma unroll
      for (int u = 0; u < OX_UNROLL; ++u) acc[u] = ox_vpre<T>(acc[u], scale);
    }
    for (int s = 1; s < nsrc; ++s) {
      uint4 x[OX_UNROLL];
#pragma unroll
      for (int u = 0; u < OX_UNROLL; ++u) {
        u64 v = base + (u64)u * nt;
        if (v < nvec) x[u] = ox_ld16(src[s] + hb + v * 16);
      }
      if (pre[s]) {
#pragma unroll
        for (int u = 0; u < OX_UNROLL; ++u) x[u] = ox_vpre<T>(x[u], scale);
      }
#pragma unroll
      for (int u = 0; u < OX_UNROLL; ++u) acc[u] = ox_vop<T, OP>(acc[u], x[u]);
    }
    if (post) {
#pragma unroll
      for (int u = 0; u < OX_UNROLL; ++u) acc[u] = ox_vpost<T>(acc[u], post);
    }
    for (int k = 0; k < ndst; ++k) {
#pragma unroll
      for (int u = 0; u < OX_UNROLL; ++u) {
        u64 v = base + (u64)u * nt;
        if (v < nvec) ox_st16(dst[k] + hb + v * 16, acc[u]);
      }
    }
  }
}

// a[i] <-> b[i] for i < n, by the whole block. Each thread loads its
// elements of both ranges, then stores each into the other: a thread
// touches only its own elements, so no barrier is needed between the
// loads and the stores, and every byte is read once and written once.
template <typename T>
__device__ void ox_swap(char* a, char* b, u64 n) {
  const u64 sz = sizeof(T);
  const u32 nt = blockDim.x;
  const u32 tid = threadIdx.x;
  const u32 mis = (u32)((u64)a & 15);
  const bool same = (mis % sz) == 0 && ((u64)b & 15) == mis;
  const OxSplit sp = ox_split(same, mis, n, sz);
  const u64 head = sp.head, nvec = sp.nvec, vend = sp.vend;
  for (u64 j = tid; j < head + (n - vend); j += nt) {
    const u64 i = j < head ? j : vend + (j - head);
    const T x = ox_ld1<T>(a + i * sz);
    const T y = ox_ld1<T>(b + i * sz);
    // The loads are asm the compiler sees no memory access in: keep the
    // stores after them.
    asm volatile("" ::: "memory");
    ox_st1<T>(a + i * sz, y);
    ox_st1<T>(b + i * sz, x);
  }
  const u64 hb = head * sz;
  for (u64 base = tid; base < nvec; base += (u64)nt * OX_UNROLL) {
    uint4 x[OX_UNROLL], y[OX_UNROLL];
#pragma unroll
    for (int u = 0; u < OX_UNROLL; ++u) {
      const u64 v = base + (u64)u * nt;
      if (v < nvec) {
        x[u] = ox_ld16(a + hb + v * 16);
        y[u] = ox_ld16(b + hb + v * 16);
      }
    }
    asm volatile("" ::: "memory");
#pragma unroll
    for (int u = 0; u < OX_UNROLL; ++u) {
      const u64 v = base + (u64)u * nt;
      if (v < nvec) {
        ox_st16(a + hb + v * 16, y[u]);
        ox_st16(b + hb + v * 16, x[u]);
      }
    }
  }
}

__device__ __forceinline__ char* ox_slot(const OxDesc& d, u64 conn, u64 count) {
  return (char*)conn + OX_CONN_HEADER + (count % d.nslots) * d.slot_bytes;
}

// Relaunch mode (OXD_RESUME): records where this block stopped, step `si`,
// for the host, which launches the plan again; `peer` and `awaited` name
// what it waits for (the host's deadline names them). Words of the
// channel's progress record: step, peer, awaited.
__device__ __forceinline__ void ox_stop_at(const OxDesc& d, u32 si, u32 peer, u32 awaited) {
  volatile u32* p = d.progress + (u64)blockIdx.x * OX_PROGRESS_WORDS;
  p[1] = peer;
  p[2] = awaited;
  p[0] = si;
}

// Defined in oxccl_ll.cuh, which follows this file in every module.
__device__ __forceinline__ u32 ox_ll_flag(u64 count);
template <typename T, int OP>
__device__ bool ox_ll_reduce_copy(const OxDesc& d, char* const* src, const u8* pre, int nsrc,
                                  char* const* dst, int ndst, const u32* flags, const u32* peers,
                                  u64 n, T scale, u32 post, u32 step, volatile int* block_fail);
__device__ int ox_ll_missing(char* const* src, int nsrc, const u32* flags, u64 nlines);

template <typename T, int OP>
__device__ void ox_exec(const OxDesc& d) {
  __shared__ char* s_src[OX_MAX_OPERANDS];
  __shared__ char* s_dst[OX_MAX_OPERANDS];
  __shared__ u8 s_pre[OX_MAX_OPERANDS];
  // LL only: per operand (sources, then destinations) the slot's flag (0:
  // plain memory) and the peer, for errors.
  __shared__ u32 s_flag[2 * OX_MAX_OPERANDS];
  __shared__ u32 s_peer[2 * OX_MAX_OPERANDS];
  __shared__ int s_fail;
  // Relaunch mode: the step this launch starts at, and 1 + the operand
  // (or wait) that is not ready, once one is found (0: none).
  __shared__ u32 s_from;
  __shared__ int s_stop;
  __shared__ OxStep s_steps[OX_STAGE_STEPS];
  __shared__ OxOperand s_ops[OX_STAGE_OPS];
  const u32 tid = threadIdx.x;
  // A scalar in device memory (ncclScalarDevice) is read when the kernel
  // runs: the value the caller's stream left there, in every replay of a
  // captured graph too, with no host wait before the launch.
  const T scale = (d.flags & OXD_PRE_AT) ? *reinterpret_cast<const T*>(d.scale_bits)
                                         : ox_from_bits<T>(d.scale_bits);
  const bool sys = d.flags & OXD_SYS;
  const bool ll = d.flags & OXD_LL;
  const bool resume = d.flags & OXD_RESUME;

  // Where this block's steps are: in the parameter, so the staging loads
  // below go out at once.
  const OxChan c = d.chans[blockIdx.x];
  // Publish this rank's buffer bases for peers' remote steps, from every
  // block of every launch, before the block's first step. A peer reads the
  // bases only after hearing from this rank's same channel in this call (a
  // signal, or a message, in release order after these stores and the
  // barrier below): the checker's rule that remote accesses follow the
  // owner's entry. So the signal itself says the bases are current, with
  // no launch tag and no second all-pairs exchange. They stay current until
  // the peer is done: this rank's next launch (the next bases) follows the
  // end of this one, which follows every peer's signal after its last
  // remote access. Every launch publishes, whatever its own steps: in a
  // rooted plan the root may have no remote step while its peers read its
  // buffers (a flag set only by plans with remote steps left the root's
  // bases stale, and peers read through them). Every block of a call
  // writes the same values.
  if (tid == 0) {
    s_fail = 0;  // only ever set to 1 afterwards, with atomicExch, before a barrier
    s_stop = 0;  // likewise (to 1 + an index)
    s_from = resume ? d.progress[(u64)blockIdx.x * OX_PROGRESS_WORDS] : 0;
  }
  if (tid < d.nbufs) *(volatile u64*)&d.ptr_table[d.rank * OX_MAX_BUFS + tid] = d.bufs[tid];
  // The channel's records, into shared memory when they fit: every load
  // in flight at once, so later steps find their records without a
  // round trip to memory (a small call is a chain of such round trips).
  const bool staged = c.nsteps <= OX_STAGE_STEPS && c.nops <= OX_STAGE_OPS;
  if (staged) {
    for (u32 i = tid; i < c.nsteps; i += blockDim.x) s_steps[i] = d.steps[c.first + i];
    for (u32 i = tid; i < c.nops; i += blockDim.x) s_ops[i] = d.ops[c.op_first + i];
  }
  // Indexed by the step's number in the channel and the operand's number
  // from the channel's first operand.
  const OxStep* steps = staged ? s_steps : d.steps + c.first;
  const OxOperand* ops = staged ? s_ops : d.ops + c.op_first;
  __syncthreads();

  for (u32 si = s_from; si < c.nsteps; ++si) {
    const OxStep st = steps[si];
    const u32 step = si;
    // Step trace (d.trace set only when asked for): thread 0 stamps the
    // step's (or the signal/wait run's) start here and its end below.
    const u32 s0 = si;
    u64 t0 = 0;
    if (d.trace != 0 && tid == 0) t0 = ox_globaltimer();
    if (st.op == OXS_SIGNAL || st.op == OXS_WAIT) {
      // A run of consecutive signals (or waits) goes in parallel: thread i
      // handles the i-th, so an all-pairs barrier costs one round trip.
      // The host encoded the run's length (and each wait's count of
      // earlier waits on its semaphore), so nothing scans the step list.
      // A signal run followed by a wait run (a barrier) runs as one phase:
      // the waiters, in the next warp(s), load their semaphores and start
      // polling while the signals go out. Waiting early changes nothing:
      // the signals still follow every earlier step (the barrier below),
      // and every later step still follows every wait.
      const u32 end = c.nsteps;
      u32 nsig = 0, nwait = 0, wbase = 0;
      if (st.op == OXS_SIGNAL) {
        nsig = st.nsrc > 0 ? st.nsrc : 1;
        wbase = (nsig + 31) & ~31u;
        if (si + nsig < end) {
          const OxStep nx = steps[si + nsig];
          if (nx.op == OXS_WAIT && wbase + (nx.nsrc > 0 ? nx.nsrc : 1) <= blockDim.x)
            nwait = nx.nsrc > 0 ? nx.nsrc : 1;
        }
        __syncthreads();
      } else {
        nwait = st.nsrc > 0 ? st.nsrc : 1;
      }
      OxSem* wsem = 0;
      u64 want = 0;
      if (tid < nsig) {
        OxSem* sem = (OxSem*)steps[si + tid].len;
        ox_red_release_add(&sem->posted, 1ull, sys);
      } else if (tid >= wbase && tid < wbase + nwait) {
        const u32 k = nsig + (tid - wbase);
        const OxStep wt = steps[si + k];
        wsem = (OxSem*)wt.len;
        // Earlier waits of this run on the same semaphore come first.
        want = ox_ld_volatile(&wsem->consumed) + 1 + wt.ndst;
        if (resume) {
          // Consumed below, once every wait of the run is ready: a
          // relaunch redoes the whole run.
          if (ox_ld_acquire(&wsem->posted, sys) < want) atomicExch(&s_stop, 1 + (int)k);
        } else if (ox_wait_geq(d, &wsem->posted, want, wt.first, step + k, OXA_SIGNAL)) {
          atomicMax(&wsem->consumed, want);
        } else {
          atomicExch(&s_fail, 1);
        }
      }
      if (nwait > 0) {
        __syncthreads();
        if (s_fail) return;
        if (resume) {
          if (s_stop) {
            // The signals went out; the waits start the next launch.
            if (tid == 0) ox_stop_at(d, si + nsig, steps[si + s_stop - 1].first, OXA_SIGNAL);
            return;
          }
          if (wsem != 0) atomicMax(&wsem->consumed, want);
          __syncthreads();
        }
      }
      si += nsig + nwait - 1;
    } else {
      const int nsrc = st.nsrc, ndst = st.ndst;
      // Thread i resolves operand i, all in parallel (one dependent load
      // chain each instead of thread 0 walking them in turn), and later
      // bumps its connection's counter. A FIFO operand waits for its
      // message or free slot; under LL the receiver waits on the lines'
      // flags instead of the tail, and the sender still waits for a slot.
      OxConn* cn = 0;
      if (tid < (u32)(nsrc + ndst)) {
        const int i = tid;
        const OxOperand o = ops[st.first - c.op_first + i];
        bool ok = true;
        char* p = 0;
        s_flag[i] = 0;
        s_peer[i] = o.kind == OXK_LOCAL ? d.rank : o.kind == OXK_REMOTE ? o.idx : o.buf;
        if (o.kind == OXK_LOCAL) {
          p = (char*)(d.bufs[o.buf] & OX_ADDR_MASK) + o.off * sizeof(T);
        } else if (o.kind == OXK_REMOTE) {
          const u64 v = ox_ld_volatile(&d.ptr_table[o.idx * OX_MAX_BUFS + o.buf]);
          i64 delta = 0;
          if (d.heap_delta) {
            // Across processes the peer published its own address, tagged
            // with the allocation it lies in (0: its heap, loaded with the
            // address so the common case costs no extra round trip); that
            // allocation lies elsewhere in this process.
            const i64* row = d.heap_delta + (u64)o.idx * OX_MAPS;
            delta = row[0];
            const u32 tag = (u32)(v >> OX_TAG_SHIFT);
            if (tag != 0) delta = row[tag];
            if (delta == OX_UNMAPPED) {
              ox_fail(d, OXE_UNMAPPED, o.idx, step, 0, 0);
              ok = false;
            }
          }
          p = ok ? (char*)((v & OX_ADDR_MASK) + delta) + o.off * sizeof(T) : 0;
        } else {
          cn = (OxConn*)o.off;
          // A side's own counter and the other side's are loaded together
          // (one round trip, not two); the wait below only polls when the
          // other side's was not yet far enough.
          if (i < nsrc) {
            const u64 head = ox_ld_volatile(&cn->head);
            if (!ll) {
              const u64 tail = ox_ld_acquire(&cn->tail, sys);
              if (tail < head + 1) {
                if (resume)
                  atomicExch(&s_stop, 1 + i);
                else
                  ok = ox_wait_geq(d, &cn->tail, head + 1, o.buf, step, OXA_MESSAGE);
              }
            }
            p = ox_slot(d, (u64)cn, head);
            if (ll) s_flag[i] = ox_ll_flag(head);
          } else {
            const u64 tail = ox_ld_volatile(&cn->tail);
            const u64 head = ox_ld_acquire(&cn->head, sys);
            if (tail + 1 > d.nslots && head < tail + 1 - d.nslots) {
              if (resume)
                atomicExch(&s_stop, 1 + i);
              else
                ok = ox_wait_geq(d, &cn->head, tail + 1 - d.nslots, o.buf, step, OXA_SLOT);
            }
            p = ox_slot(d, (u64)cn, tail);
            if (ll) s_flag[i] = ox_ll_flag(tail);
          }
        }
        if (i < nsrc) {
          s_src[i] = p;
          s_pre[i] = (o.flags & OXF_PRE) && (d.flags & OXD_PRE);
        } else {
          s_dst[i - nsrc] = p;
        }
        if (!ok) atomicExch(&s_fail, 1);
      }
      // The step moves LL lines when it has a FIFO operand under LL.
      const bool ll_step = __syncthreads_or(cn != 0) && ll;
      if (s_fail) return;
      if (resume) {
        // Nothing of the step has happened yet: stop before it when an
        // operand is not ready, or (LL) a line of a source has not arrived.
        int stop = s_stop;
        u32 awaited = stop > 0 && stop - 1 < nsrc ? OXA_MESSAGE : OXA_SLOT;
        if (stop == 0 && ll_step) {
          const u64 bytes = st.len * sizeof(T);
          const int missing = ox_ll_missing(s_src, nsrc, s_flag, bytes == 0 ? 1 : (bytes + 7) / 8);
          if (missing > 0) {
            stop = missing;
            awaited = OXA_MESSAGE;
          }
        }
        if (stop > 0) {
          if (tid == 0) ox_stop_at(d, si, s_peer[stop - 1], awaited);
          return;
        }
      }
      const u32 post = (st.flags & OXF_POST) ? d.post_div : 0;
      if (st.op == OXS_SWAP) {
        ox_swap<T>(s_src[0], s_src[1], st.len);
      } else if (ll_step) {
        if (!ox_ll_reduce_copy<T, OP>(d, s_src, s_pre, nsrc, s_dst, ndst, s_flag, s_peer, st.len,
                                      scale, post, step, &s_fail))
          atomicExch(&s_fail, 1);
      } else {
        ox_reduce_copy<T, OP>(s_src, s_pre, nsrc, s_dst, ndst, st.len, scale, post);
      }
      __syncthreads();
      if (s_fail) return;
      if (cn != 0) {
        const bool is_src = tid < (u32)nsrc;
        if (ll_step) {
          // LL: the data carries its own flags, so no fence. The head
          // store is a release after the barrier: the block's reads of
          // the slot are done before the sender may overwrite it. Only
          // the sender reads the tail.
          if (is_src) {
            ox_st_release(&cn->head, ox_ld_volatile(&cn->head) + 1, sys);
          } else {
            *(volatile u64*)&cn->tail = ox_ld_volatile(&cn->tail) + 1;
          }
        } else {
          // Simple: the block's data (ordered before this thread by the
          // barrier), fence, then the counter.
          ox_fence(sys);
          if (is_src) {
            ox_st_release(&cn->head, ox_ld_volatile(&cn->head) + 1, sys);
          } else {
            ox_st_release(&cn->tail, ox_ld_volatile(&cn->tail) + 1, sys);
          }
        }
      }
    }
    if (d.trace != 0 && tid == 0) {
      const u64 t1 = ox_globaltimer();
      for (u32 k = s0; k <= si; ++k) {
        d.trace[2 * (c.first + k)] = t0;
        d.trace[2 * (c.first + k) + 1] = t1;
      }
    }
  }
  if (resume && tid == 0) ox_stop_at(d, c.nsteps, d.rank, 0);
}
