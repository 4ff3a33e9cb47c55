//! The facade's own CPU cost per call: an 8-byte f32 AllReduce through
//! `Communicator::all_reduce` on a backend whose launch does nothing
//! (it claims to be CUDA, with registered memory, Simple and LL, 16
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use oxccl_bench::median;

use oxccl::backend::{Backend, Launch, PlanHandle, RawBuf, Timer};
use oxccl::core::Plan;
use oxccl::{BackendKind, Config, Error, Proto, RedOp};

const RUNS: usize = 15;
const WARMUP: u32 = 50;

/// A backend that hands out distinct fake addresses and launches nothing.
#[derive(Debug)]
struct Null {
    next: AtomicU64,
}

impl Backend for Null {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn describe(&self) -> String {
        "null (launches nothing)".into()
    }
    fn blocking(&self) -> bool {
        false
    }
    fn registered_alloc(&self) -> bool {
        true
    }
    fn chunk_bytes(&self) -> usize {
        1 << 17
    }
    fn max_channels(&self) -> u32 {
        16
    }
    fn protocols(&self) -> &'static [Proto] {
        &[Proto::Simple, Proto::LL]
    }
    fn prepare_plan(&self, _: &Plan, _: usize, _: Proto) -> Result<Option<PlanHandle>, Error> {
        Ok(Some(Arc::new(())))
    }
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        // Touch what a real launch reads, so none of it is optimised out.
        std::hint::black_box((launch.plan.bufs.len(), launch.bufs, launch.handle));
        Ok(())
    }
    fn alloc(&self, _: u32, bytes: usize) -> Result<RawBuf, Error> {
        let addr = self
            .next
            .fetch_add(bytes.next_multiple_of(256) as u64, Ordering::Relaxed);
        Ok(RawBuf { addr, bytes })
    }
    unsafe fn free(&self, _: u32, _: RawBuf) {}
    unsafe fn write(&self, _: u32, _: RawBuf, _: &[u8]) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn read(&self, _: u32, _: RawBuf, _: &mut [u8]) -> Result<(), Error> {
        Ok(())
    }
    fn synchronize(&self, _: u32) -> Result<(), Error> {
        Ok(())
    }
    fn abort(&self) {}
    fn failure(&self) -> Option<Error> {
        None
    }
    fn timer(&self, _: u32) -> Result<Box<dyn Timer>, Error> {
        Err(Error::Backend("no device timer on the null backend".into()))
    }
    fn copy_bandwidth(&self, _: usize) -> Result<f64, Error> {
        Err(Error::Backend("no copies on the null backend".into()))
    }
}

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let calls: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let backend = Arc::new(Null {
        next: AtomicU64::new(1 << 20),
    });
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
