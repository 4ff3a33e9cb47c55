//! What the C ABI adds per call over the Rust call, and what PyTorch's
//! call pattern adds over a plain C loop: an 8-byte f32 AllReduce on the
//! host backend, N rank threads of this process, wall time per call.
//!
//! Paths, each a run of CALLS calls per rank behind a barrier, interleaved
//! run by run (so a loaded machine slows each path alike):
//!
//! - `rust`: `Communicator::all_reduce` on buffers from `comm.alloc`.
//! - `rust-raw`: `Communicator::collective_raw` on plain host memory, the
//!   facade entry the C ABI calls.
//! - `capi`: `ncclAllReduce` through the built `libnccl.so.2` (loaded with
//!   `dlopen`, communicators from `ncclCommInitAll`), as nccl-tests calls it.
//! - `torch`: `capi` under PyTorch's pattern with a blocking communicator
//!   (its default): per call only the collective, whose result is checked;
//!   beside it a watchdog thread that calls `ncclCommGetAsyncError` on
//!   every communicator each WATCHDOG_US (PyTorch: each outstanding work
//!   item every 100 ms).
//! - `torch-nb`: `torch` with a nonblocking communicator's extra call:
//!   `ncclCommGetAsyncError` on the calling thread before each collective
//!   (PyTorch's comm getter waits for the communicator to be ready that way).
//!
//! PyTorch's CUDA work per call (event records, stream waits) is not the
//! library's and has nothing to run on here; it is left out.
//!
//! `capi_call_cost [RANKS] [CALLS] [RUNS] [WATCHDOG_US]`, default
//! `2 2000 15 100000`. Build the library first, release mode:
//! `cargo build --release -p oxccl-capi`; `OXCCL_CAPI_LIB` names the file,
//! else `liboxccl_capi.so` next to this program's folder is used. Reported
//! per path: the median run's ns per call (slowest rank of each run) and
//! the runs' spread (min..max). `OXCCL_CHECK_CALLS=0` turns the call check
//! off in both libraries.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use oxccl::{BackendKind, CollKind, Communicator, Config, DataType, RawColl, RawStream, RedOp};
use oxccl_bench::median;

type Comm = *mut c_void;
type InitAll = unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> c_int;
type AsyncError = unsafe extern "C" fn(Comm, *mut c_int) -> c_int;
type Destroy = unsafe extern "C" fn(Comm) -> c_int;
type LastError = unsafe extern "C" fn(Comm) -> *const c_char;

const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;
const WARMUP: u32 = 50;

/// The C entry points this bench calls, bound once.
struct Api {
    _lib: libloading::Library,
    init_all: InitAll,
    all_reduce: AllReduce,
    async_error: AsyncError,
    destroy: Destroy,
    last_error: LastError,
}

impl Api {
    fn load() -> Result<Api, String> {
        let path = match std::env::var_os("OXCCL_CAPI_LIB") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| e.to_string())?
                .parent()
                .and_then(|d| d.parent())
                .ok_or("no folder above this program")?
                .join("liboxccl_capi.so"),
        };
        // SAFETY: the library is oxccl's own C ABI; its initialisers only
        // set up statics.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            format!(
                "{}: {e} (build it: cargo build --release -p oxccl-capi)",
                path.display()
            )
        })?;
        // SAFETY: each symbol has the type NCCL's header gives it.
        unsafe {
            Ok(Api {
                init_all: *lib.get(b"ncclCommInitAll\0").map_err(|e| e.to_string())?,
                all_reduce: *lib.get(b"ncclAllReduce\0").map_err(|e| e.to_string())?,
                async_error: *lib
                    .get(b"ncclCommGetAsyncError\0")
                    .map_err(|e| e.to_string())?,
                destroy: *lib.get(b"ncclCommDestroy\0").map_err(|e| e.to_string())?,
                last_error: *lib.get(b"ncclGetLastError\0").map_err(|e| e.to_string())?,
                _lib: lib,
            })
        }
    }

    fn fail(&self, what: &str, r: c_int, comm: Comm) -> String {
        // SAFETY: the library returns a NUL-terminated string it keeps.
        let msg = unsafe { CStr::from_ptr((self.last_error)(comm)) };
        format!("{what} returned {r}: {}", msg.to_string_lossy())
    }
}

