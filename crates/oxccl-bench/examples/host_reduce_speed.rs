//! Host reductions per byte: a 2-rank host AllReduce of 1 MiB per rank on
//! buffers from `comm.alloc` (registered: the plans reduce peers' inputs
//! in place, so the reduction loop is most of the time), for every element
//! type with Sum, Max and Min, and fp8 with Prod; each as time per
//! call and as a ratio to f32 Sum (same bytes). A shared machine's load
//! comes and goes, so each row alternates f32 Sum and its own op for
//! ROUNDS rounds of 5 runs of CALLS calls, and compares the best run of
//! each (other load only ever adds time). The goal: every ratio
//! within 2.
//!
//! `host_reduce_speed [BYTES] [CALLS] [ROUNDS]`, default `1M 40 3`.
//! Release mode.

use std::time::Instant;

use oxccl::{bf16, f16, BackendKind, Communicator, Config, Element, RedOp, F8E4M3, F8E5M2};

fn time<T: Element>(comms: &[Communicator], bytes: usize, calls: u32, op: RedOp) -> f64 {
    let len = bytes / std::mem::size_of::<T>();
    let per_rank: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let (a, b) = (c.alloc::<T>(len).unwrap(), c.alloc::<T>(len).unwrap());
                    a.copy_from_slice(&vec![T::from_f64(1.0); len]).unwrap();
                    let mut runs = Vec::new();
                    for _ in 0..5 {
                        let t = Instant::now();
                        for _ in 0..calls {
                            c.all_reduce(&a, &b, op).unwrap();
                        }
                        runs.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(calls));
                    }
                    // The best run: on a shared machine other load only
                    // ever adds time, so the minimum is the steadiest.
                    runs.into_iter().fold(f64::INFINITY, f64::min)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    per_rank.into_iter().fold(0.0, f64::max)
}

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let bytes = args
        .next()
        .map_or(Ok(1 << 20), |a| oxccl::config::parse_size(&a))
        .map_err(oxccl::Error::InvalidUsage)?;
    let calls: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(40);
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let config = Config::builder().backend(BackendKind::Host).build()?;
    let comms = oxccl::init_all_with(2, config)?;
    println!(
        "host_reduce_speed: 2 ranks, {bytes} B per rank, us per call \
         best of {rounds} rounds (ratio to f32 sum in the same rounds)"
    );
    let f32_sum = || time::<f32>(&comms, bytes, calls, RedOp::Sum);
    let row = |name: &str, timed: &dyn Fn() -> f64| {
        let (mut base, mut us) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..rounds {
            base = base.min(f32_sum());
            us = us.min(timed());
        }
        println!(
            "{name:>14} {us:9.1} us  {:5.2}x  (f32 sum {base:.1} us)",
            us / base
        );
    };
    row("f32 sum", &f32_sum);
    row("f64 sum", &|| time::<f64>(&comms, bytes, calls, RedOp::Sum));
    for (op, on) in [
        (RedOp::Sum, "sum"),
        (RedOp::Max, "max"),
        (RedOp::Min, "min"),
    ] {
        row(&format!("f16 {on}"), &|| {
            time::<f16>(&comms, bytes, calls, op)
        });
        row(&format!("bf16 {on}"), &|| {
            time::<bf16>(&comms, bytes, calls, op)
        });
        row(&format!("f8e4m3 {on}"), &|| {
            time::<F8E4M3>(&comms, bytes, calls, op)
        });
        row(&format!("f8e5m2 {on}"), &|| {
            time::<F8E5M2>(&comms, bytes, calls, op)
        });
        row(&format!("i8 {on}"), &|| {
            time::<i8>(&comms, bytes, calls, op)
        });
        row(&format!("u8 {on}"), &|| {
            time::<u8>(&comms, bytes, calls, op)
        });
        row(&format!("i32 {on}"), &|| {
            time::<i32>(&comms, bytes, calls, op)
        });
    }
    // fp8 Prod has its own lanes (held to within 2 too).
    row("f8e4m3 prod", &|| {
        time::<F8E4M3>(&comms, bytes, calls, RedOp::Prod)
    });
    row("f8e5m2 prod", &|| {
        time::<F8E5M2>(&comms, bytes, calls, RedOp::Prod)
    });
    Ok(())
}
