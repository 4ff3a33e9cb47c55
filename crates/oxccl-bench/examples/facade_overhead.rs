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

use std::sync::Arc;

use oxccl::backend::null::NullBackend;
use oxccl::Config;
use oxccl_bench::latency::wall_ns_per_call;

const RUNS: usize = 15;

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let calls: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let backend = Arc::new(NullBackend::new(16, 1 << 17));
    let comms = oxccl::init_all_on(n, backend, Config::from_env()?)?;
    let worst = wall_ns_per_call(&comms, RUNS, calls)?;
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
