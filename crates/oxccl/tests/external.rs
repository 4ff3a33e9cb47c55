//! The raw entry points on CUDA: memory the caller allocated
//! (`cuMemAlloc`, stream-ordered pool memory from `cuMemAllocAsync`, VMM
//! memory from `cuMemCreate`) and a caller's stream per rank, as a
//! framework or the C ABI uses them.
//!
//! Every copy in and out is enqueued on the caller's stream and only that
//! stream is waited for: a result read right is a result the caller's
//! stream saw after the call. Before each call's input copy, a 64 MiB
//! memset on the caller's stream holds the input back, so a launch not
//! ordered after the caller's earlier work would read stale input.
//!
//! Without a driver each test prints `skipped: no CUDA device`; under
//! `OXCCL_REQUIRE_GPU=1` that is a failure. `OXCCL_GPU_RANKS` (default
//! `2,3,8`) and `OXCCL_GRAPH_REPLAYS` (default 1000) size the runs.

mod common;

use std::sync::{Arc, Mutex};

use common::raw::{bytes_of, bytes_of_mut, f32_call, run_collective, run_ring, Mem};
use cudarc::driver::sys;
use oxccl::{BackendKind, CollKind, Communicator, Config, RawStream, RedOp};
use oxccl_cuda::driver::Ctx;

fn ck(what: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// `cuMemAlloc`.
    Alloc,
    /// `cuMemAllocAsync` from the device's default pool.
    Pool,
    /// `cuMemCreate` + `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess`.
    Vmm,
    /// The C ABI's `ncclMemAlloc` (`oxccl::backend::cuda::alloc_symmetric`:
    /// VMM, exportable, peers granted access).
    Sym,
}

/// How to release one allocation.
enum Owned {
    Alloc(u64),
    Pool(u64),
    Vmm { va: u64, size: usize, handle: u64 },
    Sym(oxccl::backend::cuda::SymMem),
}

/// Per rank: its device's context, its caller stream and a 64 MiB area
/// the ordering memsets write.
struct RankMem {
    ctx: Arc<Ctx>,
    stream: sys::CUstream,
    delay: u64,
}

/// Caller-owned CUDA memory of one kind, and a caller stream per rank.
struct CudaMem {
    kind: Kind,
    ranks: Vec<RankMem>,
    owned: Mutex<Vec<(u32, Owned)>>,
}

// SAFETY: the raw handles are used with their context bound, from any
// thread, as the driver allows.
unsafe impl Sync for CudaMem {}
// SAFETY: as above.
unsafe impl Send for CudaMem {}

const DELAY_BYTES: usize = 64 << 20;

impl CudaMem {
    fn new(kind: Kind, n: u32) -> CudaMem {
        let ndev = oxccl_cuda::driver::device_count()
            .expect("device count")
            .max(1);
        let ranks = (0..n)
            .map(|r| {
                let ctx = Ctx::new(r as i32 % ndev).expect("context");
                let mut stream = std::ptr::null_mut();
                let mut delay = 0;
                // SAFETY: plain creation calls with valid out-pointers in
                // the bound context.
                unsafe {
                    ck("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1));
                    ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut delay, DELAY_BYTES));
                }
                RankMem { ctx, stream, delay }
            })
            .collect();
        CudaMem {
            kind,
            ranks,
            owned: Mutex::new(Vec::new()),
        }
    }

    fn rank(&self, r: u32) -> &RankMem {
        let m = &self.ranks[r as usize];
        m.ctx.bind().expect("bind");
        m
    }

    fn vmm(&self, r: u32, bytes: usize) -> Owned {
        let m = self.rank(r);
        // SAFETY: all-zero is a valid value of this C struct.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = m.ctx.dev;
        let mut gran = 0;
        let (mut handle, mut va) = (0, 0);
        // SAFETY: valid properties and out-pointers; the mapping is
        // released in `Drop`.
        unsafe {
            ck(
                "cuMemGetAllocationGranularity",
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
            );
            let size = bytes.div_ceil(gran) * gran;
            ck("cuMemCreate", sys::cuMemCreate(&mut handle, size, &prop, 0));
            ck(
                "cuMemAddressReserve",
                sys::cuMemAddressReserve(&mut va, size, 0, 0, 0),
            );
            ck("cuMemMap", sys::cuMemMap(va, size, 0, handle, 0));
            // Every device of the clique may read and write it.
            let ndev = oxccl_cuda::driver::device_count().expect("device count");
            let access: Vec<sys::CUmemAccessDesc> = (0..ndev)
                .map(|d| sys::CUmemAccessDesc {
                    location: sys::CUmemLocation {
                        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                        id: d,
                    },
                    flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                })
                .collect();
            ck(
                "cuMemSetAccess",
                sys::cuMemSetAccess(va, size, access.as_ptr(), access.len()),
            );
            Owned::Vmm { va, size, handle }
        }
    }
}