/// A communicator handle crossing into the rank threads (a token the
/// library looks up; it is safe from any thread).
#[derive(Clone, Copy)]
struct Handle(Comm);
// SAFETY: NCCL handles may be used from any thread; this library's are
// table tokens.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Rust,
    RustRaw,
    Capi,
    Torch,
    TorchNb,
}

const PATHS: [Path; 5] = [
    Path::Rust,
    Path::RustRaw,
    Path::Capi,
    Path::Torch,
    Path::TorchNb,
];

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Rust => "rust",
            Path::RustRaw => "rust-raw",
            Path::Capi => "capi",
            Path::Torch => "torch",
            Path::TorchNb => "torch-nb",
        }
    }

    fn watchdog(self) -> bool {
        matches!(self, Path::Torch | Path::TorchNb)
    }
}

/// One rank's loop of `calls` calls on `path`.
fn calls_on(
    path: Path,
    calls: u32,
    api: &Api,
    rust: &Communicator,
    bufs: (&oxccl::Buffer<f32>, &oxccl::Buffer<f32>),
    host: &mut [f32; 4],
    c: Handle,
) -> Result<(), String> {
    let (send, recv) = (
        host.as_ptr() as *const c_void,
        host[2..].as_mut_ptr() as *mut c_void,
    );
    for _ in 0..calls {
        match path {
            Path::Rust => rust
                .all_reduce(bufs.0, bufs.1, RedOp::Sum)
                .map_err(|e| e.to_string())?,
            Path::RustRaw => {
                let call = RawColl {
                    kind: CollKind::AllReduce,
                    send,
                    recv,
                    count: 2,
                    dtype: DataType::F32,
                    op: RedOp::Sum,
                    root: 0,
                };
                // SAFETY: host memory of this thread, 2 f32 each way, alive
                // across the call (the host backend completes it at once).
                unsafe { rust.collective_raw(call, RawStream(0)) }.map_err(|e| e.to_string())?
            }
            Path::Capi | Path::Torch | Path::TorchNb => {
                if path == Path::TorchNb {
                    let mut state: c_int = 0;
                    // SAFETY: a live handle and a writable result slot.
                    let r = unsafe { (api.async_error)(c.0, &mut state) };
                    if r != 0 || state != 0 {
                        return Err(api.fail("ncclCommGetAsyncError", r.max(state), c.0));
                    }
                }
                // SAFETY: as for RustRaw; the stream is ignored on host.
                let r = unsafe {
                    (api.all_reduce)(
                        send,
                        recv,
                        2,
                        NCCL_FLOAT32,
                        NCCL_SUM,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                if r != 0 {
                    return Err(api.fail("ncclAllReduce", r, c.0));
                }
            }
        }
    }
    Ok(())
}

struct Setup {
    calls: u32,
    runs: usize,
    watchdog: Duration,
}

/// Every path's ns per call, one entry per run (slowest rank of the run).
fn measure(
    api: &Api,
    rust: &[Communicator],
    c: &[Handle],
    s: &Setup,
) -> Result<Vec<Vec<f64>>, String> {
    let n = rust.len();
    let bar = Barrier::new(n);
    let polling = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    // times[path][run][rank]
    let times = Mutex::new(vec![vec![vec![0.0f64; n]; s.runs]; PATHS.len()]);
    std::thread::scope(|scope| -> Result<(), String> {
        scope.spawn(|| {
            // PyTorch's watchdog: polls each communicator's async error.
            while !stop.load(Ordering::Relaxed) {
                if polling.load(Ordering::Relaxed) {
                    for h in c {
                        let mut state: c_int = 0;
                        // SAFETY: live handles, a writable slot.
                        unsafe { (api.async_error)(h.0, &mut state) };
                    }
                }
                std::thread::sleep(s.watchdog);
            }
        });
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let (bar, polling, times) = (&bar, &polling, &times);
                scope.spawn(move || -> Result<(), String> {
                    let comm = &rust[r];
                    let a = comm.alloc::<f32>(2).map_err(|e| e.to_string())?;
                    let b = comm.alloc::<f32>(2).map_err(|e| e.to_string())?;
                    let mut host = [1.0f32; 4];
                    for p in PATHS {
                        calls_on(p, WARMUP, api, comm, (&a, &b), &mut host, c[r])?;
                    }
                    for run in 0..s.runs {
                        for (i, p) in PATHS.into_iter().enumerate() {
                            bar.wait();
                            if r == 0 {
                                polling.store(p.watchdog(), Ordering::Relaxed);
                            }
                            bar.wait();
                            let t = Instant::now();
                            calls_on(p, s.calls, api, comm, (&a, &b), &mut host, c[r])?;
                            let ns = t.elapsed().as_secs_f64() * 1e9 / f64::from(s.calls.max(1));
                            times.lock().map_err(|e| e.to_string())?[i][run][r] = ns;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut first = Ok(());
        for h in ranks {
            let r = h
                .join()
                .unwrap_or_else(|_| Err("a rank thread panicked".into()));
            if first.is_ok() {
                first = r;
            }
        }
        stop.store(true, Ordering::Relaxed);
        first
    })?;
    let times = times.into_inner().map_err(|e| e.to_string())?;
    Ok(times
        .into_iter()
        .map(|runs| {
            runs.into_iter()
                .map(|ranks| ranks.into_iter().fold(0.0, f64::max))
                .collect()
        })
        .collect())
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut next = |d: u64| args.next().and_then(|a| a.parse().ok()).unwrap_or(d);
    let n = next(2) as u32;
    let setup = Setup {
        calls: next(2000) as u32,
        runs: next(15) as usize,
        watchdog: Duration::from_micros(next(100_000)),
    };
    if std::env::var_os("OXCCL_BACKEND").is_none() {
        // Before any thread starts: the C library reads it at init.
        std::env::set_var("OXCCL_BACKEND", "host");
    }
    let api = Api::load()?;
    let mut config = Config::from_env().map_err(|e| e.to_string())?;
    config.backend = BackendKind::Host;
    let rust = oxccl::init_all_with(n, config).map_err(|e| e.to_string())?;
    let mut raw: Vec<Comm> = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: room for n handles; no device list (host backend).
    let r = unsafe { (api.init_all)(raw.as_mut_ptr(), n as c_int, std::ptr::null()) };
    if r != 0 {
        return Err(api.fail("ncclCommInitAll", r, std::ptr::null_mut()));
    }
    let c: Vec<Handle> = raw.iter().map(|&h| Handle(h)).collect();
    let result = measure(&api, &rust, &c, &setup);
    for h in &c {
        // SAFETY: live handles, destroyed once.
        unsafe { (api.destroy)(h.0) };
    }
    let per_path = result?;
    println!(
        "capi_call_cost: 8 B f32 allreduce, host backend, {n} rank threads, {} cores, check {}, watchdog every {} us; \
         ns per call, median of {} interleaved runs of {} calls (slowest rank), [min..max]",
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        if std::env::var("OXCCL_CHECK_CALLS").as_deref() == Ok("0") { "off" } else { "on" },
        setup.watchdog.as_micros(),
        setup.runs,
        setup.calls
    );
    let base = median(per_path[0].clone());
    for (p, runs) in PATHS.iter().zip(per_path) {
        let lo = runs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = runs.iter().copied().fold(0.0, f64::max);
        let m = median(runs);
        println!(
            "  {:<9} {m:>8.0}  [{lo:.0}..{hi:.0}]  {:+.0} over rust",
            p.name(),
            m - base
        );
    }
    Ok(())
}
