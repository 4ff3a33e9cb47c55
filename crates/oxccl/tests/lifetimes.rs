//! Buffer lifetimes and call sequences as a new user writes them: buffers
//! made fresh for every call and dropped right after it, results read
//! after each call.
//!
//! - `*_freed_memory_waits_for_its_work`: drop a buffer right after a
//!   collective was enqueued on it, allocate again at once: the new
//!   buffer must read as zero (nothing of the old call lands in it) and
//!   the peers' results of the old call must be right (nothing of the new
//!   buffer's contents leaks into what they read).
//! - `*_random_collectives_on_fresh_buffers`: random AllReduce, Broadcast,
//!   AllGather and ReduceScatter calls of 1 to 300 000 f32 on fresh
//!   buffers, every result checked; on CUDA 2, 3 and 8 ranks, 2 000 calls
//!   each (it hung within 60 calls on 2 ranks before the fix).
//!
//! The host backend runs short versions (CI); the CUDA versions say
//! `skipped: no CUDA device` without a driver and fail instead under
//! `OXCCL_REQUIRE_GPU=1`. `OXCCL_GPU_RANKS` (e.g. `2,3,8`),
//! `OXCCL_LOOP_CALLS` and `OXCCL_UAF_ITERS` size the CUDA runs.

mod common;

use std::time::Duration;

use oxccl::{BackendKind, Communicator, Config, RedOp};

/// CUDA communicators, or `None` (with the skip line) when this machine
/// has no CUDA device (a failure instead under `OXCCL_REQUIRE_GPU=1`).
fn cuda(test: &str, n: u32) -> Option<Vec<Communicator>> {
    oxccl::backend::cuda::device_or_skip(test)?;
    let base = Config::from_env().expect("configuration from the environment");
    let cfg = Config {
        backend: BackendKind::Cuda,
        // A lost rank shows up as a timeout naming it within seconds, not
        // as a five-minute stall; the calls themselves take milliseconds.
        deadline: Duration::from_secs(20),
        ..base
    };
    Some(oxccl::init_all_with(n, cfg).expect("CUDA communicators"))
}

fn env_list(var: &str, default: &[u32]) -> Vec<u32> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn env_num(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `body` on every rank's thread; on the first error every rank is
/// aborted (so none waits for a peer that stopped) and the errors are
/// returned as `rank: message` lines.
fn on_every_rank(
    comms: &[Communicator],
    body: impl Fn(&Communicator) -> Result<(), String> + Sync,
) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let body = &body;
                s.spawn(move || {
                    let r = body(c);
                    if r.is_err() {
                        c.abort();
                    }
                    r.map_err(|e| format!("rank {}: {e}", c.rank()))
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())).err())
            .collect()
    })
}

/// The first index where `got` differs from `want`, described.
fn mismatch(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} of {} is {}, expected {}",
            got.len(),
            got[i],
            want[i]
        )),
    }
}

/// Rank `r`'s contribution to call `k`: small integers, so every sum is
/// exact in f32 whatever the order.
fn contribution(r: u32, k: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i % 13) + r as usize * 3 + k % 5) as f32)
        .collect()
}

/// A tiny deterministic generator: every rank draws the same sequence.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
}

/// The result rank `r` of `n` must get from call `k` of kind `kind` on
/// `count` elements (per rank; AllGather's output and ReduceScatter's
/// input are `n × count`).
fn expected(kind: Kind, n: u32, r: u32, k: usize, count: usize) -> Vec<f32> {
    let sum = |len: usize| -> Vec<f32> {
        let mut acc = vec![0.0f32; len];
        for q in 0..n {
            for (a, v) in acc.iter_mut().zip(contribution(q, k, len)) {
                *a += v;
            }
        }
        acc
    };
    match kind {
        Kind::AllReduce => sum(count),
        Kind::Broadcast => contribution(k as u32 % n, k, count),
        Kind::AllGather => (0..n).flat_map(|q| contribution(q, k, count)).collect(),
        Kind::ReduceScatter => sum(n as usize * count)[r as usize * count..][..count].to_vec(),
    }
}

