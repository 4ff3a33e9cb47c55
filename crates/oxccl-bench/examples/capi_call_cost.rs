//! What the C ABI adds per call over the Rust call, and what PyTorch's
//! call pattern adds over a plain C loop: an 8-byte f32 AllReduce on the
//! host backend, N rank threads of this process, wall time per call.
//!
//! Paths, each a run of CALLS calls per rank behind a barrier, interleaved
//! run by run (so a loaded machine slows each path alike):
//!
//! - `rust`: `Communicator::all_reduce` on buffers from `comm.alloc`.
//! - `rust-unchecked`: the same on communicators made with
//!   `check_calls(false)`: what the call check costs.
//! - `rust-raw`: `Communicator::collective_raw` on plain host memory, the
//!   facade entry the C ABI calls.
//! - `rust-grouped`: `rust` inside `oxccl::group` (a group of one
//!   collective, which runs as the lone call).
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
//! - `grouped`: `capi` inside `ncclGroupStart`/`ncclGroupEnd`, as PyTorch
//!   groups coalesced calls (and, in older releases that drove several
//!   devices per process, every collective).
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
//! off in both libraries. `OXCCL_CAPI_LIB_B` names a second build of the
//! library (a copy of the file from before a change): its three C paths
//! then run too, named with `.b`, interleaved with the others, which makes a
//! before/after comparison on a loaded machine. `OXCCL_CALL_COST_PATHS`
//! (names, comma-separated) runs only those paths: with `perf stat -e
//! instructions:u` at two call counts, a path's instructions per call,
//! which a loaded machine does not change.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
type GroupCall = unsafe extern "C" fn() -> c_int;
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
    group_start: GroupCall,
    group_end: GroupCall,
    destroy: Destroy,
    last_error: LastError,
}

