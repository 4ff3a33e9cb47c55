//! Small-message latency through the facade: an 8-byte f32 AllReduce
//! (`Communicator::all_reduce` on buffers from `comm.alloc`) on N ranks,
//! each rank on its own host thread, measured as
//! `examples/latency.rs` measures `World::launch`: 50 warm-up
//! calls, then 15 runs of 200 calls, each run timed with device events on
//! the rank's stream (`Communicator::timer`), the median run per rank and
//! the slowest rank. Beside it:
//!
//! - `enqueue`: host wall time per call of the same loops (how long the
//!   facade plus `cuLaunchKernel` take to enqueue; when it is below the
//!   device figure the GPU, not the host, sets the pace);
//! - `sweep-style`: what `cargo xtask sweep -n 5` timed until fdb20fc
//!   (it now reports each rank's median call): after a host barrier, 5
//!   calls between the events, mean per call, slowest rank; once with the
//!   timer started at once (the ranks' start skew counts, divided by 5),
//!   once behind one untimed lead-in call.
//!
//! `call_latency [RANKS] [ALGO]`, default `8` and the selector's pick; ALGO
//! takes `NCCL_ALGO` syntax and replaces `OXCCL_ALGO`/`NCCL_ALGO` from the
//! environment (which apply otherwise). Prints `skipped: no CUDA device`
//! without one.
//!
//! The cost of the call check (fingerprints compared between ranks before
//! each launch, on by default): run it twice, the second time with
//! `OXCCL_CHECK_CALLS=0`; the line says which (`check on`/`check off`).
//! A captured graph replays without the check (it runs on the host, at
//! capture), so its cost is the eager difference only.

use std::sync::Barrier;
use std::time::Instant;

use oxccl_bench::median;

use oxccl::{BackendKind, Communicator, Config, RedOp};

const WARMUP: u32 = 50;
const CALLS_PER_RUN: u32 = 200;
const RUNS: usize = 15;
/// The sweep's default `-n`.
const SWEEP_ITERS: u32 = 5;

/// µs per call for one rank, median over runs of `SWEEP_ITERS` calls
/// timed after a host barrier, with or without an untimed lead-in call.
fn sweep_style(
    c: &Communicator,
    bar: &Barrier,
    timer: &mut dyn oxccl::backend::Timer,
    run: &dyn Fn() -> oxccl::Result<()>,
    lead_in: bool,
) -> oxccl::Result<f64> {
    let mut v = Vec::new();
    for _ in 0..RUNS {
        c.synchronize()?;
        bar.wait();
        if lead_in {
            run()?;
        }
        timer.start()?;
        for _ in 0..SWEEP_ITERS {
            run()?;
        }
        v.push(timer.stop()?.as_secs_f64() * 1e6 / f64::from(SWEEP_ITERS));
    }
    Ok(median(v))
}

/// µs per call for one rank: device events (median run), host enqueue,
/// sweep-style without and with the lead-in, device events (mean and
/// slowest run: the old sweep reported one run's mean, which stalls move).
fn rank_run(c: &Communicator, bar: &Barrier) -> oxccl::Result<[f64; 6]> {
    let (send, recv) = (c.alloc::<f32>(2)?, c.alloc::<f32>(2)?);
    send.copy_from_slice(&[c.rank() as f32, 1.0])?;
    for _ in 0..WARMUP {
        c.all_reduce(&send, &recv, RedOp::Sum)?;
    }
    c.synchronize()?;
    let mut timer = c.timer()?;
    let (mut device, mut host) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        bar.wait();
        timer.start()?;
        let t = Instant::now();
        for _ in 0..CALLS_PER_RUN {
            c.all_reduce(&send, &recv, RedOp::Sum)?;
        }
        host.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS_PER_RUN));
        device.push(timer.stop()?.as_secs_f64() * 1e6 / f64::from(CALLS_PER_RUN));
    }
    let run = || c.all_reduce(&send, &recv, RedOp::Sum);
    let sweep = sweep_style(c, bar, timer.as_mut(), &run, false)?;
    let lead_in = sweep_style(c, bar, timer.as_mut(), &run, true)?;
    let n = c.nranks() as f32;
    let got = recv.to_vec()?;
    let want = [n * (n - 1.0) / 2.0, n];
    if got != want {
        return Err(oxccl::Error::Internal(format!(
            "rank {}: allreduce gave {got:?}, expected {want:?}",
            c.rank()
        )));
    }
    let mean = device.iter().sum::<f64>() / device.len() as f64;
    let slowest = device.iter().copied().fold(0.0, f64::max);
    Ok([median(device), median(host), sweep, lead_in, mean, slowest])
}

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let algo = args.next();
    // Skips without a driver; fails under OXCCL_REQUIRE_GPU=1 or on any other error.
    if oxccl::backend::cuda::device_or_skip("call_latency").is_none() {
        return Ok(());
    }
    let mut config = Config::from_env()?;
    config.backend = BackendKind::Cuda;
    if let Some(a) = &algo {
        config.algo = oxccl::config::parse_algo_filter("ALGO argument", a)?;
    }
    let comms = oxccl::init_all_with(n, config)?;
    let bar = Barrier::new(n as usize);
    let per_rank: Vec<oxccl::Result<[f64; 6]>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let bar = &bar;
                s.spawn(move || {
                    let r = rank_run(c, bar);
                    if r.is_err() {
                        // Peers must not wait for this rank until their deadline.
                        c.abort();
                    }
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    let mut worst = [0.0f64; 6];
    for r in per_rank {
        for (w, x) in worst.iter_mut().zip(r?) {
            *w = w.max(x);
        }
    }
    let [device, host, sweep, lead_in, mean, slowest] = worst;
    let choice = comms[0]
        .last_choice()
        .map_or_else(|| "none".into(), |c| c.to_string());
    println!(
        "call_latency: 8 B f32 allreduce through the facade, {n} ranks, {choice}: \
         {device:.2} us/call (device events; mean of the runs {mean:.2}, slowest run {slowest:.2}; enqueue {host:.2} us/call on the host; \
         sweep-style {SWEEP_ITERS} calls after a barrier {sweep:.2} us/call, \
         behind a lead-in call {lead_in:.2} us/call; \
         median over {RUNS} runs of {CALLS_PER_RUN}, slowest rank; check {}; {})",
        if comms[0].config().check_calls { "on" } else { "off" },
        comms[0].describe_backend()
    );
    Ok(())
}
