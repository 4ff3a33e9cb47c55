//! A criterion-free micro benchmark: ring AllReduce bus bandwidth on the
//! host fabric against a single-thread memcpy of the same buffer.
//!
//! `cargo run --release -p oxccl-host --example host_bw -- [ranks] [MiB] [channels] [iters]`

use std::time::Instant;

use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use oxccl_host::{HostBuf, HostConfig, HostFabric};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (n, mib, channels, iters) = (arg(0, 4) as u32, arg(1, 64), arg(2, 1) as u32, arg(3, 5));
    let count = (mib << 20) / 4;
    let cfg = HostConfig::default();
    let mut req = PlanRequest::new(
        Collective::new(CollKind::AllReduce, count, 0),
        n,
        Algo::Ring,
    );
    req.channels = channels;
    req.chunk = cfg.slot_bytes / 4;
    let plan = generate(&req).expect("plan");
    let fab = HostFabric::new(n, cfg);
    let op = RedOp::Sum.lower(DataType::F32, n);
    let mut mems: Vec<(Vec<f32>, Vec<f32>)> = (0..n)
        .map(|r| (vec![r as f32; count], vec![0.0; count]))
        .collect();
    let mut best = f64::INFINITY;
    for _ in 0..iters + 1 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for (rp, (i, o)) in plan.ranks.iter().zip(mems.iter_mut()) {
                let fab = &fab;
                let op = &op;
                s.spawn(move || {
                    let bufs = [HostBuf::from_slice(i), HostBuf::from_mut_slice(o)];
                    // SAFETY: the buffers are this thread's own vectors.
                    unsafe { fab.execute(rp, &bufs, DataType::F32, op) }.expect("allreduce");
                });
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    let want = (0..n).map(|r| r as f32).sum::<f32>();
    assert!(mems.iter().all(|(_, o)| o.iter().all(|&v| v == want)));
    let bytes = (count * 4) as f64;
    let busbw = bytes / best * CollKind::AllReduce.busbw_factor(n) / 1e9;
    let src = vec![1u8; count * 4];
    let mut dst = vec![0u8; count * 4];
    let mut copy = f64::INFINITY;
    for _ in 0..iters + 1 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        copy = copy.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    println!(
        "ranks {n} size {mib} MiB channels {channels}: allreduce {:.2} ms, busbw {busbw:.2} GB/s; memcpy {:.2} GB/s",
        best * 1e3,
        bytes / copy / 1e9
    );
}
