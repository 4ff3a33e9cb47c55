//! What the HBM allows a write-heavy data mover: one buffer read once and
//! written into several (a pushed Broadcast or AllGather: 1 read, N
//! writes per byte), in the access patterns an executor could use, next
//! to a plain copy and a plain fill measured in the same run. It tells
//! whether the executor's 89% of the copy-rate floor for those
//! collectives is the memory's limit for this traffic or the kernel's.
//!
//! `fanout_floor [MIB] [NDST]`, default 256 MiB into 8 destinations, all
//! on device 0. Patterns (the kernels are in `kernels/fanout_floor.cu`):
//! - `copy`: one buffer into one, the ceiling the sweep's floor uses.
//! - `fill`: a constant into every destination (writes only).
//! - `slice4`, `slice8`, `slice4_cs`: each block owns one contiguous
//!   slice (the executor's layout), loads 4 or 8 vectors per thread, then
//!   stores them into every destination in turn (`_cs`: streaming stores).
//! - `grid4`, `grid4_cs`: grid-stride, so all blocks write one window of
//!   each destination at a time, as a fill does.
//! - `perdst`: one destination per block, the slice read once per
//!   destination (L2 serves the repeats, or not).
//! - `ranks8`: a pattern launched as 8 ranks would: 8 streams, each 16
//!   blocks (the executor's channels for 8 ranks on 132 SMs; also 8 and
//!   12) over its eighth of the range.
//!
//! The single-launch patterns run at 128 blocks (8 ranks × 16) and at 2
//! per SM, `slice4` also at 64, 96 and one per SM: how the block count
//! moves the rate says what channel count the executor should take.
//!
//! Each pattern: 2 warm-up runs, then the median of 10, timed with events
//! on the streams. Ratio = the time the copy's rate allows for the bytes
//! moved over the time measured (the sweep's floor ratio). After each
//! pattern every destination is sampled at its start, middle and end
//! against the source's known values (zeroed before), so a pattern that
//! skips work fails instead of looking fast.

use std::process::exit;
use std::sync::Arc;

use oxccl_cuda::driver::{Ctx, DevMem, Event, Function, Module, Stream};
use oxccl_cuda::kernels::compile_source;

const SRC: &str = include_str!("../../../kernels/fanout_floor.cu");
const MAX_DST: usize = 8;
const THREADS: u32 = 512;
const WARMUP: usize = 2;
const RUNS: usize = 10;
/// Vectors (16 bytes) compared at each sampled place.
const SAMPLE: usize = 256;
const SEED: u32 = 0x5eed;
const USAGE: &str = "usage: fanout_floor [MIB] [NDST] (default 256 8; NDST 1 to 8)";

/// Mirrors `FoParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Params {
    src: u64,
    dst: [u64; MAX_DST],
    begin: u64,
    end: u64,
    ndst: u32,
    seed: u32,
}
const _: () = assert!(std::mem::size_of::<Params>() == 96);

/// How a pattern is launched: one grid over the whole range, or one
/// launch of `blocks` per rank stream over its share.
#[derive(Clone, Copy, Debug)]
enum Layout {
    One { blocks: u32 },
    Ranks { ranks: u32, blocks: u32 },
}

struct Pattern {
    name: &'static str,
    symbol: &'static str,
    layout: Layout,
    /// Writes into every destination (else only the first, `copy`).
    all_dst: bool,
    /// Reads the source (else `fill`).
    reads: bool,
}

fn or_exit<T>(r: oxccl_cuda::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("fanout_floor: {what}: {e}");
        exit(2)
    })
}

fn parse() -> (usize, usize) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        exit(0);
    }
    let num = |i: usize, d: usize| args.get(i).map_or(Some(d), |a| a.parse::<usize>().ok());
    match (num(0, 256), num(1, 8)) {
        (Some(m), Some(k)) if m >= 1 && (1..=MAX_DST).contains(&k) => (m, k),
        _ => {
            eprintln!("{USAGE}");
            exit(2)
        }
    }
}

/// The value `fo_value` gives vector `i` (the source's content).
fn value(i: u64) -> [u32; 4] {
    let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(SEED);
    [x, x ^ 0x9e37_79b9, x.wrapping_add(1), (i >> 32) as u32]
}

struct Bench {
    module: Module,
    streams: Vec<Stream>,
    src: DevMem,
    dst: Vec<DevMem>,
    nvec: u64,
}