impl Mem for CudaMem {
    fn alloc(&self, rank: u32, bytes: usize) -> u64 {
        let bytes = bytes.max(16);
        let m = self.rank(rank);
        let o = match self.kind {
            Kind::Alloc => {
                let mut p = 0;
                // SAFETY: plain allocation; freed in `Drop`.
                unsafe { ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, bytes)) };
                Owned::Alloc(p)
            }
            Kind::Pool => {
                let mut p = 0;
                // SAFETY: stream-ordered allocation on the caller stream,
                // usable by later work there (and, once complete, anywhere).
                unsafe {
                    ck(
                        "cuMemAllocAsync",
                        sys::cuMemAllocAsync(&mut p, bytes, m.stream),
                    );
                }
                Owned::Pool(p)
            }
            Kind::Vmm => self.vmm(rank, bytes),
            Kind::Sym => {
                // The rank's context is current (`rank` bound it).
                Owned::Sym(oxccl::backend::cuda::alloc_symmetric(bytes).expect("ncclMemAlloc"))
            }
        };
        let p = match &o {
            Owned::Alloc(p) | Owned::Pool(p) => *p,
            Owned::Vmm { va, .. } => *va,
            Owned::Sym(m) => m.ptr,
        };
        self.owned.lock().unwrap().push((rank, o));
        p
    }

    fn stream(&self, rank: u32) -> RawStream {
        RawStream::from_ptr(self.ranks[rank as usize].stream.cast())
    }

    fn upload(&self, rank: u32, dst: u64, src: &[u8]) {
        let m = self.rank(rank);
        // SAFETY: `dst` holds `src.len()` bytes; `delay` holds DELAY_BYTES;
        // a pageable source is staged before the call returns.
        unsafe {
            ck(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(m.delay, 0x5a, DELAY_BYTES, m.stream),
            );
            ck(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), m.stream),
            );
        }
    }

    fn download(&self, rank: u32, src: u64, dst: &mut [u8]) {
        let m = self.rank(rank);
        // SAFETY: `src` holds `dst.len()` bytes; a pageable destination
        // is written before the call returns... or by `sync`.
        unsafe {
            ck(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), m.stream),
            );
        }
        self.sync(rank);
    }

    fn sync(&self, rank: u32) {
        let m = self.rank(rank);
        // SAFETY: a live stream of the bound context.
        unsafe { ck("cuStreamSynchronize", sys::cuStreamSynchronize(m.stream)) };
    }
}

impl Drop for CudaMem {
    fn drop(&mut self) {
        for (r, o) in self.owned.lock().unwrap().drain(..) {
            let m = self.rank(r);
            // SAFETY: each allocation is released once, after every call
            // on it completed (each check waited for the caller stream).
            unsafe {
                let _ = match o {
                    Owned::Alloc(p) => sys::cuMemFree_v2(p),
                    Owned::Pool(p) => sys::cuMemFreeAsync(p, m.stream),
                    Owned::Vmm { va, size, handle } => {
                        let _ = sys::cuMemUnmap(va, size);
                        let _ = sys::cuMemRelease(handle);
                        sys::cuMemAddressFree(va, size)
                    }
                    Owned::Sym(s) => {
                        oxccl::backend::cuda::free_symmetric(s).expect("ncclMemFree");
                        sys::CUresult::CUDA_SUCCESS
                    }
                };
            }
        }
        for m in &self.ranks {
            let _ = m.ctx.bind();
            // SAFETY: created in `new`, destroyed once.
            unsafe {
                let _ = sys::cuStreamSynchronize(m.stream);
                let _ = sys::cuMemFree_v2(m.delay);
                let _ = sys::cuStreamDestroy_v2(m.stream);
            }
        }
    }
}

