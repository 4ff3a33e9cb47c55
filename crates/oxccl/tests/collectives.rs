//! Every collective × dtype × op × in-place through the Communicator API,
//! one generic body for every backend: host always, CUDA when a device is
//! there (else it prints `skipped: no CUDA device`, and fails under
//! `OXCCL_REQUIRE_GPU=1`).

use oxccl::core::testkit::{self, COLLECTIVES, OPS};
use oxccl::core::{with_dtype, Collective};
use oxccl::{CollKind, Communicator, DataType, Element, RedOp};

mod common;
use common::host;

/// Runs one case on every rank; returns the number of wrong elements and
/// the first difference.
fn run_case<T: Element>(
    comms: &[Communicator],
    kind: CollKind,
    count: usize,
    op: RedOp,
    root: u32,
    in_place: bool,
) -> (u64, Option<String>) {
    let n = comms.len() as u32;
    let coll = Collective::new(kind, count, root);
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input::<T>(&coll, n, r, op, 7))
        .collect();
    let outputs: Vec<Vec<T>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let input = &inputs[c.rank() as usize];
                s.spawn(move || run_rank(c, &coll, input, op, in_place))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    testkit::compare(&coll, &inputs, &outputs, op)
}

/// One rank's call, on buffers from the communicator (both backends).
fn run_rank<T: Element>(
    c: &Communicator,
    coll: &Collective,
    input: &[T],
    op: RedOp,
    in_place: bool,
) -> Vec<T> {
    let n = c.nranks();
    let (ilen, olen) = (coll.input_len(n), coll.output_len(n));
    let (in_off, out_off) = coll.in_place_offsets(c.rank());
    let res;
    let out;
    if in_place {
        let buf = c.alloc::<T>(ilen.max(olen)).unwrap();
        buf.slice(in_off..in_off + ilen)
            .copy_from_slice(input)
            .unwrap();
        let send = buf.slice(in_off..in_off + ilen);
        let recv = buf.slice(out_off..out_off + olen);
        res = c.collective(coll.kind, send, recv, op, coll.root);
        c.synchronize().unwrap();
        out = recv.to_vec().unwrap();
    } else {
        let send = c.alloc::<T>(ilen).unwrap();
        let recv = c.alloc::<T>(olen).unwrap();
        send.copy_from_slice(input).unwrap();
        res = c.collective(coll.kind, &send, &recv, op, coll.root);
        c.synchronize().unwrap();
        out = recv.to_vec().unwrap();
    }
    if let Err(e) = res {
        panic!("rank {}: {} failed: {e}", c.rank(), coll.kind);
    }
    out
}

