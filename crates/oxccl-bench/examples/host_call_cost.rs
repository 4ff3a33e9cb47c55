//! The call check's cost on the host backend: an 8-byte f32 AllReduce on
//! buffers from `comm.alloc`, N rank threads, wall time per call (median
//! over runs, slowest rank), once with the check (the default) and once
//! with `check_calls(false)`. With more rank threads than free cores the
//! figures are mostly scheduling: each rendezvous waits for the other
//! threads to run.
//!
//! `host_call_cost [RANKS] [CALLS_PER_RUN]`, default `2 20000`. Release
//! mode.

use std::sync::Barrier;
use std::time::Instant;

use oxccl::{BackendKind, Config, RedOp};
use oxccl_bench::median;

const RUNS: usize = 9;

fn ns_per_call(n: u32, calls: u32, check: bool) -> oxccl::Result<f64> {
    let config = Config::builder()
        .backend(BackendKind::Host)
        .check_calls(check)
        .build()?;
    let comms = oxccl::init_all_with(n, config)?;
    let bar = Barrier::new(n as usize);
    let per_rank: Vec<oxccl::Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let bar = &bar;
                s.spawn(move || -> oxccl::Result<f64> {
                    let (a, b) = (c.alloc::<f32>(2)?, c.alloc::<f32>(2)?);
                    for _ in 0..50 {
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
    per_rank.into_iter().try_fold(0.0f64, |w, r| Ok(w.max(r?)))
}

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let calls: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let on = ns_per_call(n, calls, true)?;
    let off = ns_per_call(n, calls, false)?;
    println!(
        "host_call_cost: 8 B f32 allreduce, {n} rank threads, {} cores: check on {on:.0} ns/call, off {off:.0} ns/call, cost {:.0} ns/call (median of {RUNS} runs of {calls}, slowest rank)",
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        on - off
    );
    Ok(())
}