fn env_list(var: &str, default: &[u32]) -> Vec<u32> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// CUDA communicators, or `None` (with the skip line) without a device.
fn cuda(test: &str, n: u32) -> Option<Vec<Communicator>> {
    oxccl::backend::cuda::device_or_skip(test)?;
    let cfg = Config {
        backend: BackendKind::Cuda,
        deadline: std::time::Duration::from_secs(20),
        ..Config::from_env().expect("configuration")
    };
    Some(oxccl::init_all_with(n, cfg).expect("CUDA communicators"))
}

#[test]
fn cuda_every_collective_on_external_memory() {
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_every_collective_on_external_memory", n) else {
            return;
        };
        println!(
            "driver supports CUDA {:?} (cuDriverGetVersion); bindings at API level {}",
            oxccl_cuda::driver::driver_version(),
            oxccl_cuda::driver::MIN_DRIVER
        );
        for kind in [Kind::Alloc, Kind::Pool, Kind::Vmm, Kind::Sym] {
            let mem = CudaMem::new(kind, n);
            let t = std::time::Instant::now();
            let mut calls = 0;
            for coll in oxccl::core::testkit::COLLECTIVES {
                for count in [1000, 1 << 18] {
                    for in_place in [false, true] {
                        let op = RedOp::Sum;
                        let o = run_collective::<f32, _>(
                            &comms, &mem, coll, count, op, in_place, false,
                        );
                        assert_eq!(
                            o.wrong, 0,
                            "{kind:?} memory, {n} ranks, {coll} count {count} in_place {in_place}: {:?}",
                            o.first
                        );
                        calls += 1;
                    }
                }
            }
            for coll in [
                CollKind::AllReduce,
                CollKind::AllGather,
                CollKind::ReduceScatter,
            ] {
                let o =
                    run_collective::<f32, _>(&comms, &mem, coll, 1 << 20, RedOp::Sum, false, true);
                assert_eq!(
                    o.wrong, 0,
                    "{kind:?} memory registered, {n} ranks, {coll}: {:?}",
                    o.first
                );
                assert!(
                    o.direct,
                    "{kind:?} memory registered, {n} ranks, {coll}: a direct plan"
                );
                calls += 1;
            }
            let (wrong, first) = run_ring::<f32, _>(&comms, &mem, 1 << 18);
            assert_eq!(wrong, 0, "{kind:?} memory, {n} ranks, ring: {first:?}");
            println!(
                "external {kind:?} memory, {n} ranks: {} calls on callers' streams right, {:?}",
                calls + 1,
                t.elapsed()
            );
        }
    }
}

/// `ncclMemAlloc`'s memory: VMM memory rounded up to the granularity,
/// usable by the driver's copies, registered by windows on every rank
/// (symmetric: aligned), where every collective is right and the large
/// ones take the direct plans; raw VMM memory too.
#[test]
fn cuda_windows_on_vmm_memory() {
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_windows_on_vmm_memory", n) else {
            return;
        };
        for kind in [Kind::Sym, Kind::Vmm] {
            let mem = CudaMem::new(kind, n);
            if kind == Kind::Sym {
                mem.rank(0);
                let m = oxccl::backend::cuda::alloc_symmetric(1).expect("ncclMemAlloc of 1 byte");
                assert!(m.vmm(), "the device has VMM: ncclMemAlloc must use it");
                assert!(m.size >= 4096 && m.ptr.is_multiple_of(4096), "{m:?}");
                println!(
                    "ncclMemAlloc(1): {} bytes, exportable {}",
                    m.size, m.exportable
                );
                // SAFETY: never used.
                unsafe { oxccl::backend::cuda::free_symmetric(m) }.expect("ncclMemFree");
            }
            for coll in oxccl::core::testkit::COLLECTIVES {
                for (count, in_place) in [(1000, false), (1 << 20, false), (1 << 18, true)] {
                    let o = common::raw::run_collective::<f32, _>(
                        &comms,
                        &mem,
                        coll,
                        count,
                        RedOp::Sum,
                        in_place,
                        common::raw::Reg::Window,
                    );
                    assert_eq!(
                        o.wrong, 0,
                        "{kind:?} windows, {n} ranks, {coll} count {count} in_place {in_place}: {:?}",
                        o.first
                    );
                    if count == 1 << 20
                        && matches!(
                            coll,
                            CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
                        )
                    {
                        assert!(
                            o.direct,
                            "{kind:?} windows, {n} ranks, {coll}: a direct plan"
                        );
                    }
                }
            }
            println!("windows on {kind:?} memory, {n} ranks: every collective right");
        }
    }
}

