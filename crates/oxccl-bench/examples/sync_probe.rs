//! Which driver calls wait for a kernel that is still running on another
//! stream: the facts behind the CUDA backend's rule that nothing a rank
//! does on the host between two calls may wait for the device, because a
//! peer's kernel may be spinning until this rank launches.
//!
//! `sync_probe`: device 0, one non-blocking stream A running a one-block
//! kernel that spins until the host releases it (or 1.5 s pass), and for
//! each probed driver call: launch the spinner, wait until it runs, make
//! the call, then release the spinner. A call that waits for the running
//! kernel cannot return before the spinner gives up by itself, so the
//! verdict is the spinner's own record ("timed out": the host was held),
//! with the call's duration beside it. `cuCtxSynchronize` is the positive
//! control, an empty call the negative one. Other work goes to stream B
//! (non-blocking) or the legacy stream, as each line says.
//!
//! Run it once as is and once with `CUDA_MODULE_LOADING=EAGER` (the
//! driver reads it at `cuInit`): with lazy loading, a function's first
//! launch loads it, and the CUDA programming guide warns that loading may
//! need a context synchronisation.

use std::process::exit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use oxccl_cuda::driver::{Ctx, DevMem, Function, HostMapped, Module, Stream};
use oxccl_cuda::kernels::compile_source;

const SPIN_SRC: &str = r#"
typedef unsigned long long u64;
__device__ __forceinline__ u64 now() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// words[0]: set when running; words[1]: the host's release; words[2]:
// set when the spinner gave up at its deadline instead.
struct SpinArgs { u64 words; u64 deadline_ns; };
extern "C" __global__ void probe_spin(SpinArgs a) {
  volatile unsigned* w = (volatile unsigned*)a.words;
  const u64 deadline_ns = a.deadline_ns;
  if (threadIdx.x != 0) return;
  const u64 t0 = now();
  w[0] = 1u;
  __threadfence_system();
  while (w[1] == 0u) {
    if (now() - t0 > deadline_ns) {
      w[2] = 1u;
      __threadfence_system();
      return;
    }
  }
}
"#;

/// A second module, loaded (or first launched) inside the window.
const LAZY_SRC: &str = r#"
struct SpinArgs { unsigned long long words; unsigned long long deadline_ns; };
extern "C" __global__ void probe_lazy(SpinArgs a) { if (a.words != 0) *(int*)a.words = 1; }
extern "C" __global__ void probe_lazy2(SpinArgs a) { if (a.words != 0) *(int*)a.words = 2; }
"#;

const DEADLINE: Duration = Duration::from_millis(1500);

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("sync_probe: {what}: {e}");
    exit(2)
}

fn check(call: &str, r: sys::CUresult) -> Result<(), String> {
    r.result().map_err(|e| format!("{call}: {e:?}"))
}

struct Probe {
    ctx: Arc<Ctx>,
    a: Stream,
    b: Stream,
    words: HostMapped,
    spin: Function,
    _spin_module: Module,
    lazy_cubin: Vec<u8>,
    /// 4 MiB allocated before any window, for the memset and copy probes.
    scratch: u64,
    /// 2 MiB allocated before any window, freed inside one.
    to_free: u64,
}

impl Probe {
    fn launch_spin(&self) {
        let p = SpinArgs {
            words: self.words.dev_ptr,
            deadline: DEADLINE.as_nanos() as u64,
        };
        launch2(self.spin, &self.a, &p);
    }

    /// Runs `op` while the spinner runs on stream A; returns the call's
    /// duration, whether the spinner had to give up by itself, and the
    /// call's own result.
    fn window(&self, op: &mut dyn FnMut(&Probe) -> Result<(), String>) -> (Duration, bool, String) {
        for i in 0..3 {
            self.words.store_u32(i, 0);
        }
        self.launch_spin();
        let t = Instant::now();
        while self.words.load_u32(0) == 0 {
            if t.elapsed() > Duration::from_secs(3) {
                die("spinner", "never started");
            }
            std::hint::spin_loop();
        }
        let t0 = Instant::now();
        let r = op(self);
        let dt = t0.elapsed();
        self.words.store_u32(1, 1);
        if let Err(e) = self.a.synchronize() {
            die("sync A", e);
        }
        let gave_up = self.words.load_u32(2) != 0;
        (dt, gave_up, r.err().unwrap_or_default())
    }
}