/// One call of the random loop on fresh buffers; returns what this rank
/// received.
fn one_call(c: &Communicator, kind: Kind, k: usize, count: usize) -> oxccl::Result<Vec<f32>> {
    let (n, r) = (c.nranks(), c.rank());
    let (send_len, recv_len) = match kind {
        Kind::AllReduce | Kind::Broadcast => (count, count),
        Kind::AllGather => (count, n as usize * count),
        Kind::ReduceScatter => (n as usize * count, count),
    };
    let send = c.alloc::<f32>(send_len)?;
    let recv = c.alloc::<f32>(recv_len)?;
    send.copy_from_slice(&contribution(r, k, send_len))?;
    match kind {
        Kind::AllReduce => c.all_reduce(&send, &recv, RedOp::Sum)?,
        Kind::Broadcast => c.broadcast(&send, &recv, k as u32 % n)?,
        Kind::AllGather => c.all_gather(&send, &recv)?,
        Kind::ReduceScatter => c.reduce_scatter(&send, &recv, RedOp::Sum)?,
    }
    recv.to_vec()
}

/// `calls` random calls (same sequence on every rank), each result checked.
/// Diagnostics: `OXCCL_LOOP_FROM=k` runs only calls k.. (on a fresh
/// communicator: is one call enough to fail?), `OXCCL_LOOP_TRACE=1` prints
/// every call's choice and host time per rank.
fn random_loop(comms: &[Communicator], calls: usize, max_count: u64, seed: u64) -> Vec<String> {
    let n = comms.len() as u32;
    let from = env_num("OXCCL_LOOP_FROM", 0);
    let trace = std::env::var("OXCCL_LOOP_TRACE").as_deref() == Ok("1");
    on_every_rank(comms, |c| {
        let mut rng = Rng(seed);
        for k in 0..calls {
            let kind = [
                Kind::AllReduce,
                Kind::Broadcast,
                Kind::AllGather,
                Kind::ReduceScatter,
            ][rng.below(4) as usize];
            let count = 1 + rng.below(max_count) as usize;
            if k < from {
                continue;
            }
            let t = std::time::Instant::now();
            let got = one_call(c, kind, k, count);
            let choice = c.last_choice().map(|ch| ch.to_string()).unwrap_or_default();
            if trace {
                eprintln!(
                    "rank {} call {k} {kind:?} {count}: {:?} [{choice}]",
                    c.rank(),
                    t.elapsed()
                );
            }
            let got = got.map_err(|e| {
                format!(
                    "call {k} ({kind:?}, {count} f32, {choice}) after {:?}: {e}",
                    t.elapsed()
                )
            })?;
            let want = expected(kind, n, c.rank(), k, count);
            mismatch(
                &format!(
                    "call {k} ({kind:?}, {count} f32, {choice}) after {:?}",
                    t.elapsed()
                ),
                &got,
                &want,
            )?;
        }
        Ok(())
    })
}

