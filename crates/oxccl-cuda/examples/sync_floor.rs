//! The hardware floor of small-message synchronisation between N ranks on
//! one GPU, measured with minimal hand-written kernels instead of oxccl's
//! executor: how far the executor's 8-byte AllReduce is from what the
//! hardware allows.
//!
//! `sync_floor [RANKS[,RANKS...]]`, default `2,4,8`. All ranks share device
//! 0 (one context, one non-blocking stream and one host thread per rank);
//! every kernel is one block of 32 threads per rank, lane t talking to rank
//! t. The kernels:
//! - `empty`: nothing; the launch floor with N threads launching at once.
//! - `flag`: an ideal one-shot 8-byte f32 AllReduce: every rank writes its
//!   2 floats with flags into every peer's inbox (one 16-byte LL-style
//!   line), waits for every peer's line and sums in rank order.
//! - `flag_sys`: `flag` plus one `__threadfence()` (`fence.sc.gpu`) before
//!   the output and counter stores: what one device-wide fence on the
//!   critical path adds.
//! - `barrier`: an all-pairs barrier on growing semaphores
//!   (`red.release` to every peer, `ld.acquire` polls of its own).
//!
//! The timing copies `latency`'s harness exactly: 50 warm-up calls, then 15
//! runs of 200 eager calls timed with events, then a graph of 100 captured
//! calls launched 4 times per run for 15 runs; per call the median over
//! runs, of the slowest rank. Every wait gives up after 2 s (recorded in a
//! device word the host reads), so a lost rank is reported, not hung on.
//! After the runs, `flag`'s outputs and every kernel's counters are checked.

use std::process::exit;
use std::sync::{Arc, Barrier};

use oxccl_cuda::driver::{Ctx, DevMem, Event, Function, Graph, Module, Stream};
use oxccl_cuda::kernels::compile_source;

const CALLS_PER_RUN: u32 = 200;
const CALLS_PER_GRAPH: u32 = 100;
const GRAPH_LAUNCHES: u32 = 4;
const RUNS: usize = 15;
const WARMUP: u32 = 50;
/// Calls every rank makes per kernel: warm-up, eager runs, the graph's
/// first (untimed) launch and its timed launches. Counters must end here.
const CALLS_TOTAL: u64 = WARMUP as u64
    + RUNS as u64 * CALLS_PER_RUN as u64
    + CALLS_PER_GRAPH as u64
    + RUNS as u64 * (GRAPH_LAUNCHES * CALLS_PER_GRAPH) as u64;

/// One warp per rank: lane t serves peer t, so ranks are capped at 32.
const THREADS: u32 = 32;
const MAX_RANKS: usize = 32;
/// Inbox: 2 parities × MAX_RANKS senders × one 16-byte line. The barrier's
/// MAX_RANKS u64 semaphores use the start of the same allocation.
const MAILBOX_BYTES: usize = 2 * MAX_RANKS * 16;
/// Mirrors `SF_TIMED_OUT` | rank << 8 | peer in the source below.
const TIMED_OUT: u32 = 0x8000_0000;
const DEADLINE_S: u32 = 2;

const USAGE: &str =
    "usage: sync_floor [RANKS[,RANKS...]] (default 2,4,8; 1 to 32 ranks, all on device 0)";

/// The kernels, compiled once with NVRTC for the device's architecture.
const SRC: &str = r#"
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
"#;

/// Mirrors `SfParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Params {
    counter: u64,
    mine: u64,
    peers: [u64; MAX_RANKS],
    input: u64,
    output: u64,
    err: u64,
    rank: u32,
    nranks: u32,
}
const _: () = assert!(std::mem::size_of::<Params>() == 304);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Empty,
    Flag,
    FlagSys,
    Barrier,
}

impl Kernel {
    const ALL: [Kernel; 4] = [
        Kernel::Empty,
        Kernel::Flag,
        Kernel::FlagSys,
        Kernel::Barrier,
    ];

    fn name(self) -> &'static str {
        match self {
            Kernel::Empty => "empty",
            Kernel::Flag => "flag",
            Kernel::FlagSys => "flag_sys",
            Kernel::Barrier => "barrier",
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Kernel::Empty => "sync_floor_empty",
            Kernel::Flag => "sync_floor_flag",
            Kernel::FlagSys => "sync_floor_flag_sys",
            Kernel::Barrier => "sync_floor_barrier",
        }
    }
}