#[repr(C)]
#[derive(Debug)]
struct SpinArgs {
    words: u64,
    deadline: u64,
}

/// Launches one block of 32 threads with `p` as the only parameter.
fn launch2(f: Function, s: &Stream, p: &SpinArgs) {
    // SAFETY: every kernel of this file takes one `SpinArgs` by value.
    if let Err(e) = unsafe { f.launch(1, 32, s, p) } {
        die("launch", e);
    }
}

type Op = (String, Box<dyn FnMut(&Probe) -> Result<(), String>>);

fn alloc_op(bytes: usize) -> Op {
    (
        format!("cuMemAlloc {} KiB", bytes >> 10),
        Box::new(move |_p: &Probe| {
            let mut ptr = 0;
            // SAFETY: plain allocation in the bound context; freed at once
            // after the window would be another probe, so it is leaked
            // deliberately into the process's lifetime.
            unsafe { check("cuMemAlloc", sys::cuMemAlloc_v2(&mut ptr, bytes)) }
        }),
    )
}

fn ops() -> Vec<Op> {
    let mut v: Vec<Op> = vec![
        ("nothing (negative control)".into(), Box::new(|_| Ok(()))),
        (
            "cuCtxSynchronize (positive control)".into(),
            // SAFETY: the context is current.
            Box::new(|_| check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })),
        ),
    ];
    for b in [4usize << 10, 2 << 20, 64 << 20, 1 << 30] {
        v.push(alloc_op(b));
    }
    v.push((
        "cuMemAlloc 64 KiB x 256 (the sub-allocator grows)".into(),
        Box::new(|_| {
            for _ in 0..256 {
                let mut ptr = 0;
                // SAFETY: plain allocation in the bound context; leaked.
                unsafe { check("cuMemAlloc", sys::cuMemAlloc_v2(&mut ptr, 64 << 10))? };
            }
            Ok(())
        }),
    ));
    v.push((
        "VMM: cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess 64 MiB".into(),
        Box::new(|p| vmm_map(p.ctx.dev, 64 << 20)),
    ));
    v.push((
        "cuMemFree 2 MiB (allocated before the window)".into(),
        // SAFETY: `to_free` came from cuMemAlloc and is freed only here.
        Box::new(|p| check("cuMemFree", unsafe { sys::cuMemFree_v2(p.to_free) })),
    ));
    v.push((
        "cuMemsetD8 2 MiB (legacy stream) + cuStreamSynchronize(NULL)".into(),
        Box::new(|p| {
            let m = p.scratch;
            // SAFETY: `scratch` holds 4 MiB and lives as long as the process.
            unsafe {
                check("cuMemsetD8", sys::cuMemsetD8_v2(m, 0, 2 << 20))?;
                check(
                    "cuStreamSynchronize",
                    sys::cuStreamSynchronize(std::ptr::null_mut()),
                )
            }
        }),
    ));
    v.push((
        "cuMemsetD8Async 2 MiB on stream B + sync B".into(),
        Box::new(|p| {
            let m = p.scratch;
            // SAFETY: as above.
            unsafe {
                check(
                    "cuMemsetD8Async",
                    sys::cuMemsetD8Async(m, 0, 2 << 20, p.b.raw),
                )?
            };
            p.b.synchronize().map_err(|e| e.to_string())
        }),
    ));
    // The sizes the random-collective loop zeroed (4 x count bytes, any count).
    for bytes in [148usize, 1_200_004] {
        v.push((
            format!("cuMemsetD8Async {bytes} B on stream B + sync B"),
            Box::new(move |p: &Probe| {
                // SAFETY: `scratch` holds 4 MiB and lives as long as the process.
                unsafe {
                    check(
                        "cuMemsetD8Async",
                        sys::cuMemsetD8Async(p.scratch, 0, bytes, p.b.raw),
                    )?
                };
                p.b.synchronize().map_err(|e| e.to_string())
            }),
        ));
    }
    v.push((
        "cuMemcpyHtoD 1 MiB pageable (legacy stream, synchronous)".into(),
        Box::new(|p| {
            let m = p.scratch;
            let src = vec![1u8; 1 << 20];
            // SAFETY: `scratch` holds 4 MiB; `src` outlives the synchronous copy.
            unsafe {
                check(
                    "cuMemcpyHtoD",
                    sys::cuMemcpyHtoD_v2(m, src.as_ptr().cast(), src.len()),
                )
            }
        }),
    ));
    v.push((
        "cuMemcpyHtoDAsync 1 MiB pageable on stream B + sync B".into(),
        Box::new(|p| {
            let m = p.scratch;
            let src = vec![1u8; 1 << 20];
            // SAFETY: as above; the sync below keeps `src` alive long enough.
            unsafe { p.b.write_sync(m, &src) }.map_err(|e| e.to_string())
        }),
    ));
    v.push((
        "cuMemcpyDtoHAsync 1 MiB pageable on stream B + sync B".into(),
        Box::new(|p| {
            let m = p.scratch;
            let mut dst = vec![0u8; 1 << 20];
            // SAFETY: as above.
            unsafe { p.b.read_sync(m, &mut dst) }.map_err(|e| e.to_string())
        }),
    ));
    v.extend(object_ops());
    v
}