/// A window deregistered right after a call on it was enqueued (the
/// call still pending behind a 64 MiB memset): the call completes right,
/// and the memory is then freed with `ncclMemFree`'s path.
#[test]
fn cuda_window_deregistered_while_a_call_is_pending() {
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_window_deregistered_while_a_call_is_pending", n) else {
            return;
        };
        let mem = CudaMem::new(Kind::Sym, n);
        let count = 1usize << 20;
        let bad = common::on_ranks(&comms, |c| {
            let r = c.rank();
            let (send, recv) = (mem.alloc(r, count * 4), mem.alloc(r, count * 4));
            let input: Vec<f32> = (0..count).map(|i| (i % 13) as f32 + r as f32).collect();
            mem.upload(r, send, bytes_of(&input));
            // SAFETY: both allocations outlive every call on them.
            let wins = unsafe {
                [
                    c.window_register(send as *const _, count * 4, oxccl::WIN_COLL_SYMMETRIC)
                        .expect("window"),
                    c.window_register(recv as *const _, count * 4, oxccl::WIN_COLL_SYMMETRIC)
                        .expect("window"),
                ]
            };
            // SAFETY: as above; the rank's caller stream.
            unsafe {
                c.collective_raw(
                    f32_call(CollKind::AllReduce, send, recv, count, RedOp::Sum, 0),
                    mem.stream(r),
                )
            }
            .expect("allreduce");
            for w in &wins {
                c.window_deregister(w)
                    .expect("deregister with the call pending");
            }
            let mut out = vec![0f32; count];
            mem.download(r, recv, bytes_of_mut(&mut out));
            let base: f32 = (0..n).map(|q| q as f32).sum();
            (0..count)
                .find(|&i| out[i] != (i % 13) as f32 * n as f32 + base)
                .map(|i| format!("rank {r}: element {i} is {}", out[i]))
        });
        let bad: Vec<_> = bad.into_iter().flatten().collect();
        assert!(bad.is_empty(), "{n} ranks: {bad:?}");
        println!("{n} ranks: windows deregistered with a call pending; results right");
    }
}

/// Captures a call made on each rank's caller stream into a CUDA graph and
/// replays it, with a new input copied (on that stream) before each
/// replay and the result read back after it.
#[test]
fn cuda_graph_capture_on_callers_streams() {
    let replays: usize = std::env::var("OXCCL_GRAPH_REPLAYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_graph_capture_on_callers_streams", n) else {
            return;
        };
        for (count, register) in [(2usize, false), (1 << 20, true)] {
            let mem = CudaMem::new(Kind::Pool, n);
            let t = std::time::Instant::now();
            let errs = common::on_ranks(&comms, |c| {
                let r = graph_loop(c, &mem, count, register, replays, false);
                if r.is_err() {
                    // No peer waits out the deadline for this rank.
                    c.abort();
                }
                r
            });
            let bad: Vec<_> = errs.into_iter().filter_map(Result::err).collect();
            assert!(bad.is_empty(), "{n} ranks, {count} f32: {bad:?}");
            println!(
                "graph of AllReduce {count} f32 (registered {register}) on callers' streams, {n} ranks: \
                 {replays} replays right, {:?}",
                t.elapsed()
            );
        }
    }
}

/// A PreMulSum whose scalar is in device memory (`ncclScalarDevice`),
/// captured into a graph: each replay must scale by the value the caller's
/// stream wrote before it, different on every rank and every replay, so
/// a scalar read once (at capture, or on the host) gives wrong sums.
#[test]
fn cuda_device_scalar_read_by_each_replay() {
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_device_scalar_read_by_each_replay", n) else {
            return;
        };
        if !comms[0].reads_device_scalars() {
            panic!("CUDA threads' kernels must read device scalars");
        }
        let mem = CudaMem::new(Kind::Alloc, n);
        let errs = common::on_ranks(&comms, |c| {
            let r = graph_loop(c, &mem, 4096, false, 20, true);
            if r.is_err() {
                c.abort();
            }
            r
        });
        let bad: Vec<_> = errs.into_iter().filter_map(Result::err).collect();
        assert!(bad.is_empty(), "{n} ranks: {bad:?}");
        println!("device scalar PreMulSum in a graph, {n} ranks: 20 replays right");
    }
}

