// The sync-floor experiment's kernels (crates/oxccl-bench/examples/
// sync_floor.rs, which describes them): minimal hand-written flag
// exchanges and barriers between ranks on one GPU, compiled with NVRTC on
// their own, to measure what the hardware allows next to oxccl's executor.
// SfParams is mirrored by `Params` there (both sides check its size).

typedef unsigned int u32;
typedef unsigned long long u64;

#define SF_MAX_RANKS 32
#define SF_DEADLINE_NS 2000000000ull
#define SF_TIMED_OUT 0x80000000u
// Polls between looks at the clock and at the shared error word: the
// common case (the peer is already there or arrives within a few polls)
// pays for neither.
#define SF_SPIN_CHECK 1024u

// Mirrors `Params` in sync_floor.rs; both sides assert the size. Passed by
// value as a __grid_constant__, so indexing peers[] by lane reads the
// parameter bank instead of making a local copy.
struct SfParams {
  u64 counter;              // u64*: calls this rank has finished (private)
  u64 mine;                 // this rank's mailbox (inbox lines or semaphores)
  u64 peers[SF_MAX_RANKS];  // every rank's mailbox, by rank
  u64 input;                // const float[2]
  u64 output;               // float[2]
  u64 err;                  // u32*, shared by all ranks: the first timeout
  u32 rank;
  u32 nranks;
};
static_assert(sizeof(SfParams) == 304, "SfParams must mirror Params");

__device__ __forceinline__ u64 sf_now() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One 16-byte store: each {data, flag} half lands at once, so the reader
// needs no fence, only both flags.
__device__ __forceinline__ void sf_st_line(u64 p, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

__device__ __forceinline__ uint4 sf_ld_line(u64 p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void sf_red_release_add(u64 p) {
  asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(p) : "memory");
}

__device__ __forceinline__ u64 sf_ld_acquire(u64 p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// A wait's give-up state. `failed` is the error word as the kernel found
// it at entry (loaded beside the counter, so it costs no latency of its
// own): once any rank timed out, every later wait returns at once, and a
// lost rank costs one deadline, not one per remaining call.
struct SfWait {
  u64 t0;
  u32 spins;
  bool failed;
};

__device__ __forceinline__ SfWait sf_wait_start(const SfParams& p) {
  SfWait w;
  w.t0 = 0;
  w.spins = 0;
  w.failed = *(volatile const u32*)p.err != 0u;
  return w;
}

// Called after each failed poll; true when the wait should stop: another
// rank already failed, or this wait passed the deadline (then the first
// such {rank, peer} is recorded for the host).
__device__ __forceinline__ bool sf_give_up(const SfParams& p, u32 peer, SfWait& w) {
  if (w.failed) return true;
  if (++w.spins % SF_SPIN_CHECK != 1u) return false;
  const u64 now = sf_now();
  if (w.spins == 1u) {
    w.t0 = now;
    return false;
  }
  if (*(volatile const u32*)p.err != 0u) return true;
  if (now - w.t0 < SF_DEADLINE_NS) return false;
  atomicCAS((u32*)p.err, 0u, SF_TIMED_OUT | (p.rank << 8) | peer);
  return true;
}

// The launch floor: what N ranks pay before any synchronisation.
extern "C" __global__ void sync_floor_empty(const __grid_constant__ SfParams p) { (void)p; }

// The minimal one-shot exchange: an ideal 8-byte f32 AllReduce. Lane t
// stores this rank's 2 floats as one flagged line into peer t's inbox and
// polls its own inbox for peer t's line; no counter is shared between
// ranks, so one store and one poll per peer is the whole protocol.
//
// The flag is the call's sequence number (this rank's private call count
// + 1; zeroed memory never passes, and it repeats only 2^32 calls later),
// and lines alternate between two parities. Two suffice: a sender can be
// at call k+2 only after finishing call k+1, which needs every peer's
// call-k+1 line, which each peer writes only after finishing call k
// (kernels on one stream run in order); so the slot of call k is never
// overwritten while it is read.
//
// The sum runs in rank order 0..N-1 on lane 0, so every rank gets the same
// bits. FENCE adds one __threadfence() (fence.sc.gpu, the strongest
// device-scope fence) before the output and counter stores, to show what a
// fence on the critical path costs.
template <bool FENCE>
__device__ __forceinline__ void sf_flag(const SfParams& p) {
  __shared__ float part[SF_MAX_RANKS][2];
  const u32 t = threadIdx.x;
  const u64 c = *(const u64*)p.counter;
  SfWait w = sf_wait_start(p);
  const u32 seq = (u32)(c + 1);
  const u64 slot = (u64)(seq & 1u) * SF_MAX_RANKS;
  if (t < p.nranks) {
    float2 v = *(const float2*)p.input;
    if (t != p.rank) {
      sf_st_line(p.peers[t] + (slot + p.rank) * 16, __float_as_uint(v.x), seq,
                 __float_as_uint(v.y), seq);
      const u64 line = p.mine + (slot + t) * 16;
      uint4 l = sf_ld_line(line);
      while ((l.y != seq || l.w != seq) && !sf_give_up(p, t, w)) l = sf_ld_line(line);
      v = make_float2(__uint_as_float(l.x), __uint_as_float(l.z));
    }
    part[t][0] = v.x;
    part[t][1] = v.y;
  }
  __syncthreads();
  if (t == 0) {
    float s0 = 0.0f, s1 = 0.0f;
    for (u32 r = 0; r < p.nranks; ++r) {
      s0 += part[r][0];
      s1 += part[r][1];
    }
    *(float2*)p.output = make_float2(s0, s1);
    if (FENCE) __threadfence();
    *(u64*)p.counter = c + 1;
  }
}

extern "C" __global__ void sync_floor_flag(const __grid_constant__ SfParams p) {
  sf_flag<false>(p);
}

extern "C" __global__ void sync_floor_flag_sys(const __grid_constant__ SfParams p) {
  sf_flag<true>(p);
}

// The minimal all-pairs barrier, as the executor's Signal/Wait steps do it:
// lane t adds 1 to peer t's semaphore for this rank (release) and polls
// this rank's semaphore for peer t (acquire) until it reaches the call
// count. Semaphores only grow, so graph replays need no reset.
extern "C" __global__ void sync_floor_barrier(const __grid_constant__ SfParams p) {
  const u32 t = threadIdx.x;
  const u64 c = *(const u64*)p.counter;
  SfWait w = sf_wait_start(p);
  if (t < p.nranks && t != p.rank) {
    sf_red_release_add(p.peers[t] + (u64)p.rank * 8);
    const u64 sem = p.mine + (u64)t * 8;
    while (sf_ld_acquire(sem) < c + 1 && !sf_give_up(p, t, w)) {
    }
  }
  __syncthreads();
  if (t == 0) *(u64*)p.counter = c + 1;
}
