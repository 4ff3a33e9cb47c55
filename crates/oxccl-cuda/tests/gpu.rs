//! Device tests of the executor, straight on `World` (the facade's
//! `crates/oxccl/tests/collectives.rs` runs the shared suite through the
//! Communicator API). Without a driver each prints `skipped: no CUDA
//! device`; with `OXCCL_REQUIRE_GPU=1` (every device run sets it) each
//! fails instead, and any other CUDA error fails (`oxccl_cuda::gpu_gate`).
//!
//! `OXCCL_GPU_RANKS` (e.g. `1,2,3,4,8`, the default) chooses the rank
//! counts, `OXCCL_GPU_DTYPE` the data types, `OXCCL_GPU_QUICK=1` a short
//! matrix for sanitizer runs, `OXCCL_GPU_BIG=1` adds 256 MiB to the size
//! sweep; a bad value or an unknown `OXCCL_GPU_*` fails
//! (`device_cases::GpuEnv`).

use std::sync::Arc;
use std::time::Duration;

use oxccl_core::gen::{generate, supports};
use oxccl_core::plan::{BufRole, Plan};
use oxccl_core::{
    testkit::{self},
    with_dtype, Algo, Awaited, CollKind, Collective, DataType, Element, FaultCause, Proto, RedOp,
};
use oxccl_cuda::driver::Graph;
use oxccl_cuda::{device_or_skip, encode, CudaError, Party, World, WorldConfig};

mod device_cases;
use device_cases::{cases, expected_cases, protos_for, Clique, GpuEnv};

fn world(n: u32, ndev: usize, timeout: Duration) -> Arc<World> {
    let mut cfg = WorldConfig::round_robin(n, ndev as i32, timeout);
    cfg.relaunch = relaunch();
    World::new(cfg).expect("world")
}

/// `OXCCL_RELAUNCH=1` (the sanitizer runs): every world of this suite in
/// relaunch mode, where no kernel waits for another and each launch
/// returns once its plan has run.
fn relaunch() -> bool {
    std::env::var("OXCCL_RELAUNCH").is_ok_and(|v| v.trim() == "1")
}

fn as_bytes<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: every Element type is plain data without padding or invalid
    // bit patterns; the slice covers exactly the vector's elements.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}
fn from_bytes<T: Element>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    let mut v = vec![T::default(); n];
    // SAFETY: as above; `v` has room for `n` elements = `b.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            b.as_ptr(),
            v.as_mut_ptr().cast::<u8>(),
            n * std::mem::size_of::<T>(),
        )
    };
    v
}

/// One rank's buffers: (input address, output address, arena(s) to free).
struct RankBufs {
    input: u64,
    output: u64,
    arenas: Vec<u64>,
}

/// Allocates, poisons and fills one rank's buffers. `shift` elements of
/// offset make sub-slices that start at odd element offsets.
fn setup<T: Element>(
    w: &World,
    r: u32,
    coll: &Collective,
    input: &[T],
    in_place: bool,
    shift: usize,
) -> RankBufs {
    let n = w.nranks();
    let sz = std::mem::size_of::<T>();
    let (ilen, olen) = (coll.input_len(n), coll.output_len(n));
    let s = w.stream(r).unwrap();
    let poison = |addr: u64, elems: usize| {
        // SAFETY: `addr` is an allocation of at least `elems` elements.
        unsafe { s.write_sync(addr, &vec![0xA5u8; elems * sz]).unwrap() };
    };
    if in_place {
        let len = ilen.max(olen) + shift;
        let a = w.alloc(r, len * sz).unwrap();
        poison(a, len);
        let base = a + (shift * sz) as u64;
        let (io, oo) = coll.in_place_offsets(r);
        let (input_at, output_at) = if ilen <= olen {
            (base + (io * sz) as u64, base)
        } else {
            (base, base + (oo * sz) as u64)
        };
        // SAFETY: inside the arena.
        unsafe { s.write_sync(input_at, as_bytes(input)).unwrap() };
        RankBufs {
            input: input_at,
            output: output_at,
            arenas: vec![a],
        }
    } else {
        let a = w.alloc(r, (ilen + shift) * sz).unwrap();
        let b = w.alloc(r, (olen + shift) * sz).unwrap();
        poison(b, olen + shift);
        let (i, o) = (a + (shift * sz) as u64, b + (shift * sz) as u64);
        // SAFETY: inside the allocation.
        unsafe { s.write_sync(i, as_bytes(input)).unwrap() };
        RankBufs {
            input: i,
            output: o,
            arenas: vec![a, b],
        }
    }
}

