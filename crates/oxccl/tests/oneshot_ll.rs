//! The one-step LL AllReduce (`ll1`) forced, one generic body for every
//! backend: host always (ranks as threads), CUDA when a device is there
//! (else `skipped: no CUDA device`, a failure under `OXCCL_REQUIRE_GPU=1`).
//!
//! Every dtype and op at counts up to the path's payload limit, out of
//! place and in place, against the sequential reference and bitwise
//! across ranks; a call past the limit runs the FIFO one-shot instead;
//! hundreds of consecutive calls with random delays per rank (so both
//! parities of the slots are reused while peers run ahead or behind);
//! the launch counters say every call took the path.

use oxccl::core::testkit::{self, OPS};
use oxccl::core::{with_dtype, Collective};
use oxccl::{Algo, BackendKind, CollKind, Communicator, Config, DataType, Element, RedOp};

mod common;

/// The payload limit the tests set (small, so the host runs them fast;
/// the path's logic does not depend on it).
const CAP: usize = 4096;

fn config(backend: BackendKind) -> Config {
    let mut c = Config::builder()
        .backend(backend)
        .algorithms_for(CollKind::AllReduce, &[Algo::OneShotLl])
        .build()
        .unwrap();
    c.ll1_bytes = CAP;
    c
}

/// Calls on the path so far, all ranks together.
fn ll1_calls(comms: &[Communicator]) -> u64 {
    comms[0]
        .launch_counts()
        .expect("the backend counts its calls")
        .oneshot_ll_calls
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// One AllReduce of `count` elements on every rank (rank r sleeping
/// `delay(r)` µs first); the outputs in rank order, after checking every
/// rank ran `want`.
fn all_reduce<T: Element>(
    comms: &[Communicator],
    inputs: &[Vec<T>],
    op: RedOp,
    in_place: bool,
    delay: &(dyn Fn(u32) -> u64 + Sync),
    want: Algo,
) -> Vec<Vec<T>> {
    common::on_ranks(comms, |c| {
        let input = &inputs[c.rank() as usize];
        std::thread::sleep(std::time::Duration::from_micros(delay(c.rank())));
        let recv = c.alloc::<T>(input.len()).unwrap();
        let send;
        let r = if in_place {
            recv.copy_from_slice(input).unwrap();
            let all = recv.slice(0..input.len());
            c.collective(CollKind::AllReduce, all, all, op, 0)
        } else {
            send = c.alloc::<T>(input.len()).unwrap();
            send.copy_from_slice(input).unwrap();
            c.collective(CollKind::AllReduce, &send, &recv, op, 0)
        };
        if let Err(e) = r {
            panic!("rank {}: AllReduce failed: {e}", c.rank());
        }
        c.synchronize().unwrap();
        // One rank in place moves nothing and chooses nothing.
        let ran = c.last_choice().map(|ch| ch.algo);
        let moved = c.nranks() > 1 || !in_place || matches!(op, RedOp::PreMulSum(_));
        assert!(
            !moved || ran == Some(want),
            "rank {} of {} ran {ran:?}, {} elements of {}",
            c.rank(),
            c.nranks(),
            input.len(),
            std::any::type_name::<T>()
        );
        recv.to_vec().unwrap()
    })
}

/// Wrong elements against the reference, or the ranks' outputs differing
/// in any bit, as a failure line.
fn check<T: Element>(
    what: &str,
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
    op: RedOp,
) -> Option<String> {
    let coll = Collective::new(CollKind::AllReduce, inputs[0].len(), 0);
    let (wrong, first) = testkit::compare(&coll, inputs, outputs, op);
    if wrong > 0 {
        return Some(format!(
            "{what}: {wrong} wrong, {}",
            first.unwrap_or_default()
        ));
    }
    let bits = |v: &Vec<T>| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
    let differs = outputs.iter().position(|o| {
        o.len() != outputs[0].len() || o.iter().zip(&outputs[0]).any(|(a, b)| !a.bits_eq(*b))
    });
    differs.map(|r| {
        format!(
            "{what}: rank {r}'s result differs from rank 0's ({:?} vs {:?})",
            &bits(&outputs[r])[..4.min(outputs[r].len())],
            &bits(&outputs[0])[..4.min(outputs[0].len())]
        )
    })
}

fn inputs<T: Element>(n: u32, count: usize, op: RedOp, seed: u64) -> Vec<Vec<T>> {
    let coll = Collective::new(CollKind::AllReduce, count, 0);
    (0..n)
        .map(|r| testkit::input::<T>(&coll, n, r, op, seed))
        .collect()
}

/// Every dtype × op × in place at counts up to the limit, on the path;
/// one count past it, on the FIFO one-shot.
fn every_case(comms: &[Communicator]) {
    let n = comms.len() as u32;
    let mut failures = Vec::new();
    let mut on_path = 0u64;
    let before = ll1_calls(comms);
    let none = |_| 0;
    for dt in DataType::ALL {
        let most = CAP / dt.size();
        for &op in OPS.iter().filter(|o| o.undefined_reason(dt).is_none()) {
            for in_place in [false, true] {
                for count in [1, 3, 37, most - 1, most] {
                    let what = format!("{n} ranks {dt} {op} {count} in_place={in_place}");
                    let f = with_dtype!(dt, T => {
                        let ins = inputs::<T>(n, count, op, 11);
                        let outs = all_reduce(comms, &ins, op, in_place, &none, Algo::OneShotLl);
                        check(&what, &ins, &outs, op)
                    });
                    failures.extend(f);
                    on_path += 1;
                }
            }
        }
        // Past the limit: the FIFO one-shot, still right.
        let what = format!("{n} ranks {dt} {} past the limit", most + 1);
        let f = with_dtype!(dt, T => {
            let ins = inputs::<T>(n, most + 1, RedOp::Sum, 12);
            let outs = all_reduce(comms, &ins, RedOp::Sum, false, &none, Algo::OneShot);
            check(&what, &ins, &outs, RedOp::Sum)
        });
        failures.extend(f);
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let ran = ll1_calls(comms) - before;
    if n > 1 {
        assert_eq!(ran, on_path * u64::from(n), "calls on the path, {n} ranks");
    } else {
        // One rank may copy without running anything.
        assert!(ran <= on_path, "{ran} calls counted for {on_path}");
    }
}

/// `calls` consecutive AllReduces of random sizes (the same sequence on
/// every rank), each rank sleeping a random time before some of them, so
/// ranks run up to a call ahead of each other on both slot parities.
fn consecutive_calls(comms: &[Communicator], calls: usize, max_delay_us: u64) {
    let n = comms.len() as u32;
    let mut sizes = Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    for i in 0..calls {
        let count = 1 + (sizes.next() as usize) % (CAP / 4);
        let seed = i as u64;
        let delay = move |r: u32| {
            let mut g = Rng((seed + 1).wrapping_mul(0x1000_0000_01b3) ^ u64::from(r + 1));
            let d = g.next();
            if d.is_multiple_of(3) {
                d % (max_delay_us + 1)
            } else {
                0
            }
        };
        let op = if i % 2 == 0 { RedOp::Sum } else { RedOp::Max };
        let ins = inputs::<f32>(n, count, op, seed);
        let outs = all_reduce(comms, &ins, op, i % 5 == 0, &delay, Algo::OneShotLl);
        failures.extend(check(
            &format!("call {i}: {count} f32 {op}"),
            &ins,
            &outs,
            op,
        ));
        // Also without a host join between calls: the next call's stores
        // may reach a peer still reading this one's other parity.
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Back to back with no join between calls: each rank issues `calls`
/// AllReduces in a row on its own thread, then all results are checked.
fn back_to_back(comms: &[Communicator], calls: usize) {
    let n = comms.len() as u32;
    let count = 257;
    let ins: Vec<Vec<Vec<i32>>> = (0..calls)
        .map(|i| inputs::<i32>(n, count, RedOp::Sum, 100 + i as u64))
        .collect();
    let outs: Vec<Vec<Vec<i32>>> = common::on_ranks(comms, |c| {
        let r = c.rank() as usize;
        let bufs: Vec<_> = (0..calls)
            .map(|i| {
                let send = c.alloc::<i32>(count).unwrap();
                send.copy_from_slice(&ins[i][r]).unwrap();
                let recv = c.alloc::<i32>(count).unwrap();
                c.collective(CollKind::AllReduce, &send, &recv, RedOp::Sum, 0)
                    .unwrap();
                (send, recv)
            })
            .collect();
        c.synchronize().unwrap();
        bufs.iter()
            .map(|(_, recv)| recv.to_vec().unwrap())
            .collect()
    });
    let mut failures = Vec::new();
    for i in 0..calls {
        let per_rank: Vec<Vec<i32>> = outs.iter().map(|o| o[i].clone()).collect();
        failures.extend(check(
            &format!("call {i} of a run"),
            &ins[i],
            &per_rank,
            RedOp::Sum,
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// PreMulSum with a different factor on every rank (NCCL's factor is the
/// calling rank's own): each contribution is scaled by its sender's
/// factor, whatever rank reduces it. Half-integers, so every sum is exact.
fn per_rank_factors(comms: &[Communicator]) {
    let n = comms.len();
    let count = CAP / 4 - 3;
    let factor = |r: usize| 0.5 * (r as f64 + 1.0);
    let ins: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            (0..count)
                .map(|i| ((i * 7 + r * 3) % 23) as f32 - 11.0)
                .collect()
        })
        .collect();
    let outs = common::on_ranks(comms, |c| {
        let r = c.rank() as usize;
        let send = c.alloc::<f32>(count).unwrap();
        send.copy_from_slice(&ins[r]).unwrap();
        let recv = c.alloc::<f32>(count).unwrap();
        c.collective(
            CollKind::AllReduce,
            &send,
            &recv,
            RedOp::PreMulSum(factor(r)),
            0,
        )
        .unwrap();
        c.synchronize().unwrap();
        let ran = c.last_choice().map(|ch| ch.algo);
        assert_eq!(ran, Some(Algo::OneShotLl), "rank {r} of {n}");
        recv.to_vec().unwrap()
    });
    let want: Vec<f32> = (0..count)
        .map(|i| (0..n).fold(0.0f32, |acc, r| acc + ins[r][i] * factor(r) as f32))
        .collect();
    for (r, out) in outs.iter().enumerate() {
        let wrong = out.iter().zip(&want).filter(|(a, b)| a != b).count();
        let first = out.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            wrong,
            0,
            "{n} ranks, rank {r}: {wrong} wrong, first at {first:?}: {:?} want {:?}",
            first.map(|i| out[i]),
            first.map(|i| want[i])
        );
    }
}

fn body(comms: &[Communicator], calls: usize) {
    let n = comms.len();
    let t = std::time::Instant::now();
    per_rank_factors(comms);
    every_case(comms);
    eprintln!(
        "{n} ranks: every case in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    consecutive_calls(comms, calls, 300);
    back_to_back(comms, 64);
    eprintln!("{n} ranks: done in {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn host_oneshot_ll() {
    for n in [1, 2, 3, 8] {
        let comms = oxccl::init_all_with(n, config(BackendKind::Host)).unwrap();
        body(&comms, 300);
    }
}

#[test]
fn cuda_oneshot_ll() {
    if oxccl::backend::cuda::device_or_skip("cuda_oneshot_ll").is_none() {
        return;
    }
    // Fewer rank counts than the host's: each case allocates and frees
    // device memory on every rank (3 ranks run in the device suite).
    for n in [2, 8] {
        let comms = oxccl::init_all_with(n, config(BackendKind::Cuda)).expect("CUDA communicators");
        body(&comms, 500);
    }
}

/// Unforced, a backend without a priced path never picks `ll1`; the
/// host's is served only when forced.
#[test]
fn host_selector_leaves_ll1_unpicked() {
    let comms = common::host(4);
    for bytes in [8usize, 1024, 64 << 10] {
        let c = comms[0].choice_for(CollKind::AllReduce, bytes / 4, DataType::F32);
        let algo = c.map(|c| c.algo);
        assert_ne!(algo.ok(), Some(Algo::OneShotLl), "{bytes} B");
    }
}