impl Bench {
    fn params(&self, ndst: usize, begin: u64, end: u64) -> Params {
        let mut dst = [0u64; MAX_DST];
        for (d, m) in dst.iter_mut().zip(&self.dst) {
            *d = m.ptr;
        }
        Params {
            src: self.src.ptr,
            dst,
            begin,
            end,
            ndst: ndst as u32,
            seed: SEED,
        }
    }

    /// Enqueues one run of `f` in `layout`; its time in ms from events.
    fn run_once(&self, f: Function, layout: Layout, ndst: usize, ctx: &Arc<Ctx>) -> f64 {
        let s0 = &self.streams[0];
        let start = or_exit(Event::new(ctx), "event");
        let stop = or_exit(Event::new(ctx), "event");
        or_exit(start.record(s0), "record");
        let launch = |s: &Stream, blocks: u32, p: &Params| {
            // SAFETY: `Params` mirrors `FoParams` (both sides assert its
            // size) and its buffers live in `self` until the stream syncs
            // below.
            or_exit(unsafe { f.launch(blocks, THREADS, s, p) }, "launch");
        };
        match layout {
            Layout::One { blocks } => launch(s0, blocks, &self.params(ndst, 0, self.nvec)),
            Layout::Ranks { ranks, blocks } => {
                let per = self.nvec.div_ceil(u64::from(ranks));
                let mut ends = Vec::new();
                for r in 0..ranks as usize {
                    let s = &self.streams[r + 1];
                    or_exit(s.wait_event(&start), "wait");
                    let (b, e) = (
                        (r as u64 * per).min(self.nvec),
                        ((r as u64 + 1) * per).min(self.nvec),
                    );
                    launch(s, blocks, &self.params(ndst, b, e));
                    let done = or_exit(Event::new(ctx), "event");
                    or_exit(done.record(s), "record");
                    ends.push(done);
                }
                for e in &ends {
                    or_exit(s0.wait_event(e), "wait");
                }
            }
        }
        or_exit(stop.record(s0), "record");
        f64::from(or_exit(stop.elapsed_since(&start), "elapsed"))
    }

    /// Median ms of `RUNS` runs after `WARMUP`.
    fn time(&self, f: Function, layout: Layout, ndst: usize, ctx: &Arc<Ctx>) -> f64 {
        for _ in 0..WARMUP {
            self.run_once(f, layout, ndst, ctx);
        }
        let mut t: Vec<f64> = (0..RUNS)
            .map(|_| self.run_once(f, layout, ndst, ctx))
            .collect();
        t.sort_by(f64::total_cmp);
        t[RUNS / 2]
    }

