//! The call check's cost on the host backend: an 8-byte f32 AllReduce on
//! buffers from `comm.alloc`, N rank threads, wall time per call (median
//! over runs, slowest rank), once with the check (the default) and once
//! with `check_calls(false)`. With more rank threads than free cores the
//! figures are mostly scheduling: each rendezvous waits for the other
//! threads to run.
//!
//! `host_call_cost [RANKS] [CALLS_PER_RUN]`, default `2 20000`. Release
//! mode.

use oxccl::{BackendKind, Config};
use oxccl_bench::latency::wall_ns_per_call;

const RUNS: usize = 9;

fn ns_per_call(n: u32, calls: u32, check: bool) -> oxccl::Result<f64> {
    let config = Config::builder()
        .backend(BackendKind::Host)
        .check_calls(check)
        .build()?;
    let comms = oxccl::init_all_with(n, config)?;
    wall_ns_per_call(&comms, RUNS, calls)
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
