//! The latency harness: one rank's time per call, eager (one launch per
//! call) and replayed from a CUDA graph, timed with device events on the
//! rank's stream. 50 warm-up calls; then 15 runs of 200 eager calls; then a
//! graph of 100 captured calls, launched 4 times per run for 15 runs. Every
//! run starts behind a barrier of all ranks, so ranks that wait on each
//! other start together; each figure is the median run. Across ranks the
//! figure reported is the slowest rank's ([`slowest`]).

use std::sync::Barrier;

use oxccl_cuda::driver::{Event, Graph, Stream};
use oxccl_cuda::CudaError;

use crate::{median, Result};

pub const WARMUP: u32 = 50;
pub const RUNS: usize = 15;
pub const CALLS_PER_RUN: u32 = 200;
pub const CALLS_PER_GRAPH: u32 = 100;
pub const GRAPH_LAUNCHES: u32 = 4;

/// Microseconds per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    pub eager_us: f64,
    pub graph_us: f64,
}

/// The slowest rank's figures (each column on its own).
pub fn slowest(per_rank: &[Latency]) -> Latency {
    Latency {
        eager_us: per_rank.iter().map(|l| l.eager_us).fold(0.0, f64::max),
        graph_us: per_rank.iter().map(|l| l.graph_us).fold(0.0, f64::max),
    }
}

/// One rank's latency for `launch` (which enqueues one call on `stream`);
/// `settle` waits for the stream (with the caller's deadline). Every rank
/// of `bar` must call this at once.
pub fn rank_latency(
    stream: &Stream,
    bar: &Barrier,
    launch: &dyn Fn() -> Result<()>,
    settle: &dyn Fn() -> Result<()>,
) -> Result<Latency> {
    let (e0, e1) = (Event::new(stream.ctx())?, Event::new(stream.ctx())?);
    let timed = |calls: u32, each: &dyn Fn() -> Result<()>, per: u32| -> Result<f64> {
        let mut runs = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            bar.wait();
            e0.record(stream)?;
            for _ in 0..calls {
                each()?;
            }
            e1.record(stream)?;
            settle()?;
            runs.push(f64::from(e1.elapsed_since(&e0)?) * 1e3 / f64::from(calls * per));
        }
        Ok(median(runs))
    };
    for _ in 0..WARMUP {
        launch()?;
    }
    settle()?;
    let eager_us = timed(CALLS_PER_RUN, launch, 1)?;
    bar.wait();
    // The capture takes the driver's error type; a launch's own error is
    // kept and returned instead.
    let mut failed = None;
    let g = Graph::capture(stream, || {
        for _ in 0..CALLS_PER_GRAPH {
            if let Err(e) = launch() {
                failed = Some(e);
                return Err(CudaError::Invalid("a launch failed during capture".into()));
            }
        }
        Ok(())
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let g = g?;
    g.launch(stream)?;
    settle()?;
    let graph_us = timed(GRAPH_LAUNCHES, &|| Ok(g.launch(stream)?), CALLS_PER_GRAPH)?;
    Ok(Latency { eager_us, graph_us })
}

/// Host wall time per call, ns, of an 8-byte f32 AllReduce through the
/// facade on buffers from `comm.alloc`: every rank on its own thread,
/// [`WARMUP`] calls, then `runs` runs of `calls` calls behind a barrier of
/// ranks; the median run per rank, the slowest rank. For what the host
/// pays per call (the facade on a null backend, the host backend), where
/// device events have nothing to time.
pub fn wall_ns_per_call(
    comms: &[oxccl::Communicator],
    runs: usize,
    calls: u32,
) -> oxccl::Result<f64> {
    let bar = Barrier::new(comms.len());
    let op = oxccl::RedOp::Sum;
    let per_rank: Vec<oxccl::Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let bar = &bar;
                s.spawn(move || -> oxccl::Result<f64> {
                    let (a, b) = (c.alloc::<f32>(2)?, c.alloc::<f32>(2)?);
                    for _ in 0..WARMUP {
                        c.all_reduce(&a, &b, op)?;
                    }
                    let mut times = Vec::with_capacity(runs);
                    for _ in 0..runs {
                        bar.wait();
                        let t = std::time::Instant::now();
                        for _ in 0..calls {
                            c.all_reduce(&a, &b, op)?;
                        }
                        times.push(t.elapsed().as_secs_f64() * 1e9 / f64::from(calls.max(1)));
                    }
                    Ok(median(times))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    per_rank.into_iter().try_fold(0.0f64, |w, r| Ok(w.max(r?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_rank_sets_each_column() {
        let l = slowest(&[
            Latency {
                eager_us: 5.0,
                graph_us: 1.0,
            },
            Latency {
                eager_us: 3.0,
                graph_us: 4.0,
            },
        ]);
        assert_eq!((l.eager_us, l.graph_us), (5.0, 4.0));
    }
}