/// `scaled`: the op is a PreMulSum whose scalar lies in device memory and
/// changes before every replay (rank q's scalar in replay k is
/// `k % 3 + 1 + q`).
fn graph_loop(
    c: &Communicator,
    mem: &CudaMem,
    count: usize,
    register: bool,
    replays: usize,
    scaled: bool,
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    let bytes = count * 4;
    let (send, recv) = (mem.alloc(r, bytes), mem.alloc(r, bytes));
    let s = mem.stream(r);
    let scalar_at = mem.alloc(r, 4);
    let scale = |k: usize, q: u32| {
        if scaled {
            (k % 3 + 1) as f32 + q as f32
        } else {
            1.0
        }
    };
    let op = if scaled {
        RedOp::PreMulSumDevice(scalar_at)
    } else {
        RedOp::Sum
    };
    let regs = if register {
        // SAFETY: both allocations outlive every call on them.
        unsafe {
            vec![
                c.register(send as *const _, bytes)
                    .map_err(|e| e.to_string())?,
                c.register(recv as *const _, bytes)
                    .map_err(|e| e.to_string())?,
            ]
        }
    } else {
        Vec::new()
    };
    let input = |k: usize, q: u32| -> Vec<f32> {
        (0..count)
            .map(|i| ((i + k) % 17) as f32 + q as f32 * 3.0)
            .collect()
    };
    let call = || {
        // SAFETY: the buffers hold `count` f32 on this rank's device and
        // live to the end; `s` is this rank's caller stream.
        unsafe { c.collective_raw(f32_call(CollKind::AllReduce, send, recv, count, op, 0), s) }
    };
    // Warm-up: the plan is made and uploaded outside the capture.
    mem.upload(r, scalar_at, bytes_of(&[scale(0, r)]));
    mem.upload(r, send, bytes_of(&input(0, r)));
    call().map_err(|e| format!("warm-up: {e}"))?;
    mem.sync(r);
    let raw = mem.ranks[r as usize].stream;
    let mut graph = std::ptr::null_mut();
    let mut exec = std::ptr::null_mut();
    // SAFETY: capture on this rank's own live stream, relaxed so the
    // other ranks' threads may make driver calls meanwhile.
    unsafe {
        ck(
            "cuStreamBeginCapture",
            sys::cuStreamBeginCapture_v2(
                raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ),
        );
    }
    let captured = call();
    // SAFETY: ends the capture begun above; instantiates what it holds.
    unsafe {
        ck(
            "cuStreamEndCapture",
            sys::cuStreamEndCapture(raw, &mut graph),
        );
    }
    captured.map_err(|e| format!("captured call: {e}"))?;
    // SAFETY: `graph` is the captured graph.
    unsafe {
        ck(
            "cuGraphInstantiate",
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
        )
    };
    let mut out = vec![0f32; count];
    let mut result = Ok(());
    for k in 1..=replays {
        mem.upload(r, scalar_at, bytes_of(&[scale(k, r)]));
        mem.upload(r, send, bytes_of(&input(k, r)));
        // SAFETY: an instantiated graph on this rank's live stream.
        unsafe { ck("cuGraphLaunch", sys::cuGraphLaunch(exec, raw)) };
        // Drained before the copy, as the README asks of callers: a
        // pageable copy queued behind the replayed kernel would hold the
        // driver's copy lock while that kernel waits for a peer whose
        // thread needs the lock for its own upload before replaying.
        mem.sync(r);
        mem.download(r, recv, bytes_of_mut(&mut out));
        // Element i of every input depends on i only through (i + k) % 17,
        // so 17 sums (small integers: exact in any order) are the whole
        // reference. Building the ranks' inputs per element made this
        // quadratic in `count`: minutes at 1 Mi elements, which looked like
        // a hang on the GPU; n inputs per replay still took 8 ranks past
        // a minute.
        let sums: Vec<f32> = (0..17)
            .map(|j| {
                (0..n)
                    .map(|q| scale(k, q) * (j as f32 + q as f32 * 3.0))
                    .sum()
            })
            .collect();
        let want = |i: usize| sums[(i + k) % 17];
        if let Some(i) = (0..count).find(|&i| out[i].to_bits() != want(i).to_bits()) {
            result = Err(format!(
                "rank {r} replay {k}: element {i} is {}, expected {}",
                out[i],
                want(i)
            ));
            break;
        }
    }
    // SAFETY: made above, destroyed once, after the last replay completed.
    unsafe {
        let _ = sys::cuGraphExecDestroy(exec);
        let _ = sys::cuGraphDestroy(graph);
    }
    for g in regs {
        c.deregister(g).map_err(|e| e.to_string())?;
    }
    result
}