    /// Destinations `0..ndst` hold the source's values at their start,
    /// middle and end; the first wrong vector otherwise.
    fn check(&self, ndst: usize) -> Result<(), String> {
        let s0 = &self.streams[0];
        let n = self.nvec as usize;
        let take = SAMPLE.min(n);
        for (k, d) in self.dst.iter().take(ndst).enumerate() {
            for at in [0, (n - take) / 2, n - take] {
                let mut buf = vec![0u8; take * 16];
                // SAFETY: [at, at + take) vectors lie inside `d`, which
                // outlives this synchronous read.
                or_exit(
                    unsafe { s0.read_sync(d.ptr + at as u64 * 16, &mut buf) },
                    "read back",
                );
                for (j, v) in buf.chunks_exact(16).enumerate() {
                    let got: Vec<u32> = v
                        .chunks_exact(4)
                        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
                        .collect();
                    let i = (at + j) as u64;
                    if got != value(i) {
                        return Err(format!(
                            "destination {k}, vector {i}: {got:x?}, want {:x?}",
                            value(i)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn zero(&self) {
        let s0 = &self.streams[0];
        for d in &self.dst {
            // SAFETY: the whole of a live allocation of this bench.
            or_exit(unsafe { s0.zero_async(d.ptr, d.bytes) }, "zero");
        }
        or_exit(s0.synchronize(), "sync");
    }
}

fn main() {
    let (mib, ndst) = parse();
    // Skips without a driver; fails under OXCCL_REQUIRE_GPU=1 or on any other error.
    let Some(info) = oxccl_cuda::device_or_skip("fanout_floor") else {
        return;
    };
    let dev = &info.devices[0];
    let ctx = or_exit(Ctx::new(dev.ordinal), "context");
    let cubin = or_exit(compile_source(SRC, "fanout_floor", dev.arch), "compile");
    let module = or_exit(Module::load(&ctx, &cubin), "load module");
    let bytes = mib << 20;
    let bench = Bench {
        streams: (0..9)
            .map(|_| or_exit(Stream::new(&ctx), "stream"))
            .collect(),
        src: or_exit(DevMem::uninit(&ctx, bytes), "alloc source"),
        dst: (0..ndst)
            .map(|_| or_exit(DevMem::uninit(&ctx, bytes), "alloc destination"))
            .collect(),
        nvec: (bytes / 16) as u64,
        module,
    };
    let f = |sym: &str| or_exit(bench.module.function(sym), sym);
    let sms = dev.sm_count;
    // SAFETY: as `run_once`: mirrored parameters, buffers of `bench`.
    or_exit(
        unsafe {
            f("fo_pattern").launch(
                sms * 4,
                THREADS,
                &bench.streams[0],
                &bench.params(ndst, 0, bench.nvec),
            )
        },
        "pattern",
    );
    or_exit(bench.streams[0].synchronize(), "sync");
    println!(
        "fanout_floor: {} (sm_{}, {sms} SMs), {mib} MiB read once into {ndst} destinations, \
         {THREADS} threads per block, median of {RUNS} runs",
        dev.name, dev.arch
    );
    let one = |blocks| Layout::One { blocks };
    let ranks8 = |blocks| Layout::Ranks { ranks: 8, blocks };
    let fan = |name, symbol, layout| Pattern {
        name,
        symbol,
        layout,
        all_dst: true,
        reads: true,
    };
    let patterns = [
        Pattern {
            name: "copy",
            symbol: "fo_copy",
            layout: one(sms * 2),
            all_dst: false,
            reads: true,
        },
        Pattern {
            name: "fill",
            symbol: "fo_fill",
            layout: one(sms * 2),
            all_dst: true,
            reads: false,
        },
        fan("slice4 (128 blocks)", "fo_fan_slice4", one(128)),
        fan("slice4 (2 per SM)", "fo_fan_slice4", one(sms * 2)),
        fan("slice8 (128 blocks)", "fo_fan_slice8", one(128)),
        fan("slice4_cs (128 blocks)", "fo_fan_slice4_cs", one(128)),
        fan("grid4 (2 per SM)", "fo_fan_grid4", one(sms * 2)),
        fan("grid4_cs (2 per SM)", "fo_fan_grid4_cs", one(sms * 2)),
        fan(
            "perdst (2 per SM)",
            "fo_fan_perdst",
            one((sms * 2 / ndst as u32).max(1) * ndst as u32),
        ),
        fan("slice4 (64 blocks)", "fo_fan_slice4", one(64)),
        fan("slice4 (96 blocks)", "fo_fan_slice4", one(96)),
        fan("slice4 (1 per SM)", "fo_fan_slice4", one(sms)),
        fan("grid4_cs (128 blocks)", "fo_fan_grid4_cs", one(128)),
        fan("ranks8 (slice4, 8x16 blocks)", "fo_fan_slice4", ranks8(16)),
        // The executor's launch shape with fewer channels per rank, and
        // with the two best single-launch patterns.
        fan("ranks8 (slice4, 8x8 blocks)", "fo_fan_slice4", ranks8(8)),
        fan("ranks8 (slice4, 8x12 blocks)", "fo_fan_slice4", ranks8(12)),
        fan("ranks8 (slice4_cs, 8x16)", "fo_fan_slice4_cs", ranks8(16)),
        fan("ranks8 (grid4_cs, 8x16)", "fo_fan_grid4_cs", ranks8(16)),
        fan("ranks8 (grid4_cs, 8x12)", "fo_fan_grid4_cs", ranks8(12)),
    ];
    let mut copy_gbps = None;
    let mut ok = true;
    for p in &patterns {
        bench.zero();
        let ms = bench.time(
            f(p.symbol),
            p.layout,
            if p.all_dst { ndst } else { 1 },
            &ctx,
        );
        let writes = if p.all_dst { ndst } else { 1 };
        let moved = (bytes * (writes + usize::from(p.reads))) as f64;
        let gbps = moved / (ms * 1e6);
        let copy = *copy_gbps.get_or_insert(gbps);
        let verdict = if p.reads {
            bench.check(if p.all_dst { ndst } else { 1 })
        } else {
            Ok(())
        };
        let mark = match &verdict {
            Ok(()) => String::new(),
            Err(e) => {
                ok = false;
                format!("  WRONG: {e}")
            }
        };
        println!(
            "fanout_floor: {:<30} {:>9.1} us  {:>7.0} GB/s moved  {:>6.1}% of the copy rate{mark}",
            p.name,
            ms * 1e3,
            gbps,
            100.0 * gbps / copy
        );
    }
    if !ok {
        exit(1);
    }
}
