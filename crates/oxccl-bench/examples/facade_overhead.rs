//! The facade's own CPU cost per call: an 8-byte f32 AllReduce through
//! `Communicator::all_reduce` on `oxccl::backend::null`, whose launch does
//! nothing (it claims to be CUDA, with registered memory, Simple and LL, 16
//! channels, so the facade takes the CUDA path: validation, selection,
//! plan lookup, binding, the backend call). Each rank runs on its own
//! thread; reported: median over runs of wall time per call, slowest rank.
//!
//! `facade_overhead [RANKS] [CALLS_PER_RUN]`, default `1 200000`. Run it
//! in release mode; with more ranks than cores the threads timeshare and
//! the figure includes that. `OXCCL_CHECK_CALLS=0` leaves out the call
//! check (fingerprints compared between ranks), so the two runs give its
//! cost; with more than one rank the check waits for the slowest thread,
//! so the figure then includes the ranks' skew.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use oxccl_bench::median;

use oxccl::backend::null::NullBackend;
use oxccl::{Config, RedOp};

const RUNS: usize = 15;
const WARMUP: u32 = 50;

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let calls: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let backend = Arc::new(NullBackend::new(16, 1 << 17));
    let comms = oxccl::init_all_on(n, backend, Config::from_env()?)?;
    let bar = Barrier::new(n as usize);
    let per_rank: Vec<oxccl::Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let bar = &bar;
                s.spawn(move || -> oxccl::Result<f64> {
                    let (a, b) = (c.alloc::<f32>(2)?, c.alloc::<f32>(2)?);
                    for _ in 0..WARMUP {
                        c.all_reduce(&a, &b, RedOp::Sum)?;
                    }
                    let mut runs = Vec::with_capacity(RUNS);
                    for _ in 0..RUNS {
                        bar.wait();
                        let t = Instant::now();
                        for _ in 0..calls {
                            c.all_reduce(&a, &b, RedOp::Sum)?;
                        }
                        runs.push(t.elapsed().as_secs_f64() * 1e9 / f64::from(calls));
                    }
                    Ok(median(runs))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    let mut worst = 0.0f64;
    for r in per_rank {
        worst = worst.max(r?);
    }
    let choice = comms[0]
        .last_choice()
        .map_or("none".into(), |c| c.to_string());
    println!(
        "facade overhead: 8 B f32 allreduce, {n} ranks, {choice}: {worst:.0} ns/call \
         (median over {RUNS} runs of {calls} calls, slowest rank, null backend, check {})",
        if comms[0].config().check_calls {
            "on"
        } else {
            "off"
        }
    );
    Ok(())
}