impl Api {
    /// The library named by `var`, else (`default`) the build next to this
    /// program's folder.
    fn load(var: &str, default: bool) -> Result<Option<Api>, String> {
        let path = match std::env::var_os(var) {
            Some(p) => PathBuf::from(p),
            None if default => std::env::current_exe()
                .map_err(|e| e.to_string())?
                .parent()
                .and_then(|d| d.parent())
                .ok_or("no folder above this program")?
                .join("liboxccl_capi.so"),
            None => return Ok(None),
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
            Ok(Some(Api {
                init_all: *lib.get(b"ncclCommInitAll\0").map_err(|e| e.to_string())?,
                all_reduce: *lib.get(b"ncclAllReduce\0").map_err(|e| e.to_string())?,
                async_error: *lib
                    .get(b"ncclCommGetAsyncError\0")
                    .map_err(|e| e.to_string())?,
                group_start: *lib.get(b"ncclGroupStart\0").map_err(|e| e.to_string())?,
                group_end: *lib.get(b"ncclGroupEnd\0").map_err(|e| e.to_string())?,
                destroy: *lib.get(b"ncclCommDestroy\0").map_err(|e| e.to_string())?,
                last_error: *lib.get(b"ncclGetLastError\0").map_err(|e| e.to_string())?,
                _lib: lib,
            }))
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

/// A loaded library and its communicators (one per rank).
struct Lib {
    api: Api,
    comms: Vec<Handle>,
}

/// A path; the C ones name their library (0, or 1 for `.b`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Rust,
    RustUnchecked,
    RustRaw,
    RustGrouped,
    Capi(usize),
    Torch(usize),
    TorchNb(usize),
    Grouped(usize),
}

impl Path {
    fn all(libs: usize) -> Vec<Path> {
        let mut v = vec![
            Path::Rust,
            Path::RustUnchecked,
            Path::RustRaw,
            Path::RustGrouped,
        ];
        for l in 0..libs {
            v.extend([
                Path::Capi(l),
                Path::Torch(l),
                Path::TorchNb(l),
                Path::Grouped(l),
            ]);
        }
        v
    }

    fn name(self) -> String {
        let (name, lib) = match self {
            Path::Rust => ("rust", 0),
            Path::RustUnchecked => ("rust-unchecked", 0),
            Path::RustRaw => ("rust-raw", 0),
            Path::RustGrouped => ("rust-grouped", 0),
            Path::Capi(l) => ("capi", l),
            Path::Torch(l) => ("torch", l),
            Path::TorchNb(l) => ("torch-nb", l),
            Path::Grouped(l) => ("grouped", l),
        };
        if lib == 0 {
            name.into()
        } else {
            format!("{name}.b")
        }
    }

    /// The library whose communicators the watchdog polls meanwhile.
    fn watchdog(self) -> Option<usize> {
        match self {
            Path::Torch(l) | Path::TorchNb(l) => Some(l),
            _ => None,
        }
    }
}

/// A rank's communicator of the Rust paths, and its buffers.
struct Own<'a> {
    comm: &'a Communicator,
    send: oxccl::Buffer<f32>,
    recv: oxccl::Buffer<f32>,
}

impl<'a> Own<'a> {
    fn new(comm: &'a Communicator) -> Result<Own<'a>, String> {
        Ok(Own {
            comm,
            send: comm.alloc::<f32>(2).map_err(|e| e.to_string())?,
            recv: comm.alloc::<f32>(2).map_err(|e| e.to_string())?,
        })
    }
}

/// One rank's loop of `calls` calls on `path`.
fn calls_on(
    path: Path,
    calls: u32,
    libs: &[Lib],
    rank: usize,
    rust: &[Own<'_>; 2],
    host: &mut [f32; 4],
) -> Result<(), String> {
    let (send, recv) = (
        host.as_ptr() as *const c_void,
        host[2..].as_mut_ptr() as *mut c_void,
    );
    for _ in 0..calls {
        match path {
            Path::Rust | Path::RustUnchecked => {
                let o = &rust[usize::from(path == Path::RustUnchecked)];
                o.comm
                    .all_reduce(&o.send, &o.recv, RedOp::Sum)
                    .map_err(|e| e.to_string())?
            }
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
                unsafe { rust[0].comm.collective_raw(call, RawStream(0)) }
                    .map_err(|e| e.to_string())?
            }
            Path::RustGrouped => {
                let o = &rust[0];
                oxccl::group(|g| g.all_reduce(o.comm, &o.send, &o.recv, RedOp::Sum))
                    .map_err(|e| e.to_string())?
            }
            Path::Capi(l) | Path::Torch(l) | Path::TorchNb(l) | Path::Grouped(l) => {
                let (api, c) = (&libs[l].api, libs[l].comms[rank]);
                if path == Path::TorchNb(l) {
                    let mut state: c_int = 0;
                    // SAFETY: a live handle and a writable result slot.
                    let r = unsafe { (api.async_error)(c.0, &mut state) };
                    if r != 0 || state != 0 {
                        return Err(api.fail("ncclCommGetAsyncError", r.max(state), c.0));
                    }
                }
                let grouped = path == Path::Grouped(l);
                // SAFETY: no arguments; this thread's group.
                if grouped && unsafe { (api.group_start)() } != 0 {
                    return Err(api.fail("ncclGroupStart", 1, c.0));
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
                if grouped {
                    // SAFETY: closes the group opened above.
                    let r = unsafe { (api.group_end)() };
                    if r != 0 {
                        return Err(api.fail("ncclGroupEnd", r, c.0));
                    }
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
    libs: &[Lib],
    paths: &[Path],
    rust: [&[Communicator]; 2],
    s: &Setup,
) -> Result<Vec<Vec<f64>>, String> {
    let n = rust[0].len();
    let bar = Barrier::new(n);
    // 0: the watchdog rests; l + 1: it polls library l's communicators.
    let polling = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // times[path][run][rank]
    let times = Mutex::new(vec![vec![vec![0.0f64; n]; s.runs]; paths.len()]);
    std::thread::scope(|scope| -> Result<(), String> {
        scope.spawn(|| {
            // PyTorch's watchdog: polls each communicator's async error.
            while !stop.load(Ordering::Relaxed) {
                let active = polling.load(Ordering::Relaxed).checked_sub(1);
                if let Some(lib) = active.map(|l| &libs[l]) {
                    for h in &lib.comms {
                        let mut state: c_int = 0;
                        // SAFETY: live handles, a writable slot.
                        unsafe { (lib.api.async_error)(h.0, &mut state) };
                    }
                }
                std::thread::sleep(s.watchdog);
            }
        });
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let (bar, polling, times) = (&bar, &polling, &times);
                scope.spawn(move || -> Result<(), String> {
                    let own = [Own::new(&rust[0][r])?, Own::new(&rust[1][r])?];
                    let mut host = [1.0f32; 4];
                    for &p in paths {
                        calls_on(p, WARMUP, libs, r, &own, &mut host)?;
                    }
                    for run in 0..s.runs {
                        for (i, &p) in paths.iter().enumerate() {
                            bar.wait();
                            if r == 0 {
                                polling.store(p.watchdog().map_or(0, |l| l + 1), Ordering::Relaxed);
                            }
                            bar.wait();
                            let t = Instant::now();
                            calls_on(p, s.calls, libs, r, &own, &mut host)?;
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
    let mut config = Config::from_env().map_err(|e| e.to_string())?;
    config.backend = BackendKind::Host;
    let rust = oxccl::init_all_with(n, config.clone()).map_err(|e| e.to_string())?;
    config.check_calls = false;
    let unchecked = oxccl::init_all_with(n, config).map_err(|e| e.to_string())?;
    let mut libs = Vec::new();
    for (var, default) in [("OXCCL_CAPI_LIB", true), ("OXCCL_CAPI_LIB_B", false)] {
        let Some(api) = Api::load(var, default)? else {
            continue;
        };
        let mut raw: Vec<Comm> = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: room for n handles; no device list (host backend).
        let r = unsafe { (api.init_all)(raw.as_mut_ptr(), n as c_int, std::ptr::null()) };
        if r != 0 {
            return Err(api.fail("ncclCommInitAll", r, std::ptr::null_mut()));
        }
        let comms = raw.into_iter().map(Handle).collect();
        libs.push(Lib { api, comms });
    }
    let mut paths = Path::all(libs.len());
    if let Ok(only) = std::env::var("OXCCL_CALL_COST_PATHS") {
        let only: Vec<&str> = only.split(',').collect();
        paths.retain(|p| only.contains(&p.name().as_str()));
    }
    let result = measure(&libs, &paths, [&rust, &unchecked], &setup);
    for lib in &libs {
        for h in &lib.comms {
            // SAFETY: live handles, destroyed once.
            unsafe { (lib.api.destroy)(h.0) };
        }
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
    for (p, runs) in paths.iter().zip(per_path) {
        let lo = runs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = runs.iter().copied().fold(0.0, f64::max);
        let m = median(runs);
        println!(
            "  {:<14} {m:>8.0}  [{lo:.0}..{hi:.0}]  {:+.0} over rust",
            p.name(),
            m - base
        );
    }
    Ok(())
}