/// Creating driver objects: events, streams, pinned and stream-ordered
/// memory, modules and functions.
fn object_ops() -> Vec<Op> {
    let mut v: Vec<Op> = Vec::new();
    v.push((
        "cuEventCreate".into(),
        Box::new(|_| {
            let mut e = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the event is leaked.
            unsafe { check("cuEventCreate", sys::cuEventCreate(&mut e, 0)) }
        }),
    ));
    v.push((
        "cuStreamCreate (non-blocking)".into(),
        Box::new(|_| {
            let mut s = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the stream is leaked.
            unsafe { check("cuStreamCreate", sys::cuStreamCreate(&mut s, 1)) }
        }),
    ));
    v.push((
        "cuMemHostAlloc 1 MiB".into(),
        Box::new(|_| {
            let mut h = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the memory is leaked.
            unsafe { check("cuMemHostAlloc", sys::cuMemHostAlloc(&mut h, 1 << 20, 0)) }
        }),
    ));
    v.push((
        "cuMemAllocAsync 2 MiB on stream B + sync B".into(),
        Box::new(|p| {
            let mut ptr = 0;
            // SAFETY: stream-ordered allocation on a live stream; leaked.
            unsafe {
                check(
                    "cuMemAllocAsync",
                    sys::cuMemAllocAsync(&mut ptr, 2 << 20, p.b.raw),
                )?
            };
            p.b.synchronize().map_err(|e| e.to_string())
        }),
    ));
    v.push((
        "cuMemAllocAsync 256 MiB on stream B + sync B (the pool grows)".into(),
        Box::new(|p| {
            let mut ptr = 0;
            // SAFETY: stream-ordered allocation on a live stream; leaked.
            unsafe {
                check(
                    "cuMemAllocAsync",
                    sys::cuMemAllocAsync(&mut ptr, 256 << 20, p.b.raw),
                )?
            };
            p.b.synchronize().map_err(|e| e.to_string())
        }),
    ));
    v.push((
        "cuModuleLoadData (a new module)".into(),
        Box::new(|p| {
            let m = Module::load(&p.ctx, &p.lazy_cubin).map_err(|e| e.to_string())?;
            std::mem::forget(m);
            Ok(())
        }),
    ));
    v.push((
        "cuModuleGetFunction + first launch on stream B (module loaded before) + sync B".into(),
        Box::new(|p| first_launch(p, "probe_lazy")),
    ));
    v.push((
        "cuFuncLoad of a function not launched yet (module loaded before)".into(),
        Box::new(|_| {
            let m = LAZY
                .with(|c| c.borrow().clone())
                .ok_or("lazy module not preloaded")?;
            let f = m.function("probe_lazy2").map_err(|e| e.to_string())?;
            f.load().map_err(|e| e.to_string())
        }),
    ));
    v
}

/// Loads the lazy module outside any window, then (inside it) gets a
/// function and launches it for the first time.
fn first_launch(p: &Probe, name: &str) -> Result<(), String> {
    let m = LAZY
        .with(|c| c.borrow().clone())
        .ok_or("lazy module not preloaded")?;
    let f = m.function(name).map_err(|e| e.to_string())?;
    let a = SpinArgs {
        words: 0,
        deadline: 0,
    };
    launch2(f, &p.b, &a);
    p.b.synchronize().map_err(|e| e.to_string())
}

thread_local! {
    static LAZY: std::cell::RefCell<Option<Arc<Module>>> = const { std::cell::RefCell::new(None) };
}

