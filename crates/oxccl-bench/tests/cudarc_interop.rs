//! The facade's cudarc interop (feature `cudarc`, enabled for this crate):
//! collectives and Send/Recv on `CudaSlice`s on a cudarc `CudaStream` per
//! rank, buffers dropped right after the call is enqueued (cudarc's event
//! tracking must hold the frees back), results read on the stream.
//! Without a driver: `skipped: no CUDA device` (a failure under
//! `OXCCL_REQUIRE_GPU=1`). `OXCCL_GPU_RANKS` (default `2,8`) sizes it.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use oxccl::{BackendKind, CollKind, Communicator, Config, RedOp};

fn ranks() -> Vec<u32> {
    std::env::var("OXCCL_GPU_RANKS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 8])
}

fn value(r: u32, k: usize, i: usize) -> f32 {
    ((i % 11) + r as usize * 2 + k % 3) as f32
}

/// One rank's rounds: AllReduce (inputs dropped at once), in-place
/// AllGather and a ring Send/Recv, each checked; returns the first wrong
/// result.
fn rank_rounds(
    c: &Communicator,
    stream: &Arc<CudaStream>,
    rounds: usize,
    len: usize,
) -> Result<(), String> {
    let (n, r) = (c.nranks(), c.rank());
    let e = |x: cudarc::driver::DriverError| x.to_string();
    for k in 0..rounds {
        let input: Vec<f32> = (0..len).map(|i| value(r, k, i)).collect();
        let send = stream.clone_htod(&input).map_err(e)?;
        let mut recv = stream.alloc_zeros::<f32>(len).map_err(e)?;
        c.collective_on(CollKind::AllReduce, &send, &mut recv, RedOp::Sum, 0, stream)
            .map_err(|x| x.to_string())?;
        // Dropped while the collective may still run: cudarc frees it
        // only after the read event the call left on `stream`.
        drop(send);
        let junk = stream.clone_htod(&vec![-1.0f32; len]).map_err(e)?;
        let got = stream.clone_dtoh(&recv).map_err(e)?;
        drop(junk);
        for (i, g) in got.iter().enumerate() {
            let want: f32 = (0..n).map(|q| value(q, k, i)).sum();
            if *g != want {
                return Err(format!(
                    "rank {r} round {k} AllReduce element {i}: {g}, expected {want}"
                ));
            }
        }
        let mut all = stream.alloc_zeros::<f32>(len * n as usize).map_err(e)?;
        let mut mine = all.slice_mut(r as usize * len..(r as usize + 1) * len);
        stream.memcpy_htod(&input, &mut mine).map_err(e)?;
        c.collective_in_place_on(CollKind::AllGather, &mut all, RedOp::Sum, 0, stream)
            .map_err(|x| x.to_string())?;
        let got = stream.clone_dtoh(&all).map_err(e)?;
        for (j, g) in got.iter().enumerate() {
            let want = value((j / len) as u32, k, j % len);
            if *g != want {
                return Err(format!(
                    "rank {r} round {k} AllGather element {j}: {g}, expected {want}"
                ));
            }
        }
        let out = stream.clone_htod(&input).map_err(e)?;
        let mut inp = stream.alloc_zeros::<f32>(len).map_err(e)?;
        if n > 1 {
            let (to, from) = ((r + 1) % n, (r + n - 1) % n);
            // A send and a receive of one rank must be one group to pair
            // with the neighbours': alternate the order by parity instead.
            if r % 2 == 0 {
                c.send_on(&out, to, stream).map_err(|x| x.to_string())?;
                c.recv_on(&mut inp, from, stream)
                    .map_err(|x| x.to_string())?;
            } else {
                c.recv_on(&mut inp, from, stream)
                    .map_err(|x| x.to_string())?;
                c.send_on(&out, to, stream).map_err(|x| x.to_string())?;
            }
            let got = stream.clone_dtoh(&inp).map_err(e)?;
            if let Some(i) = (0..len).find(|&i| got[i] != value(from, k, i)) {
                return Err(format!("rank {r} round {k} ring element {i}: {}", got[i]));
            }
        }
    }
    Ok(())
}

#[test]
fn cuda_cudarc_slices_on_cudarc_streams() {
    for n in ranks() {
        if oxccl::backend::cuda::device_or_skip("cuda_cudarc_slices_on_cudarc_streams").is_none() {
            return;
        }
        let cfg = Config {
            backend: BackendKind::Cuda,
            deadline: std::time::Duration::from_secs(20),
            ..Config::from_env().expect("configuration")
        };
        let comms = oxccl::init_all_with(n, cfg).expect("CUDA communicators");
        let ndev = CudaContext::device_count().expect("devices").max(1) as u32;
        let t = std::time::Instant::now();
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let ctx = CudaContext::new((c.rank() % ndev) as usize)
                            .map_err(|e| e.to_string())?;
                        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
                        let r = rank_rounds(c, &stream, 20, 100_003);
                        if r.is_err() {
                            c.abort();
                        }
                        r
                    })
                })
                .collect();
            hs.into_iter()
                .filter_map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())).err())
                .collect()
        });
        assert!(errs.is_empty(), "{n} ranks: {errs:?}");
        println!(
            "cudarc interop, {n} ranks: 20 rounds right, {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn cudarc_memory_is_refused_on_the_host_backend() {
    // Needs a cudarc stream, so a driver.
    if oxccl::backend::cuda::device_or_skip("cudarc_memory_is_refused_on_the_host_backend")
        .is_none()
    {
        return;
    }
    let ctx = CudaContext::new(0).expect("context");
    let stream = ctx.default_stream();
    let send = stream.clone_htod(&[1.0f32; 4]).expect("htod");
    let mut recv = stream.alloc_zeros::<f32>(4).expect("alloc");
    let comms = oxccl::init_all_with(
        1,
        Config {
            backend: BackendKind::Host,
            ..Config::default()
        },
    )
    .expect("host");
    let e = comms[0]
        .collective_on(
            CollKind::AllReduce,
            &send,
            &mut recv,
            RedOp::Sum,
            0,
            &stream,
        )
        .unwrap_err();
    assert!(e.to_string().contains("CUDA backend"), "{e}");
}