/// A CUDA error ends the process: a rank thread that stopped would leave
/// the others waiting at the host barrier for ever.
fn or_exit<T>(r: oxccl_cuda::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("sync_floor: {what}: {e}");
        exit(2)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rank r's 2 floats: r+1 and 10(r+1), so every sum is exact in f32.
fn input_of(r: u32) -> [f32; 2] {
    let x = (r + 1) as f32;
    [x, 10.0 * x]
}

/// One rank's device memory for one kernel's runs, zeroed.
#[derive(Debug)]
struct RankMem {
    counter: DevMem,
    mailbox: DevMem,
    input: DevMem,
    output: DevMem,
}

impl RankMem {
    fn new(ctx: &Arc<Ctx>, r: u32) -> RankMem {
        let m = RankMem {
            counter: or_exit(DevMem::zeroed(ctx, 8), "alloc counter"),
            mailbox: or_exit(DevMem::zeroed(ctx, MAILBOX_BYTES), "alloc mailbox"),
            input: or_exit(DevMem::zeroed(ctx, 8), "alloc input"),
            output: or_exit(DevMem::zeroed(ctx, 8), "alloc output"),
        };
        let bytes: Vec<u8> = input_of(r).iter().flat_map(|f| f.to_le_bytes()).collect();
        or_exit(m.input.upload(&bytes), "upload input");
        m
    }
}

/// Fresh state for one kernel on N ranks: no counter, inbox or error word
/// carries over from another kernel's runs.
#[derive(Debug)]
struct Fixture {
    ranks: Vec<RankMem>,
    err: DevMem,
}

impl Fixture {
    fn new(ctx: &Arc<Ctx>, n: u32) -> Fixture {
        Fixture {
            ranks: (0..n).map(|r| RankMem::new(ctx, r)).collect(),
            err: or_exit(DevMem::zeroed(ctx, 8), "alloc error word"),
        }
    }

    fn params(&self, r: u32) -> Params {
        let mut peers = [0u64; MAX_RANKS];
        for (p, m) in peers.iter_mut().zip(&self.ranks) {
            *p = m.mailbox.ptr;
        }
        let m = &self.ranks[r as usize];
        Params {
            counter: m.counter.ptr,
            mine: m.mailbox.ptr,
            peers,
            input: m.input.ptr,
            output: m.output.ptr,
            err: self.err.ptr,
            rank: r,
            nranks: self.ranks.len() as u32,
        }
    }
}

/// Reads `len` bytes of device memory through `stream` (after its work).
fn read(stream: &Stream, ptr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    // SAFETY: every caller passes a range inside one live DevMem of the
    // fixture, which outlives this synchronous copy.
    or_exit(unsafe { stream.read_sync(ptr, &mut buf) }, "read back");
    buf
}

fn read_u64s(stream: &Stream, ptr: u64, count: usize) -> Vec<u64> {
    read(stream, ptr, count * 8)
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect()
}

/// µs per call from two events around `calls` calls.
fn us_per_call(e0: &Event, e1: &Event, calls: u32) -> f64 {
    let ms = or_exit(e1.elapsed_since(e0), "event time");
    f64::from(ms) * 1e3 / f64::from(calls)
}

/// One rank's (eager, graph) µs per call, each the median over runs.
fn rank_timing(f: Function, stream: &Stream, p: &Params, bar: &Barrier) -> (f64, f64) {
    let launch = || {
        // SAFETY: `Params` mirrors `SfParams` (both sides assert its size),
        // and every pointer in it belongs to the fixture, which outlives
        // this function's final stream synchronisation.
        unsafe { f.launch(1, THREADS, stream, p) }
    };
    let e0 = or_exit(Event::new(stream.ctx()), "event");
    let e1 = or_exit(Event::new(stream.ctx()), "event");
    for _ in 0..WARMUP {
        or_exit(launch(), "launch");
    }
    or_exit(stream.synchronize(), "warm-up");
    let mut eager = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        bar.wait();
        or_exit(e0.record(stream), "record");
        for _ in 0..CALLS_PER_RUN {
            or_exit(launch(), "launch");
        }
        or_exit(e1.record(stream), "record");
        eager.push(us_per_call(&e0, &e1, CALLS_PER_RUN));
    }
    let g = Graph::capture(stream, || {
        for _ in 0..CALLS_PER_GRAPH {
            launch()?;
        }
        Ok(())
    });
    let g = or_exit(g, "graph capture");
    or_exit(g.launch(stream), "graph launch");
    or_exit(stream.synchronize(), "first graph launch");
    let mut graph = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        bar.wait();
        or_exit(e0.record(stream), "record");
        for _ in 0..GRAPH_LAUNCHES {
            or_exit(g.launch(stream), "graph launch");
        }
        or_exit(e1.record(stream), "record");
        graph.push(us_per_call(&e0, &e1, GRAPH_LAUNCHES * CALLS_PER_GRAPH));
    }
    or_exit(stream.synchronize(), "final synchronize");
    (median(eager), median(graph))
}