/// Maps `bytes` of fresh VMM memory on `dev`, readable and writable
/// there (leaked).
fn vmm_map(dev: sys::CUdevice, bytes: usize) -> Result<(), String> {
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    let (mut handle, mut va) = (0, 0);
    // SAFETY: valid out-pointers and properties; the mapping is leaked.
    unsafe {
        check(
            "cuMemCreate",
            sys::cuMemCreate(&mut handle, bytes, &prop, 0),
        )?;
        check(
            "cuMemAddressReserve",
            sys::cuMemAddressReserve(&mut va, bytes, 0, 0, 0),
        )?;
        check("cuMemMap", sys::cuMemMap(va, bytes, 0, handle, 0))?;
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        check("cuMemSetAccess", sys::cuMemSetAccess(va, bytes, &access, 1))
    }
}

/// Keeps an allocation for the process's life (its free would be probed
/// too) and returns its address.
fn keep(m: oxccl_cuda::Result<DevMem>) -> Result<u64, String> {
    let m = m.map_err(|e| e.to_string())?;
    let p = m.ptr;
    std::mem::forget(m);
    Ok(p)
}

fn main() {
    if let Err(e) = oxccl_cuda::driver::init() {
        die("init", e);
    }
    let ctx = Ctx::new(0).unwrap_or_else(|e| die("context", e));
    let mut mode = sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING;
    // SAFETY: valid out-pointer; the driver is initialised.
    let r = unsafe { sys::cuModuleGetLoadingMode(&mut mode) };
    println!(
        "CUDA_MODULE_LOADING={:?}; driver loading mode {mode:?} ({r:?}); CUDA_DEVICE_MAX_CONNECTIONS={:?}",
        std::env::var("CUDA_MODULE_LOADING").ok(),
        std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok()
    );
    let arch = {
        use sys::CUdevice_attribute as A;
        let ma = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        let mi = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        match (ma, mi) {
            (Ok(a), Ok(b)) => (a * 10 + b) as u32,
            _ => die("arch", "attribute query failed"),
        }
    };
    let cubin = compile_source(SPIN_SRC, "probe_spin", arch).unwrap_or_else(|e| die("nvrtc", e));
    let lazy_cubin =
        compile_source(LAZY_SRC, "probe_lazy", arch).unwrap_or_else(|e| die("nvrtc", e));
    let module = Module::load(&ctx, &cubin).unwrap_or_else(|e| die("load", e));
    let spin = module
        .function("probe_spin")
        .unwrap_or_else(|e| die("function", e));
    let p = Probe {
        a: Stream::new(&ctx).unwrap_or_else(|e| die("stream", e)),
        b: Stream::new(&ctx).unwrap_or_else(|e| die("stream", e)),
        words: HostMapped::zeroed(&ctx, 64).unwrap_or_else(|e| die("host words", e)),
        spin,
        _spin_module: module,
        lazy_cubin,
        scratch: 0,
        to_free: 0,
        ctx,
    };
    let mut p = p;
    p.scratch = keep(DevMem::zeroed(&p.ctx, 4 << 20)).unwrap_or_else(|e| die("scratch", e));
    p.to_free = keep(DevMem::zeroed(&p.ctx, 2 << 20)).unwrap_or_else(|e| die("to_free", e));
    // The spinner's own first launch (lazy loading) happens here, released
    // at once, outside any window.
    p.words.store_u32(1, 1);
    p.launch_spin();
    if let Err(e) = p.a.synchronize() {
        die("warm-up", e);
    }
    let lazy = Module::load(&p.ctx, &p.lazy_cubin).unwrap_or_else(|e| die("load lazy", e));
    LAZY.with(|c| *c.borrow_mut() = Some(Arc::new(lazy)));
    println!(
        "{:<80} {:>9}  verdict",
        "call made while a kernel spins on stream A", "ms"
    );
    let mut blocked = 0;
    for (name, mut op) in ops() {
        let (dt, gave_up, err) = p.window(&mut *op);
        let verdict = if gave_up {
            blocked += 1;
            "WAITS for the running kernel"
        } else {
            "returns while it runs"
        };
        let err = if err.is_empty() {
            String::new()
        } else {
            format!(" (error: {err})")
        };
        println!("{name:<80} {:>9.3}  {verdict}{err}", dt.as_secs_f64() * 1e3);
    }
    println!("{blocked} calls waited for the running kernel (the positive control is one)");
}