/// One group per rank with two AllReduces, each on its own caller stream
/// (NCCL lets a group's operations use different streams): each stream's
/// input copy is held back by a 64 MiB memset on that stream, and each
/// result is read back on its own stream only, so the launch must wait
/// for both streams and both streams for the launch.
#[test]
fn cuda_group_on_two_callers_streams() {
    for n in env_list("OXCCL_GPU_RANKS", &[2, 3, 8]) {
        let Some(comms) = cuda("cuda_group_on_two_callers_streams", n) else {
            return;
        };
        let mem = CudaMem::new(Kind::Alloc, n);
        // 16 KiB and 1 MiB a call: two 1 MiB AllReduces want more channels
        // together than fit resident, so the group runs as two launches.
        let errs = common::on_ranks(&comms, |c| {
            let r = two_streams(c, &mem, 1 << 12).and_then(|()| two_streams(c, &mem, 1 << 18));
            if r.is_err() {
                c.abort();
            }
            r
        });
        let bad: Vec<_> = errs.into_iter().filter_map(Result::err).collect();
        assert!(bad.is_empty(), "{n} ranks: {bad:?}");
        println!("group on two callers' streams, {n} ranks: right");
    }
}

fn two_streams(c: &Communicator, mem: &CudaMem, count: usize) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    let bytes = count * 4;
    let (x, y) = (mem.alloc(r, bytes), mem.alloc(r, bytes));
    let _ = mem.rank(r); // binds the rank's context for the calls below
    let (mut second, mut delay) = (std::ptr::null_mut(), 0);
    let input = |k: u32| -> Vec<f32> { (0..count).map(|i| (i % 13) as f32 + k as f32).collect() };
    let (ix, iy) = (input(r), input(100 + r));
    // SAFETY: creation calls with valid out-pointers in the bound context;
    // the copies' sources outlive them (pageable sources are staged before
    // the calls return); `delay` holds DELAY_BYTES.
    unsafe {
        ck("cuStreamCreate", sys::cuStreamCreate(&mut second, 1));
        ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut delay, DELAY_BYTES));
        ck(
            "cuMemsetD8Async",
            sys::cuMemsetD8Async(delay, 0x5a, DELAY_BYTES, second),
        );
        ck(
            "cuMemcpyHtoDAsync",
            sys::cuMemcpyHtoDAsync_v2(y, iy.as_ptr().cast(), bytes, second),
        );
    }
    mem.upload(r, x, bytes_of(&ix));
    let all_reduce = |buf: u64| f32_call(CollKind::AllReduce, buf, buf, count, RedOp::Sum, 0);
    let streams = [mem.stream(r), RawStream::from_ptr(second.cast())];
    oxccl::group(|g| {
        // SAFETY: both buffers hold `count` f32 on this rank's device and
        // live to the end; both streams are live streams of its context.
        unsafe {
            g.collective_raw(c, all_reduce(x), streams[0])?;
            g.collective_raw(c, all_reduce(y), streams[1])
        }
    })
    .map_err(|e| e.to_string())?;
    let (mut ox, mut oy) = (vec![0f32; count], vec![0f32; count]);
    mem.download(r, x, bytes_of_mut(&mut ox));
    let _ = mem.rank(r); // bound again: `download` may run on another context
                         // SAFETY: `y` holds `bytes`; the destination is written by the
                         // synchronize below; the stream and `delay` are released once.
    unsafe {
        ck(
            "cuMemcpyDtoHAsync",
            sys::cuMemcpyDtoHAsync_v2(oy.as_mut_ptr().cast(), y, bytes, second),
        );
        ck("cuStreamSynchronize", sys::cuStreamSynchronize(second));
        let _ = sys::cuMemFree_v2(delay);
        let _ = sys::cuStreamDestroy_v2(second);
    }
    let sum =
        |base: u32, i: usize| -> f32 { (0..n).map(|q| (i % 13) as f32 + (base + q) as f32).sum() };
    for i in 0..count {
        if ox[i] != sum(0, i) || oy[i] != sum(100, i) {
            return Err(format!(
                "rank {r} element {i}: x {} (want {}), y {} (want {})",
                ox[i],
                sum(0, i),
                oy[i],
                sum(100, i)
            ));
        }
    }
    Ok(())
}