/// (eager, graph) µs per call of the slowest rank, every rank on its own
/// host thread and stream, as in `latency`.
fn measure(f: Function, streams: &[Stream], fx: &Fixture) -> (f64, f64) {
    let bar = Barrier::new(streams.len());
    let res: Vec<(f64, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = streams
            .iter()
            .zip(0u32..)
            .map(|(stream, r)| {
                let (p, bar) = (fx.params(r), &bar);
                s.spawn(move || rank_timing(f, stream, &p, bar))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let eager = res.iter().map(|r| r.0).fold(0.0, f64::max);
    let graph = res.iter().map(|r| r.1).fold(0.0, f64::max);
    (eager, graph)
}

/// The first timeout any rank recorded, in words.
fn timeout(streams: &[Stream], fx: &Fixture) -> Option<String> {
    let b = read(&streams[0], fx.err.ptr, 4);
    let code = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    (code != 0).then(|| {
        if code & TIMED_OUT != 0 {
            format!(
                "rank {} waited {DEADLINE_S} s for rank {}",
                (code >> 8) & 0xff,
                code & 0xff
            )
        } else {
            format!("error word {code:#x}")
        }
    })
}

/// Every rank's call counter, and what else `k` left behind: `flag`'s
/// outputs equal the sum of all inputs; the barrier's semaphores count
/// every call of every peer.
fn verify(k: Kernel, streams: &[Stream], fx: &Fixture) -> Result<(), String> {
    if k == Kernel::Empty {
        return Ok(());
    }
    let n = fx.ranks.len();
    let want: [f32; 2] = (0..n as u32)
        .map(input_of)
        .fold([0.0; 2], |a, x| [a[0] + x[0], a[1] + x[1]]);
    let mut bad = Vec::new();
    for (r, (m, s)) in fx.ranks.iter().zip(streams).enumerate() {
        let calls = read_u64s(s, m.counter.ptr, 1)[0];
        if calls != CALLS_TOTAL {
            bad.push(format!("rank {r} counted {calls} calls, not {CALLS_TOTAL}"));
        }
        if k == Kernel::Barrier {
            let sems = read_u64s(s, m.mailbox.ptr, n);
            for (q, &v) in sems.iter().enumerate() {
                if q != r && v != CALLS_TOTAL {
                    bad.push(format!(
                        "rank {r}'s semaphore for rank {q} is {v}, not {CALLS_TOTAL}"
                    ));
                }
            }
        } else {
            let b = read(s, m.output.ptr, 8);
            let got = [
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                f32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            ];
            if got != want {
                bad.push(format!("rank {r} got {got:?}, want {want:?}"));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

/// Times and checks one kernel on `streams.len()` ranks; false on a
/// timeout or a wrong result.
fn run_kernel(ctx: &Arc<Ctx>, module: &Module, k: Kernel, streams: &[Stream]) -> bool {
    let n = streams.len();
    let f = or_exit(module.function(k.symbol()), k.symbol());
    let fx = Fixture::new(ctx, n as u32);
    let (eager, graph) = measure(f, streams, &fx);
    if let Some(why) = timeout(streams, &fx) {
        println!("sync_floor: {}, {n} ranks: timed out ({why})", k.name());
        return false;
    }
    println!(
        "sync_floor: {}, {n} ranks: eager {eager:.2} us/call, graph {graph:.2} us/call \
         (median over {RUNS} runs, slowest rank)",
        k.name()
    );
    match verify(k, streams, &fx) {
        Ok(()) => {
            match k {
                Kernel::Empty => {}
                Kernel::Barrier => println!("sync_floor: barrier counts ok"),
                Kernel::Flag | Kernel::FlagSys => println!("sync_floor: {} result ok", k.name()),
            }
            true
        }
        Err(why) => {
            println!("sync_floor: {}, {n} ranks: WRONG: {why}", k.name());
            false
        }
    }
}

fn parse_ranks() -> Vec<u32> {
    let Some(arg) = std::env::args().nth(1) else {
        return vec![2, 4, 8];
    };
    if arg == "-h" || arg == "--help" {
        println!("{USAGE}");
        exit(0);
    }
    let ranks: Option<Vec<u32>> = arg
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .ok()
                .filter(|n| (1..=MAX_RANKS as u32).contains(n))
        })
        .collect();
    ranks.unwrap_or_else(|| {
        eprintln!("{USAGE}");
        exit(2)
    })
}

fn main() {
    let ranks = parse_ranks();
    // Skips without a driver; fails under OXCCL_REQUIRE_GPU=1 or on any other error.
    let Some(info) = oxccl_cuda::device_or_skip("sync_floor") else {
        return;
    };
    let dev = &info.devices[0];
    // Ctx::new goes through driver::init, which widens the hardware queues
    // so no two rank streams share one (ranks spin on each other).
    let ctx = or_exit(Ctx::new(dev.ordinal), "context");
    let cubin = or_exit(compile_source(SRC, "sync_floor", dev.arch), "compile");
    let module = or_exit(Module::load(&ctx, &cubin), "load module");
    println!(
        "sync_floor: {} (sm_{}), 1 block of {THREADS} threads per rank, all ranks on device {}",
        dev.name, dev.arch, dev.ordinal
    );
    let mut ok = true;
    for n in ranks {
        let streams: Vec<Stream> = (0..n)
            .map(|_| or_exit(Stream::new(&ctx), "stream"))
            .collect();
        for k in Kernel::ALL {
            ok &= run_kernel(&ctx, &module, k, &streams);
        }
    }
    if !ok {
        exit(1);
    }
}