/// One vector per rank.
type PerRank<T> = Vec<Vec<T>>;

/// Checks a run's outputs against the reference: (wrong elements, first).
fn checked<T: Element>(
    coll: &Collective,
    op: RedOp,
    run: Result<(PerRank<T>, PerRank<T>), CudaError>,
) -> Result<(u64, Option<String>), CudaError> {
    let (inputs, outputs) = run?;
    Ok(testkit::compare(coll, &inputs, &outputs, op))
}

/// Runs `plan` on every rank under `proto`: (inputs, outputs) per rank.
#[allow(clippy::too_many_arguments)] // reason: one test case's full description
fn run_ranks<T: Element>(
    w: &World,
    plan: &Plan,
    coll: &Collective,
    op: RedOp,
    in_place: bool,
    shift: usize,
    proto: Proto,
) -> Result<(PerRank<T>, PerRank<T>), CudaError> {
    let n = w.nranks();
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input::<T>(coll, n, r, op, 11 + shift as u64))
        .collect();
    let lowered = op.lower(T::DTYPE, n);
    let outs: Vec<Result<Vec<T>, CudaError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (inputs, lowered) = (&inputs, &lowered);
                s.spawn(move || {
                    let rp = &plan.ranks[r as usize];
                    let b = setup::<T>(w, r, coll, &inputs[r as usize], in_place, shift);
                    let addrs: Vec<u64> = rp
                        .bufs
                        .iter()
                        .map(|d| match d.role {
                            BufRole::Input => b.input,
                            BufRole::Output => b.output,
                            BufRole::Scratch => 0,
                        })
                        .collect();
                    // The one-step LL AllReduce's plans run its kernel where
                    // the payload fits the world's limit (the plan past it).
                    let p = if plan.algo == Algo::OneShotLl && coll.kind == CollKind::AllReduce {
                        w.prepare_oneshot_ll(rp, T::DTYPE.size(), proto, coll.count)?
                    } else {
                        w.prepare_proto(rp, T::DTYPE.size(), proto)?
                    };
                    assert_eq!(p.proto(), proto);
                    // SAFETY: the addresses are live allocations of this clique sized for the plan.
                    unsafe { w.launch(&p, r, &addrs, T::DTYPE, lowered, Party::All, 0)? };
                    w.synchronize(r)?;
                    let mut bytes = vec![0u8; coll.output_len(n) * T::DTYPE.size()];
                    // SAFETY: the output holds that many bytes.
                    unsafe { w.stream(r)?.read_sync(b.output, &mut bytes)? };
                    for a in b.arenas {
                        w.free(r, a)?;
                    }
                    Ok(from_bytes::<T>(&bytes))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let outputs = outs.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok((inputs, outputs))
}

fn clique(w: &World) -> Clique {
    Clique {
        n: w.nranks(),
        max_channels: w.max_channels(),
        slot_bytes: w.slot_bytes(),
    }
}

/// The plan `device_cases::request` describes for this world; a
/// generation error fails the test.
fn plan_for(
    w: &World,
    kind: CollKind,
    count: usize,
    algo: Algo,
    in_place: bool,
    registered: bool,
    elem: usize,
) -> Plan {
    let req = device_cases::request(clique(w), kind, count, algo, (in_place, registered), elem);
    generate(&req).unwrap_or_else(|e| panic!("{req:?}: {e}"))
}

/// Every collective × algorithm (FIFO and registered) × dtype × op ×
/// in-place, a count not divisible by the rank count, odd offsets; plans
/// with FIFO connections under both Simple and LL. Every case of the list
/// runs (`device_cases::cases`, whose length is checked against the count
/// the filter implies); a plan that does not generate fails.
#[test]
fn every_case_on_the_device() {
    let env = GpuEnv::from_env();
    let Some(info) = device_or_skip("every_case_on_the_device") else {
        return;
    };
    for &n in &env.ranks {
        let w = world(n, info.devices.len(), Duration::from_secs(20));
        let list = cases(clique(&w), &env).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        assert_eq!(
            list.len(),
            expected_cases(n, &env),
            "{n} ranks: the case list lost cases"
        );
        assert!(!list.is_empty(), "{n} ranks: no case to run");
        let mut failures = Vec::new();
        let mut ran = 0;
        for case in &list {
            let coll = case.plan.coll.expect("collective plan");
            // Out of place: aligned (vector path); in place: odd offsets.
            let shift = usize::from(case.in_place);
            let (op, in_place, proto) = (case.op, case.in_place, case.proto);
            let res = with_dtype!(case.dt, T => checked(&coll, op, run_ranks::<T>(&w, &case.plan, &coll, op, in_place, shift, proto)));
            ran += 1;
            match res {
                Ok((0, _)) => {}
                Ok((wrong, first)) => failures.push(format!(
                    "{case}: {wrong} wrong, {}",
                    first.unwrap_or_default()
                )),
                Err(e) => failures.push(format!("{case}: {e}")),
            }
            if w.failed() {
                panic!("clique failed at {case}: {failures:?}");
            }
        }
        println!(
            "every_case_on_the_device: {n} ranks: {ran} cases, {} failed",
            failures.len()
        );
        assert_eq!(ran, list.len());
        assert!(
            failures.is_empty(),
            "{} of {ran} failed on {n} ranks:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// Sizes from 0 to 256 MiB per rank for ring and direct AllReduce (f32).
/// `ncclMemAlloc`'s memory (`vmm::alloc_in_current_context`): refused
/// without a current context; VMM memory rounded up to the granularity,
/// readable and writable through the driver's copies, registrable by a
/// rank of its device (and refused for a rank of another device), freed.
#[test]
fn vmm_memory_for_ncclmemalloc() {
    let Some(info) = device_or_skip("vmm_memory_for_ncclmemalloc") else {
        return;
    };
    use cudarc::driver::sys;
    use oxccl_cuda::vmm::alloc_in_current_context;
    let none = std::thread::spawn(|| alloc_in_current_context(64).map(|m| m.ptr))
        .join()
        .expect("thread");
    assert!(
        matches!(&none, Err(CudaError::Invalid(m)) if m.contains("no CUDA context")),
        "{none:?}"
    );
    let ndev = info.devices.len();
    let w = world(2, ndev, Duration::from_secs(20));
    let ctx = oxccl_cuda::driver::Ctx::new(0).expect("context");
    ctx.bind().expect("bind");
    let m = alloc_in_current_context(5000).expect("ncclMemAlloc");
    assert!(m.vmm(), "the device has VMM");
    assert!(m.size >= 5000 && m.size.is_multiple_of(4096), "{m:?}");
    assert!(m.ptr.is_multiple_of(4096), "{m:?}");
    let data: Vec<u8> = (0..m.size).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; m.size];
    // SAFETY: the mapping holds `m.size` bytes; synchronous copies.
    unsafe {
        assert_eq!(
            sys::cuMemcpyHtoD_v2(m.ptr, data.as_ptr().cast(), m.size),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), m.ptr, m.size),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    assert!(back == data, "VMM memory did not keep what was written");
    w.check_external(0, m.ptr, m.size)
        .expect("rank 0 (device 0) registers device 0's VMM memory");
    if ndev > 1 {
        let e = w.check_external(1, m.ptr, m.size).unwrap_err();
        assert!(e.to_string().contains("on device 0"), "{e}");
    }
    println!(
        "ncclMemAlloc(5000): {} bytes of VMM memory, exportable {}",
        m.size, m.exportable
    );
    ctx.bind().expect("bind");
    // SAFETY: nothing uses the memory any more.
    unsafe { m.free() }.expect("ncclMemFree");
}

#[test]
fn allreduce_sizes_up_to_256_mib() {
    let env = GpuEnv::from_env();
    let Some(info) = device_or_skip("allreduce_sizes_up_to_256_mib") else {
        return;
    };
    for &n in &env.ranks {
        let w = world(n, info.devices.len(), Duration::from_secs(30));
        let mut counts = vec![0usize, 1, 7, 255, 4097, 1 << 20];
        let mut ran = 0;
        if env.big {
            counts.push(64 << 20); // 256 MiB of f32 per rank
        }
        let ncounts = counts.len();
        for count in counts {
            for (algo, registered) in [
                (Algo::Ring, false),
                (Algo::OneShot, true),
                (Algo::TwoShot, true),
            ] {
                let plan = plan_for(&w, CollKind::AllReduce, count, algo, false, registered, 4);
                let coll = plan.coll.expect("collective");
                for &proto in protos_for(&plan).expect("encode") {
                    ran += 1;
                    let (wrong, first) = checked(
                        &coll,
                        RedOp::Sum,
                        run_ranks::<f32>(&w, &plan, &coll, RedOp::Sum, false, 0, proto),
                    )
                    .expect("run");
                    println!("allreduce {n} ranks {algo} {proto} count {count}: {wrong} wrong");
                    assert_eq!(
                        wrong, 0,
                        "{algo} {proto} count {count} on {n} ranks: {first:?}"
                    );
                }
            }
        }
        // Three algorithms per count, each under at least one protocol.
        assert!(ran >= 3 * ncounts, "{n} ranks: {ran} runs");
    }
}

/// A collective captured into a CUDA graph per rank, replayed 1000 times
/// under each FIFO protocol; the result is checked after every replay's
/// batch (counters and LL flags keep growing across replays, nothing
/// assumes a fresh state).
#[test]
fn graph_replays_1000_times() {
    let Some(info) = device_or_skip("graph_replays_1000_times") else {
        return;
    };
    if relaunch() {
        // The host waits between a call's launches, which a capture cannot.
        println!("graph_replays_1000_times: not run in relaunch mode (no capture there)");
        return;
    }
    let n = 4u32;
    let w = world(n, info.devices.len(), Duration::from_secs(20));
    for proto in [Proto::Simple, Proto::LL] {
        graph_replays(&w, proto);
    }
}

fn graph_replays(w: &World, proto: Proto) {
    let n = w.nranks();
    let count = 4099usize;
    let plan = plan_for(w, CollKind::AllReduce, count, Algo::Ring, false, false, 4);
    let coll = plan.coll.expect("collective");
    let op = RedOp::Sum;
    let inputs: Vec<Vec<i32>> = (0..n)
        .map(|r| testkit::input::<i32>(&coll, n, r, op, 3))
        .collect();
    let lowered = op.lower(DataType::I32, n);
    let outs: Vec<Vec<Vec<i32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (inputs, lowered, plan, coll) = (&inputs, &lowered, &plan, &coll);
                s.spawn(move || {
                    let rp = &plan.ranks[r as usize];
                    let b = setup::<i32>(w, r, coll, &inputs[r as usize], false, 0);
                    let addrs = &[b.input, b.output, 0][..rp.bufs.len()];
                    let p = w.prepare_proto(rp, 4, proto).unwrap();
                    // Eager warm-up: compiles, uploads, allocates scratch.
                    // SAFETY: live allocations sized for the plan.
                    unsafe {
                        w.launch(&p, r, addrs, DataType::I32, lowered, Party::All, 0)
                            .unwrap()
                    };
                    w.synchronize(r).unwrap();
                    let stream = w.stream(r).unwrap();
                    let g = Graph::capture(stream, || {
                        // SAFETY: as above; the graph is replayed while the buffers live.
                        unsafe { w.launch(&p, r, addrs, DataType::I32, lowered, Party::All, 0) }
                    })
                    .unwrap();
                    let mut results = Vec::new();
                    for batch in 0..10 {
                        // Clear the output so each batch must rewrite it.
                        // SAFETY: output holds `count` i32.
                        unsafe { stream.write_sync(b.output, &vec![0u8; count * 4]).unwrap() };
                        for _ in 0..100 {
                            g.launch(stream).unwrap();
                        }
                        w.synchronize(r)
                            .unwrap_or_else(|e| panic!("rank {r} batch {batch}: {e}"));
                        let mut bytes = vec![0u8; count * 4];
                        // SAFETY: as above.
                        unsafe { stream.read_sync(b.output, &mut bytes).unwrap() };
                        results.push(from_bytes::<i32>(&bytes));
                    }
                    results
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for batch in 0..10 {
        let outputs: Vec<Vec<i32>> = outs.iter().map(|o| o[batch].clone()).collect();
        let (wrong, first) = testkit::compare(&coll, &inputs, &outputs, op);
        assert_eq!(wrong, 0, "{proto} batch {batch}: {first:?}");
    }
    println!("graph_replays_1000_times: {proto}: 1000 replays on {n} ranks, all batches right");
}

/// A rank whose peer never arrives fails with a timeout naming rank,
/// peer, channel and step; the host does not hang; abort is prompt. Under
/// Simple the wait is on the tail counter, under LL on the lines' flags.
#[test]
fn missing_peer_times_out_and_abort_is_prompt() {
    let Some(info) = device_or_skip("missing_peer_times_out_and_abort_is_prompt") else {
        return;
    };
    for proto in [Proto::Simple, Proto::LL] {
        missing_peer(info.devices.len(), proto);
    }
}

fn missing_peer(ndev: usize, proto: Proto) {
    let w = world(2, ndev, Duration::from_millis(300));
    let plan = plan_for(&w, CollKind::AllReduce, 1000, Algo::Ring, false, false, 4);
    let coll = plan.coll.expect("collective");
    let input = testkit::input::<f32>(&coll, 2, 0, RedOp::Sum, 1);
    // Only rank 0 launches; its buffers and upload are returned, to
    // outlive the wait, with the launch's result (in relaunch mode the
    // launch itself waits, and fails).
    let launch_alone = |w: &World| {
        let b = setup::<f32>(w, 0, &coll, &input, false, 0);
        let p = w.prepare_proto(&plan.ranks[0], 4, proto).unwrap();
        // SAFETY: live allocations sized for the plan, kept by the caller.
        let r = unsafe {
            w.launch(
                &p,
                0,
                &[b.input, b.output, 0][..plan.ranks[0].bufs.len()],
                DataType::F32,
                &RedOp::Sum.lower(DataType::F32, 2),
                Party::All,
                0,
            )
        };
        assert_eq!(r.is_err(), relaunch(), "{proto}: launch gave {r:?}");
        (b, p, r)
    };
    let t = std::time::Instant::now();
    let (_b, _p, launched) = launch_alone(&w);
    let err = match launched {
        Err(e) => e,
        Ok(()) => w.synchronize(0).expect_err("must time out"),
    };
    let took = t.elapsed();
    println!("timeout ({proto}): {err} after {took:?}");
    match err {
        CudaError::Wait(f) if (f.cause, f.rank, f.peer) == (FaultCause::Deadline, 0, 1) => {
            assert_ne!(
                f.awaited,
                Awaited::Unknown,
                "{proto}: the record says what was awaited"
            );
        }
        other => panic!("{proto}: unexpected error {other}"),
    }
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(w.failed());

    // Abort: a fresh clique with a long deadline; abort must end the wait.
    let w = world(2, ndev, Duration::from_secs(600));
    let t = std::time::Instant::now();
    // From another thread: in relaunch mode the launch returns only then.
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            w.abort();
        });
        let (_b, _p, launched) = launch_alone(&w);
        match launched {
            Err(e) => e,
            Ok(()) => w.synchronize(0).expect_err("must abort"),
        }
    });
    println!("abort ({proto}): {err} after {:?}", t.elapsed());
    assert!(
        matches!(&err, CudaError::Wait(f) if (f.cause, f.rank) == (FaultCause::Aborted, 0)),
        "{proto}: {err}"
    );
    assert!(t.elapsed() < Duration::from_secs(20));
}

/// A plan prepared for LL runs on the connections' LL buffers: after an
/// LL call every connection's LL counters have moved (and no Simple buffer
/// exists); calls alternating Simple and LL keep both right, each buffer's
/// counters only growing.
#[test]
fn ll_is_used_when_requested() {
    let Some(info) = device_or_skip("ll_is_used_when_requested") else {
        return;
    };
    let n = 3u32;
    let w = world(n, info.devices.len(), Duration::from_secs(20));
    let plan = plan_for(&w, CollKind::AllReduce, 1001, Algo::Ring, false, false, 2);
    let coll = plan.coll.expect("collective");
    let keys: Vec<encode::LinkKey> = plan
        .ranks
        .iter()
        .flat_map(|r| encode::encode(r).expect("encode").conns)
        .collect();
    assert!(!keys.is_empty(), "a ring plan has FIFO connections");
    let counters = |proto| -> Vec<Option<(u64, u64)>> {
        keys.iter()
            .map(|&k| w.conn_counters(proto, k).expect("counters"))
            .collect()
    };
    let mut last = vec![0u64; keys.len()];
    for (i, proto) in [Proto::LL, Proto::Simple, Proto::LL, Proto::LL]
        .into_iter()
        .enumerate()
    {
        let (wrong, first) = checked(
            &coll,
            RedOp::Sum,
            run_ranks::<oxccl_core::half::f16>(&w, &plan, &coll, RedOp::Sum, false, 0, proto),
        )
        .expect("run");
        assert_eq!(wrong, 0, "call {i} ({proto}): {first:?}");
        if i == 0 {
            assert!(
                counters(Proto::Simple).iter().all(Option::is_none),
                "an LL call made Simple buffers"
            );
        }
        for (j, c) in counters(Proto::LL).into_iter().enumerate() {
            let (tail, head) =
                c.unwrap_or_else(|| panic!("connection {:?} has no LL buffer", keys[j]));
            assert_eq!(
                tail, head,
                "connection {:?}: every message consumed",
                keys[j]
            );
            if proto == Proto::LL {
                assert!(
                    tail > last[j],
                    "call {i}: LL counters of {:?} did not move",
                    keys[j]
                );
            } else {
                assert_eq!(tail, last[j], "a Simple call moved LL counters");
            }
            last[j] = tail;
        }
    }
    println!(
        "ll_is_used_when_requested: {} connections, LL counters {last:?}",
        keys.len()
    );
}

/// LL reduces in the same order with the same arithmetic as Simple: the
/// outputs agree bit for bit (for floats too, where the reference check
/// allows a tolerance).
#[test]
fn ll_matches_simple_bit_for_bit() {
    let Some(info) = device_or_skip("ll_matches_simple_bit_for_bit") else {
        return;
    };
    let n = 4u32;
    let w = world(n, info.devices.len(), Duration::from_secs(20));
    let mut cases = 0;
    for kind in [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::Reduce,
    ] {
        for algo in Algo::ALL {
            if !supports(algo, kind) {
                continue;
            }
            for dt in [
                DataType::F16,
                DataType::Bf16,
                DataType::F32,
                DataType::F64,
                DataType::F8E4M3,
            ] {
                for op in [RedOp::Sum, RedOp::Avg, RedOp::PreMulSum(0.3)] {
                    let plan = plan_for(&w, kind, 1001, algo, false, false, dt.size());
                    // Every FIFO plan on 4 ranks has connections.
                    assert_eq!(protos_for(&plan).expect("encode").len(), 2, "{kind} {algo}");
                    let coll = plan.coll.expect("collective");
                    let same = with_dtype!(dt, T => {
                        let run = |proto| run_ranks::<T>(&w, &plan, &coll, op, false, 1, proto).expect("run").1;
                        let (simple, ll) = (run(Proto::Simple), run(Proto::LL));
                        simple.iter().zip(&ll).all(|(a, b)| as_bytes(a) == as_bytes(b))
                    });
                    assert!(
                        same,
                        "{kind} {algo} {dt} {op}: LL and Simple outputs differ"
                    );
                    cases += 1;
                }
            }
        }
    }
    let pairs = [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::Reduce,
    ]
    .iter()
    .map(|&k| Algo::ALL.iter().filter(|&&a| supports(a, k)).count())
    .sum::<usize>();
    assert_eq!(
        cases,
        pairs * 5 * 3,
        "every (collective, algorithm) × 5 dtypes × 3 ops"
    );
    println!("ll_matches_simple_bit_for_bit: {cases} cases identical");
}

/// `available` never panics and says something true: either a coherent
/// description of every visible device, or, with no driver, the
/// `NoDriver` error GPU tests skip on (the same answer every time). Any
/// other error fails, and so does a missing device under
/// `OXCCL_REQUIRE_GPU=1`.
#[test]
fn available_never_panics() {
    let first = oxccl_cuda::available();
    assert_eq!(first, oxccl_cuda::available(), "a second probe disagrees");
    if let Err(CudaError::NoDriver(why)) = &first {
        assert!(!why.is_empty(), "the reason is empty");
    }
    let Some(i) = oxccl_cuda::skip_or_fail("available_never_panics", first) else {
        return;
    };
    assert!(!i.devices.is_empty(), "available() with no device");
    assert!(i.driver_version >= 11000, "driver {}", i.driver_version);
    assert!(i.nvrtc_version.0 >= 11, "nvrtc {:?}", i.nvrtc_version);
    for (k, d) in i.devices.iter().enumerate() {
        assert_eq!(d.ordinal, k as i32, "{d:?}");
        assert!(!d.name.is_empty() && d.arch >= 50, "{d:?}");
        assert!(d.sm_count > 0 && d.total_mem > 0, "{d:?}");
        assert_eq!(oxccl_cuda::device::device_info(d.ordinal).as_ref(), Ok(d));
    }
    println!(
        "available: {} device(s), driver {}, nvrtc {:?}",
        i.devices.len(),
        i.driver_version,
        i.nvrtc_version
    );
}