/// The generic body: every case on `comms`.
fn all_cases(comms: &[Communicator], count: usize) {
    let n = comms.len() as u32;
    let mut failures = Vec::new();
    let mut cases = 0;
    for kind in COLLECTIVES {
        let ops: &[RedOp] = if kind.is_reduction() { &OPS } else { &OPS[..1] };
        for dt in DataType::ALL {
            for &op in ops.iter().filter(|o| o.undefined_reason(dt).is_none()) {
                for in_place in [false, true] {
                    let root = if kind.has_root() { n - 1 } else { 0 };
                    let (wrong, first) =
                        with_dtype!(dt, T => run_case::<T>(comms, kind, count, op, root, in_place));
                    cases += 1;
                    if wrong > 0 {
                        failures.push(format!(
                            "{kind} {dt} {op} in_place={in_place}: {wrong} wrong, {}",
                            first.unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    assert!(cases > 500, "ran {cases} cases");
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed on {n} ranks:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn host_every_case_3_ranks() {
    all_cases(&host(3), 37);
}

#[test]
fn host_every_case_4_ranks() {
    all_cases(&host(4), 1000);
}

#[test]
fn host_every_case_1_rank() {
    all_cases(&host(1), 5);
}

/// One rank in place runs no plan (the output is the input) except for
/// PreMulSum, which scales it; out of place it copies. Every collective
/// in place leaves the buffer as it was, checked element by element, and
/// no plan is chosen for it (`last_choice` stays empty), so a copy of the
/// buffer onto itself (a whole buffer through one block on a GPU) cannot
/// come back unnoticed.
fn one_rank_in_place_runs_nothing(c: &Communicator) {
    let data: Vec<f32> = (0..4096).map(|i| (i % 97) as f32 - 40.0).collect();
    let buf = c.alloc::<f32>(data.len()).unwrap();
    buf.copy_from_slice(&data).unwrap();
    let plans = || {
        let l = c.launch_counts().expect("the backend counts its plans");
        l.kernels + l.copy_engine_calls
    };
    let before = plans();
    for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
        c.all_reduce(&buf, &buf, op).unwrap();
        assert_eq!(buf.to_vec().unwrap(), data, "{op:?}");
    }
    c.reduce(&buf, &buf, RedOp::Sum, 0).unwrap();
    c.broadcast(&buf, &buf, 0).unwrap();
    c.all_gather(&buf, &buf).unwrap();
    c.reduce_scatter(&buf, &buf, RedOp::Max).unwrap();
    c.all_to_all(&buf, &buf).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    // A group of in-place calls, and one with a copy beside them: only
    // the copy runs.
    let other = c.alloc::<f32>(data.len()).unwrap();
    other.copy_from_slice(&data).unwrap();
    oxccl::group(|g| {
        g.all_reduce(c, &buf, &buf, RedOp::Sum)?;
        g.all_reduce(c, &other, &other, RedOp::Min)
    })
    .unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    assert_eq!(other.to_vec().unwrap(), data);
    assert_eq!(c.last_choice(), None, "an in-place call ran a plan");
    assert_eq!(
        plans(),
        before,
        "an in-place call (or group of them) ran a plan"
    );
    let copy = c.alloc::<f32>(data.len()).unwrap();
    oxccl::group(|g| {
        g.all_reduce(c, &buf, &buf, RedOp::Sum)?;
        g.all_gather(c, &other, &copy)
    })
    .unwrap();
    assert_eq!(copy.to_vec().unwrap(), data);
    assert_eq!(plans(), before + 1, "the group's copy");
    c.all_reduce(&buf, &buf, RedOp::PreMulSum(2.0)).unwrap();
    assert_eq!(plans(), before + 2, "PreMulSum must scale");
    let twice: Vec<f32> = data.iter().map(|x| 2.0 * x).collect();
    assert_eq!(buf.to_vec().unwrap(), twice);
    assert!(c.last_choice().is_some(), "PreMulSum must scale");
    let out = c.alloc::<f32>(data.len()).unwrap();
    c.all_reduce(&buf, &out, RedOp::Sum).unwrap();
    assert_eq!(out.to_vec().unwrap(), twice);
}

#[test]
fn host_one_rank_in_place_runs_nothing() {
    one_rank_in_place_runs_nothing(&host(1)[0]);
}

#[test]
fn cuda_one_rank_in_place_runs_nothing() {
    let Some(comms) = common::cuda("cuda_one_rank_in_place_runs_nothing", 1) else {
        return;
    };
    one_rank_in_place_runs_nothing(&comms[0]);
}

/// Every collective, out of and in place, f32 Sum, small counts: the
/// many-ranks check (up to 128 ranks per GPU), fast enough for
/// CI; one wrong element fails it.
fn every_collective_f32(comms: &[Communicator]) {
    let n = comms.len() as u32;
    let mut failures = Vec::new();
    for kind in COLLECTIVES {
        for in_place in [false, true] {
            let root = if kind.has_root() { n - 1 } else { 0 };
            let (wrong, first) = run_case::<f32>(comms, kind, 256, RedOp::Sum, root, in_place);
            if wrong > 0 {
                failures.push(format!(
                    "{kind} in_place={in_place}: {wrong} wrong, {first:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "on {n} ranks:\n{}",
        failures.join("\n")
    );
}

#[test]
fn host_every_collective_128_ranks() {
    every_collective_f32(&host(128));
}

/// 64 ranks on one GPU: more rank streams than hardware queues (the launch
/// gate) and direct plans of 64 sources per step. A 30 s deadline, so a
/// hang fails instead of holding the device.
#[test]
fn cuda_every_collective_64_ranks() {
    if oxccl::backend::cuda::device_or_skip("cuda_every_collective_64_ranks").is_none() {
        return;
    }
    let config = oxccl::Config {
        backend: oxccl::BackendKind::Cuda,
        deadline: std::time::Duration::from_secs(30),
        ..oxccl::Config::default()
    };
    every_collective_f32(&oxccl::init_all_with(64, config).expect("64 CUDA ranks"));
}

#[test]
fn cuda_every_case() {
    let Some(comms) = common::cuda("cuda_every_case", 2) else {
        return;
    };
    all_cases(&comms, 1000);
}

/// The collectives the copy-engine algorithm serves.
const COPIED: [CollKind; 5] = [
    CollKind::Broadcast,
    CollKind::AllGather,
    CollKind::AllToAll,
    CollKind::Gather,
    CollKind::Scatter,
];

/// A configuration forcing the copy-engine algorithm (`NCCL_ALGO` entries
/// `broadcast:ce;allgather:ce;...`) for every collective it serves.
fn copy_engine_config(backend: oxccl::BackendKind) -> oxccl::Config {
    COPIED
        .into_iter()
        .fold(oxccl::Config::builder().backend(backend), |b, k| {
            b.algorithms_for(k, &[oxccl::Algo::CopyEngine])
        })
        .build()
        .unwrap()
}

/// The generic body of the copy-engine algorithm forced: every collective
/// it serves, every type, out of place and in place, on `comm.alloc`
/// buffers; plain slices (not registered) are refused with a typed error
/// on every rank and nothing is written.
fn copy_engine_cases(comms: &[Communicator]) {
    let n = comms.len() as u32;
    let mut failures = Vec::new();
    for kind in COPIED {
        for dt in DataType::ALL {
            for in_place in [false, true] {
                let root = if kind.has_root() { n - 1 } else { 0 };
                let (wrong, first) = with_dtype!(dt, T => run_case::<T>(comms, kind, 1000, RedOp::Sum, root, in_place));
                for c in comms {
                    let choice = c.last_choice();
                    let algo = choice.map(|ch| ch.algo);
                    assert_eq!(algo, Some(oxccl::Algo::CopyEngine), "{kind} ran");
                    // The staged in-place AllToAll runs on the executor:
                    // on every channel, not the copy-engine model's one.
                    if in_place && kind == CollKind::AllToAll && n > 1 {
                        let channels = choice.map(|ch| ch.channels);
                        assert_eq!(channels, Some(c.max_channels()), "{kind} in place");
                    }
                }
                if wrong > 0 {
                    failures.push(format!(
                        "ce {kind} {dt} in_place={in_place}: {wrong} wrong, {}",
                        first.unwrap_or_default()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "on {n} ranks:\n{}",
        failures.join("\n")
    );
    if n > 1 {
        let refused = common::on_ranks(comms, |c| {
            let send = [7.0f32; 16];
            let mut recv = vec![5.0f32; 16 * n as usize];
            let e = c.all_gather(&send[..], &mut recv[..]).unwrap_err();
            (e, recv)
        });
        for (e, after) in refused {
            let m = e.to_string();
            // The host backend refuses the copy-only algorithm on
            // unregistered memory; CUDA refuses host slices before that.
            assert!(
                (matches!(e, oxccl::Error::NoAlgorithm { .. }) && m.contains("unregistered"))
                    || matches!(e, oxccl::Error::ForeignBuffer { .. }),
                "{m}"
            );
            assert!(after.iter().all(|&x| x == 5.0), "a refused call wrote");
        }
    }
}

#[test]
fn host_copy_engine_every_case() {
    for n in [1, 3, 4] {
        let config = copy_engine_config(oxccl::BackendKind::Host);
        copy_engine_cases(&oxccl::init_all_with(n, config).unwrap());
    }
}

/// The copy-engine path on CUDA really runs without SMs: every
/// collective it serves, forced, from 1 B to 8 MiB (odd sizes among
/// them), out of place and in place, on 2, 3 and 8 ranks as threads,
/// checked against the reference; while they run the clique launches no
/// executor kernel and runs one copy-engine call per rank and call (the
/// launch counters), so a silent fallback to the kernel fails the test.
/// Then the in-place AllToAll, staged through scratch and so run on the
/// executor, is still right and is counted as kernels.
#[test]
fn cuda_copy_engine_launches_no_kernel() {
    if oxccl::backend::cuda::device_or_skip("cuda_copy_engine_launches_no_kernel").is_none() {
        return;
    }
    let sizes = [1usize, 7, 1001, 65_537, (1 << 20) + 3, 8 << 20];
    for n in [2u32, 3, 8] {
        let config = copy_engine_config(oxccl::BackendKind::Cuda);
        let comms = oxccl::init_all_with(n, config).expect("CUDA communicators");
        let counts = || {
            comms[0]
                .launch_counts()
                .expect("the CUDA backend counts launches")
        };
        let before = counts();
        let mut calls = 0u64;
        let mut failures = Vec::new();
        let mut check = |what: String, (wrong, first): (u64, Option<String>)| {
            for c in &comms {
                let algo = c.last_choice().map(|ch| ch.algo);
                assert_eq!(algo, Some(oxccl::Algo::CopyEngine), "{what} ran");
            }
            if wrong > 0 {
                failures.push(format!(
                    "{what}: {wrong} wrong, {}",
                    first.unwrap_or_default()
                ));
            }
        };
        for kind in COPIED {
            let root = if kind.has_root() { n - 1 } else { 0 };
            for bytes in sizes {
                for in_place in [false, true] {
                    if in_place && kind == CollKind::AllToAll {
                        continue;
                    }
                    let what = format!("ce {kind} {bytes} B in_place={in_place} on {n} ranks");
                    check(
                        what,
                        run_case::<u8>(&comms, kind, bytes, RedOp::Sum, root, in_place),
                    );
                    calls += u64::from(n);
                }
            }
            // Every element size at an odd count.
            for dt in DataType::ALL {
                let what = format!("ce {kind} {dt} 1001 elements on {n} ranks");
                check(
                    what,
                    with_dtype!(dt, T => run_case::<T>(&comms, kind, 1001, RedOp::Sum, root, false)),
                );
                calls += u64::from(n);
            }
        }
        let after = counts();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert_eq!(
            after.kernels, before.kernels,
            "{n} ranks: executor kernels were launched for copy-engine calls (they fell back \
             to the SMs): {before:?} -> {after:?}"
        );
        assert_eq!(
            after.copy_engine_calls - before.copy_engine_calls,
            calls,
            "{n} ranks: copy-engine calls counted"
        );
        let staged = run_case::<f32>(&comms, CollKind::AllToAll, 4099, RedOp::Sum, 0, true);
        assert_eq!(
            staged.0, 0,
            "in-place AllToAll on the executor: {:?}",
            staged.1
        );
        let last = counts();
        assert_eq!(
            last.kernels - after.kernels,
            u64::from(n),
            "staged AllToAll"
        );
        assert_eq!(last.copy_engine_calls, after.copy_engine_calls);
    }
}

#[test]
fn cuda_copy_engine_every_case() {
    if oxccl::backend::cuda::device_or_skip("cuda_copy_engine_every_case").is_none() {
        return;
    }
    let config = copy_engine_config(oxccl::BackendKind::Cuda);
    copy_engine_cases(&oxccl::init_all_with(4, config).expect("CUDA communicators"));
}

#[test]
fn host_plain_slices_and_in_place_forms() {
    let comms = host(4);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let r = c.rank() as f32;
                let send = vec![r; 10];
                let mut recv = vec![0.0f32; 10];
                c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
                assert_eq!(recv, vec![6.0; 10]);
                let mut v = vec![r + 1.0; 10];
                c.all_reduce_in_place(&mut v, RedOp::Max).unwrap();
                assert_eq!(v, vec![4.0; 10]);
                let mut g = vec![0i32; 8];
                g[2 * c.rank() as usize] = c.rank() as i32;
                g[2 * c.rank() as usize + 1] = 10 + c.rank() as i32;
                c.all_gather_in_place(&mut g).unwrap();
                assert_eq!(g, vec![0, 10, 1, 11, 2, 12, 3, 13]);
                let mut rs = vec![1u8; 8];
                c.reduce_scatter_in_place(&mut rs, RedOp::Sum).unwrap();
                let me = 2 * c.rank() as usize;
                assert_eq!(&rs[me..me + 2], &[4, 4]);
                let mut b = vec![c.rank() as u64; 3];
                c.broadcast_in_place(&mut b, 2).unwrap();
                assert_eq!(b, vec![2; 3]);
            });
        }
    });
}

#[test]
fn repeated_calls_reuse_cached_plans() {
    let comms = host(2);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut v = vec![1.0f64; 100];
                for _ in 0..5 {
                    c.all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
                }
                assert_eq!(v[0], 32.0);
            });
        }
    });
    assert_eq!(comms[0].cached_plans(), 1);
}

/// Each rank remembers its last few call shapes (no shared lookup on a
/// repeat): cycling through more shapes than it keeps, mixing in-place and
/// out-of-place calls, every call still runs its own plan, gets the right
/// result and reports its own choice.
#[test]
fn many_alternating_call_shapes_each_get_their_own_plan() {
    let comms = host(3);
    let counts = [1usize, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144];
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                for round in 0..3 {
                    for (i, &count) in counts.iter().enumerate() {
                        let send = c.alloc::<i32>(count).unwrap();
                        let recv = c.alloc::<i32>(count).unwrap();
                        send.copy_from_slice(&vec![c.rank() as i32 + 1; count])
                            .unwrap();
                        if (i + round) % 2 == 0 {
                            c.all_reduce_in_place(&send, RedOp::Sum).unwrap();
                            assert_eq!(send.to_vec().unwrap(), vec![6; count], "{count}");
                        } else {
                            c.all_reduce(&send, &recv, RedOp::Max).unwrap();
                            assert_eq!(recv.to_vec().unwrap(), vec![3; count], "{count}");
                        }
                        let want = c
                            .choice_for(CollKind::AllReduce, count, DataType::I32)
                            .unwrap();
                        assert_eq!(c.last_choice(), Some(want), "{count}");
                    }
                }
            });
        }
    });
    // Out of place and in place per count, whatever the rounds.
    assert_eq!(comms[0].cached_plans(), 2 * counts.len());
}

/// A timer with laps between calls: one lap per call, in order, that
/// together make the whole; a lap or a stop before `start` is refused.
fn timer_laps_cover_each_call(comms: &[Communicator]) {
    let out = common::on_ranks(comms, |c| -> oxccl::Result<()> {
        let b = c.alloc::<f32>(1 << 16)?;
        b.copy_from_slice(&vec![1.0; 1 << 16])?;
        let mut t = c.timer()?;
        assert!(matches!(t.lap(), Err(oxccl::Error::InvalidUsage(_))));
        t.reserve(3)?;
        for _ in 0..2 {
            t.start()?;
            for i in 0..3 {
                if i > 0 {
                    t.lap()?;
                }
                c.all_reduce_in_place(&b, RedOp::Sum)?;
            }
            let total = t.stop()?;
            let laps = t.laps();
            assert_eq!(laps.len(), 3, "{laps:?}");
            assert!(laps.iter().all(|l| !l.is_zero()), "{laps:?}");
            let sum: std::time::Duration = laps.iter().sum();
            // Device events round to about half a microsecond each.
            let slack = std::time::Duration::from_micros(2);
            assert!(
                sum <= total + slack && total <= sum + slack,
                "{laps:?} {total:?}"
            );
        }
        assert!(matches!(t.stop(), Err(oxccl::Error::InvalidUsage(_))));
        let n = c.nranks() as f32;
        assert_eq!(b.to_vec()?[..2], [n * n * n * n * n * n; 2]);
        Ok(())
    });
    for r in out {
        r.unwrap();
    }
}

#[test]
fn host_timer_laps_cover_each_call() {
    timer_laps_cover_each_call(&host(3));
}

#[test]
fn cuda_timer_laps_cover_each_call() {
    if let Some(comms) = common::cuda("cuda_timer_laps_cover_each_call", 2) {
        timer_laps_cover_each_call(&comms);
    }
}
