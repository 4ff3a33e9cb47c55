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

use oxccl_bench::latency::{
    rank_latency, CALLS_PER_GRAPH, CALLS_PER_RUN, GRAPH_LAUNCHES, RUNS, WARMUP,
};
use oxccl_cuda::driver::{Ctx, DevMem, Function, Module, Stream};
use oxccl_cuda::kernels::compile_source;

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
const SRC: &str = include_str!("../../../kernels/sync_floor.cu");

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

/// One rank's (eager, graph) µs per call, through the shared harness.
fn rank_timing(f: Function, stream: &Stream, p: &Params, bar: &Barrier) -> (f64, f64) {
    let launch = || {
        // SAFETY: `Params` mirrors `SfParams` (both sides assert its size),
        // and every pointer in it belongs to the fixture, which outlives
        // this function's final stream synchronisation.
        Ok(unsafe { f.launch(1, THREADS, stream, p) }?)
    };
    let settle = || Ok(stream.synchronize()?);
    let l = rank_latency(stream, bar, &launch, &settle);
    let l = l.unwrap_or_else(|e| {
        eprintln!("sync_floor: timing: {e}");
        exit(2)
    });
    (l.eager_us, l.graph_us)
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
