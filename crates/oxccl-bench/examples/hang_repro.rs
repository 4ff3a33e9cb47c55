//! Reproduces the random-collective hang on fresh buffers by putting back, one at a
//! time, the host-side steps the buffer allocation made before ff38a77,
//! and names the step that waited for a peer's spinning kernel.
//!
//! `hang_repro MODE [RANKS] [CALLS]`: RANKS threads on the CUDA backend run
//! CALLS AllReduce calls of 1 to 300 000 f32 on fresh buffers, each result
//! read and checked (as `tests/lifetimes.rs` does), with a 3 s deadline.
//! After each `alloc`, MODE adds what the old `World::alloc` did:
//!
//! - `none`: nothing (today's code: the zeroing is enqueued on the rank's
//!   stream and the host does not wait);
//! - `side-memset`: `cuMemsetD8Async` of the buffer on a separate
//!   non-blocking stream, then `cuStreamSynchronize` of that stream (the
//!   old code's zeroing on the device's setup stream);
//! - `legacy-memset`: `cuMemsetD8` (legacy stream) then
//!   `cuStreamSynchronize(NULL)` (the old `DevMem::zeroed` of a new
//!   allocation);
//! - `side-copy`: a pageable `cuMemcpyHtoDAsync` of zeros over the buffer
//!   on the separate stream, then its synchronisation (the same host wait
//!   with a copy-engine transfer instead of a memset kernel: a control).
//!
//! Each line reports calls completed, the first error and the longest
//! time the added step held a rank's thread: a step that waited for a
//! peer's kernel shows about the deadline.

use std::time::{Duration, Instant};

use cudarc::driver::sys;
use oxccl::{BackendKind, Communicator, Config, RedOp};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    None,
    SideMemset,
    LegacyMemset,
    SideCopy,
}

fn ck(what: &str, r: sys::CUresult) -> Result<(), String> {
    r.result().map_err(|e| format!("{what}: {e:?}"))
}

/// The step MODE adds after an allocation of `bytes` at `ptr`.
fn old_step(mode: Mode, side: sys::CUstream, ptr: u64, bytes: usize) -> Result<(), String> {
    // SAFETY: `ptr` is a live allocation of `bytes` bytes from
    // `comm.alloc` on this thread's current context; `side` is a live
    // stream of it; the zero source outlives the synchronisation.
    unsafe {
        match mode {
            Mode::None => Ok(()),
            Mode::SideMemset => {
                ck("cuMemsetD8Async", sys::cuMemsetD8Async(ptr, 0, bytes, side))?;
                ck("cuStreamSynchronize", sys::cuStreamSynchronize(side))
            }
            Mode::LegacyMemset => {
                ck("cuMemsetD8", sys::cuMemsetD8_v2(ptr, 0, bytes))?;
                ck(
                    "cuStreamSynchronize",
                    sys::cuStreamSynchronize(std::ptr::null_mut()),
                )
            }
            Mode::SideCopy => {
                let zeros = vec![0u8; bytes];
                ck(
                    "cuMemcpyHtoDAsync",
                    sys::cuMemcpyHtoDAsync_v2(ptr, zeros.as_ptr().cast(), bytes, side),
                )?;
                ck("cuStreamSynchronize", sys::cuStreamSynchronize(side))
            }
        }
    }
}

struct Outcome {
    calls: usize,
    error: Option<String>,
    longest_step: Duration,
}

fn rank_loop(c: &Communicator, mode: Mode, side: sys::CUstream, calls: usize) -> Outcome {
    let (n, r) = (c.nranks(), c.rank());
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut longest_step = Duration::ZERO;
    for k in 0..calls {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let count = 1 + (rng % 300_000) as usize;
        let mut run = || -> Result<(), String> {
            let send = c.alloc::<f32>(count).map_err(|e| e.to_string())?;
            let recv = c.alloc::<f32>(count).map_err(|e| e.to_string())?;
            for b in [&send, &recv] {
                let t = Instant::now();
                old_step(mode, side, b.full().addr(), count * 4)?;
                longest_step = longest_step.max(t.elapsed());
            }
            let mine: Vec<f32> = (0..count).map(|i| ((i % 13) as u32 + r) as f32).collect();
            send.copy_from_slice(&mine).map_err(|e| e.to_string())?;
            c.all_reduce(&send, &recv, RedOp::Sum)
                .map_err(|e| e.to_string())?;
            let got = recv.to_vec().map_err(|e| e.to_string())?;
            let want = |i: usize| (0..n).map(|q| ((i % 13) as u32 + q) as f32).sum::<f32>();
            match (0..count).find(|&i| got[i] != want(i)) {
                Some(i) => Err(format!("element {i} is {}, expected {}", got[i], want(i))),
                None => Ok(()),
            }
        };
        if let Err(e) = run() {
            c.abort();
            return Outcome {
                calls: k,
                error: Some(format!("call {k} ({count} f32): {e}")),
                longest_step,
            };
        }
    }
    Outcome {
        calls,
        error: None,
        longest_step,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = match args.get(1).map(String::as_str) {
        Some("none") => Mode::None,
        Some("side-memset") => Mode::SideMemset,
        Some("legacy-memset") => Mode::LegacyMemset,
        Some("side-copy") => Mode::SideCopy,
        _ => {
            eprintln!("usage: hang_repro none|side-memset|legacy-memset|side-copy [RANKS] [CALLS]");
            std::process::exit(2);
        }
    };
    let n: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let calls: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(200);
    if oxccl::backend::cuda::device_or_skip("hang_repro").is_none() {
        return;
    }
    let cfg = Config {
        backend: BackendKind::Cuda,
        deadline: Duration::from_secs(3),
        ..Config::from_env().expect("configuration")
    };
    let comms = oxccl::init_all_with(n, cfg).expect("CUDA communicators");
    // Made after the communicators, in their context: like the old setup
    // stream, a non-blocking stream no rank's kernel runs on.
    let ctx = oxccl_cuda::driver::Ctx::new(0).expect("context");
    let mut side = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the stream lives to the end of the process.
    unsafe { ck("cuStreamCreate", sys::cuStreamCreate(&mut side, 1)).expect("side stream") };
    let side = side as usize;
    let t = Instant::now();
    let outs: Vec<Outcome> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let ctx = &ctx;
                s.spawn(move || {
                    ctx.bind().expect("bind");
                    rank_loop(c, mode, side as sys::CUstream, calls)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let done = outs.iter().map(|o| o.calls).min().unwrap_or(0);
    let longest = outs
        .iter()
        .map(|o| o.longest_step)
        .max()
        .unwrap_or_default();
    let first = outs.iter().find_map(|o| o.error.clone());
    println!(
        "hang_repro {mode:?}, {n} ranks: {done}/{calls} calls right in {:.1?}; longest added step {:.1?}; {}",
        t.elapsed(),
        longest,
        first.unwrap_or_else(|| "no error".into())
    );
}