/// Drops buffers right after enqueuing calls on them and allocates again
/// at once, `iters` times, on `len`-element buffers.
fn reuse_loop(comms: &[Communicator], iters: usize, len: usize) -> Vec<String> {
    let n = comms.len() as u32;
    on_every_rank(comms, |c| {
        let r = c.rank();
        fn e(what: &'static str, it: usize) -> impl Fn(oxccl::Error) -> String {
            move |err| format!("{what} (iteration {it}): {err}")
        }
        for it in 0..iters {
            // This rank's kernel writes `a` (and, on registered plans, so
            // do the peers') after `drop` returned it.
            let a = c.alloc::<f32>(len).map_err(e("alloc a", it))?;
            a.copy_from_slice(&vec![r as f32 + 1.0; len])
                .map_err(e("fill a", it))?;
            c.all_reduce_in_place(&a, RedOp::Sum)
                .map_err(e("all_reduce", it))?;
            drop(a);
            let b = c.alloc::<f32>(len).map_err(e("alloc b", it))?;
            // Peers read `src` (registered all-pairs AllGather pushes or
            // pulls it) after `drop` returned it; `junk` may reuse it.
            let m = len / 64;
            let src = c.alloc::<f32>(m).map_err(e("alloc src", it))?;
            let dst = c.alloc::<f32>(n as usize * m).map_err(e("alloc dst", it))?;
            src.copy_from_slice(&vec![r as f32 + 1.0; m])
                .map_err(e("fill src", it))?;
            c.all_gather(&src, &dst).map_err(e("all_gather", it))?;
            drop(src);
            let junk = c.alloc::<f32>(m).map_err(e("alloc junk", it))?;
            junk.copy_from_slice(&vec![-7.0; m])
                .map_err(e("fill junk", it))?;
            c.synchronize().map_err(e("synchronize", it))?;
            let fresh = b.to_vec().map_err(e("read b", it))?;
            if let Some(i) = fresh.iter().position(|x| x.to_bits() != 0) {
                return Err(format!(
                    "iteration {it}: a fresh buffer of {len} f32 holds {} at element {i} \
                     (alloc promises zeros: freed memory was reused while a kernel wrote it)",
                    fresh[i]
                ));
            }
            let want: Vec<f32> = (0..n).flat_map(|q| vec![q as f32 + 1.0; m]).collect();
            let got = dst.to_vec().map_err(e("read dst", it))?;
            mismatch(&format!("iteration {it}: all_gather"), &got, &want)?;
        }
        Ok(())
    })
}

fn assert_clean(what: &str, errs: Vec<String>) {
    assert!(errs.is_empty(), "{what}:\n{}", errs.join("\n"));
}

#[test]
fn the_checks_can_fail() {
    // The comparison reports a zeroed, a doubled and a rank-dropped result.
    let (n, k, count) = (3, 4, 37);
    for kind in [
        Kind::AllReduce,
        Kind::Broadcast,
        Kind::AllGather,
        Kind::ReduceScatter,
    ] {
        let want = expected(kind, n, 1, k, count);
        assert!(mismatch("ok", &want, &want).is_ok());
        let zeroed = vec![0.0; want.len()];
        assert!(mismatch("zeroed", &zeroed, &want).is_err(), "{kind:?}");
        let doubled: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
        assert!(mismatch("doubled", &doubled, &want).is_err(), "{kind:?}");
        let dropped = expected(kind, n - 1, 1, k, count);
        assert!(
            mismatch("dropped", &dropped, &want).is_err(),
            "{kind:?}: a rank's contribution missing must show"
        );
    }
    assert!(mismatch("short", &[1.0], &[1.0, 2.0]).is_err());
}

#[test]
fn host_freed_memory_waits_for_its_work() {
    for n in [2, 3] {
        assert_clean("host reuse", reuse_loop(&common::host(n), 20, 4096));
    }
}

#[test]
fn host_random_collectives_on_fresh_buffers() {
    for n in [2, 3] {
        assert_clean(
            "host random loop",
            random_loop(&common::host(n), 40, 3000, 0x9e37_79b9_7f4a_7c15),
        );
    }
}

#[test]
fn cuda_freed_memory_waits_for_its_work() {
    let iters = env_num("OXCCL_UAF_ITERS", 60);
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_freed_memory_waits_for_its_work", n) else {
            return;
        };
        let t = std::time::Instant::now();
        let errs = reuse_loop(&comms, iters, 16 << 20);
        println!(
            "reuse loop: {n} ranks, {iters} iterations of 16 Mi f32: {} failed rank(s), {:?}",
            errs.len(),
            t.elapsed()
        );
        assert_clean(&format!("cuda reuse, {n} ranks"), errs);
    }
}

#[test]
fn cuda_random_collectives_on_fresh_buffers() {
    let calls = env_num("OXCCL_LOOP_CALLS", 2000);
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_random_collectives_on_fresh_buffers", n) else {
            return;
        };
        let t = std::time::Instant::now();
        let errs = random_loop(&comms, calls, 300_000, 0x2545_f491_4f6c_dd1d + u64::from(n));
        println!(
            "random loop: {n} ranks, {calls} calls: {} failed rank(s), {:?}",
            errs.len(),
            t.elapsed()
        );
        assert_clean(&format!("cuda random loop, {n} ranks"), errs);
    }
}
