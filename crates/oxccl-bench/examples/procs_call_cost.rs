//! The call check's cost across processes on the host backend: an 8-byte
//! f32 AllReduce on buffers from `comm.alloc`, N processes (one rank
//! each), wall time per call (median over runs, slowest rank), with the
//! check (the default) and with `check_calls(false)` in the same run:
//! each process holds both communicators and alternates their runs, so
//! load on the machine hits both alike.
//!
//! `procs_call_cost [PROCS] [CALLS_PER_RUN]`, default `4 2000`. Release
//! mode. The process re-executes itself for its ranks.

use std::process::Command;
use std::time::Instant;

use oxccl::{BackendKind, Communicator, Config, RedOp, UniqueId};
use oxccl_bench::latency::WARMUP;
use oxccl_bench::median;

const RUNS: usize = 9;
const IDS: [&str; 2] = ["OXCCL_PCC_ON", "OXCCL_PCC_OFF"];

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// One rank: both communicators, runs alternating; rank 0 prints.
fn rank(n: u32, r: u32, calls: u32) -> oxccl::Result<()> {
    let mut comms = Vec::new();
    for (id, check) in IDS.iter().zip([true, false]) {
        let id = UniqueId::from_bytes(&unhex(&var(id)))?;
        let config = Config::builder()
            .backend(BackendKind::Host)
            .check_calls(check)
            .build()?;
        let c = Communicator::init_rank(&id, n, r, config)?;
        assert_eq!(c.config().check_calls, check, "the check as asked");
        comms.push(c);
    }
    let bufs: Vec<_> = comms
        .iter()
        .map(|c| Ok((c.alloc::<f32>(2)?, c.alloc::<f32>(2)?)))
        .collect::<oxccl::Result<_>>()?;
    let mut times = [Vec::new(), Vec::new()];
    for (c, (a, b)) in comms.iter().zip(&bufs) {
        for _ in 0..WARMUP {
            c.all_reduce(a, b, RedOp::Sum)?;
        }
    }
    for _ in 0..RUNS {
        for (i, (c, (a, b))) in comms.iter().zip(&bufs).enumerate() {
            c.exchange(&[])?;
            let t = Instant::now();
            for _ in 0..calls {
                c.all_reduce(a, b, RedOp::Sum)?;
            }
            times[i].push(t.elapsed().as_secs_f64() * 1e9 / f64::from(calls.max(1)));
        }
    }
    let mine: Vec<u8> = times
        .map(median)
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let all = comms[0].exchange(&mine)?;
    if r == 0 {
        let slowest = |i: usize| {
            all.iter()
                .map(|v| f64::from_le_bytes(v[8 * i..8 * i + 8].try_into().unwrap_or([0; 8])))
                .fold(0.0, f64::max)
        };
        let (on, off) = (slowest(0), slowest(1));
        println!(
            "procs_call_cost: 8 B f32 allreduce, {n} processes, {} cores: check on {on:.0} ns/call, off {off:.0} ns/call, cost {:.0} ns/call (median of {RUNS} runs of {calls}, slowest rank)",
            std::thread::available_parallelism().map_or(0, |p| p.get()),
            on - off
        );
    }
    Ok(())
}

fn main() -> oxccl::Result<()> {
    if let Ok(r) = std::env::var("OXCCL_PCC_RANK") {
        let n = var("OXCCL_PCC_N").parse().unwrap_or(0);
        let calls = var("OXCCL_PCC_CALLS").parse().unwrap_or(0);
        return rank(n, r.parse().unwrap_or(0), calls);
    }
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let calls: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let ids = [UniqueId::new()?, UniqueId::new()?];
    let exe = std::env::current_exe().map_err(|e| oxccl::Error::InvalidUsage(e.to_string()))?;
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.env("OXCCL_PCC_RANK", r.to_string())
                .env("OXCCL_PCC_N", n.to_string())
                .env("OXCCL_PCC_CALLS", calls.to_string());
            for (k, id) in IDS.iter().zip(&ids) {
                cmd.env(k, hex(&id.to_bytes()));
            }
            cmd.spawn()
        })
        .collect::<Result<_, _>>()
        .map_err(|e| oxccl::Error::InvalidUsage(format!("spawning a rank: {e}")))?;
    for mut k in kids {
        let st = k
            .wait()
            .map_err(|e| oxccl::Error::InvalidUsage(e.to_string()))?;
        if !st.success() {
            return Err(oxccl::Error::InvalidUsage(format!("a rank failed: {st}")));
        }
    }
    Ok(())
}
