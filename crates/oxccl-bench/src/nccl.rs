//! NCCL as a baseline: the machine's `libnccl.so.2`, loaded at run time,
//! driven on the same device buffers oxccl uses, so a sweep can put both
//! libraries' times side by side.
//!
//! Nothing here links NCCL: the library is opened with `dlopen` on first
//! use (`OXCCL_NCCL_LIB` names a file, else `libnccl.so.2`, else
//! `libnccl.so`), so binaries build and test on machines without it, where
//! [`Nccl::new`] returns [`BenchError::Nccl`] with [`NcclWhy::Absent`].
//!
//! One process drives every rank (`ncclCommInitAll`, one GPU per rank).
//! Refused before NCCL is touched, each with its own [`NcclWhy`]:
//! several ranks on one GPU (NCCL fails with "Duplicate GPU detected"),
//! and `NCCL_NVLS_ENABLE` set to anything but `0` (NVLink multicast may take
//! shared GPUs out of service; when unset it is set to `0` here).
//!
//! Each rank has its own non-blocking stream on its device's primary
//! context (the context oxccl's ranks use); callers order oxccl's work and
//! NCCL's on one buffer by synchronizing between them. Every wait polls
//! with a deadline and aborts the communicators when it passes.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use oxccl_core::{CollKind, DataType, RedOp};

use oxccl_cuda::driver::{Ctx, DevMem, Event, Stream};
use oxccl_cuda::CudaError;

use crate::error::{BenchError, Result};

/// Environment variable naming the NCCL library file to load.
pub const NCCL_LIB_ENV: &str = "OXCCL_NCCL_LIB";
/// NCCL's switch for NVLink SHARP (multicast); must be `0` here.
pub const NVLS_ENV: &str = "NCCL_NVLS_ENABLE";
const DEFAULT_LIBS: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

pub use crate::error::NcclWhy;

fn err(why: NcclWhy, detail: impl Into<String>) -> BenchError {
    BenchError::Nccl {
        why,
        detail: detail.into(),
    }
}

/// The reason, if `e` is an NCCL refusal or failure.
pub fn why(e: &BenchError) -> Option<NcclWhy> {
    match e {
        BenchError::Nccl { why, .. } => Some(*why),
        _ => None,
    }
}

/// Checks that no two ranks share a GPU (`devices[r]` is rank `r`'s
/// ordinal); NCCL fails such a clique with "Duplicate GPU detected".
pub fn check_placement(devices: &[i32]) -> Result<()> {
    if devices.is_empty() {
        return Err(BenchError::Invalid("NCCL clique of zero ranks".into()));
    }
    for (r, d) in devices.iter().enumerate() {
        if let Some(first) = devices[..r].iter().position(|x| x == d) {
            return Err(err(
                NcclWhy::SharedGpu,
                format!(
                    "ranks {first} and {r} both on GPU {d} ({} ranks on {} GPUs); NCCL needs one GPU per rank",
                    devices.len(),
                    distinct(devices)
                ),
            ));
        }
    }
    Ok(())
}

fn distinct(devices: &[i32]) -> usize {
    let mut d = devices.to_vec();
    d.sort_unstable();
    d.dedup();
    d.len()
}

/// What to do about `NCCL_NVLS_ENABLE` given its current value: `Ok(true)`
/// when it is unset and must be set to `0`, `Ok(false)` when it is `0`.
pub fn nvls_check(value: Option<&OsStr>) -> Result<bool> {
    match value {
        None => Ok(true),
        Some(v) if v.to_str().map(str::trim) == Some("0") => Ok(false),
        Some(v) => Err(err(
            NcclWhy::Nvls,
            format!(
                "{NVLS_ENV}={v:?}: NVLink multicast must stay off on these machines; unset it or set it to 0"
            ),
        )),
    }
}

/// Sets `NCCL_NVLS_ENABLE=0` if unset; refuses any other value.
fn nvls_guard() -> Result<()> {
    // One lock so two cliques made at once do not both write the variable.
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if nvls_check(std::env::var_os(NVLS_ENV).as_deref())? {
        // NCCL reads the variable at communicator creation, after this.
        std::env::set_var(NVLS_ENV, "0");
    }
    Ok(())
}

type Res = c_int;
type Comm = *mut c_void;
type CuStream = sys::CUstream;

/// `(send, recv, count, datatype, op or root, comm, stream)`: AllReduce,
/// Broadcast and ReduceScatter share this shape.
type CollFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CuStream) -> Res;

/// The NCCL entry points used here (ABI of `nccl.h`; enums are C ints).
struct Api {
    _lib: libloading::Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    destroy: unsafe extern "C" fn(Comm) -> Res,
    abort: unsafe extern "C" fn(Comm) -> Res,
    async_error: unsafe extern "C" fn(Comm, *mut Res) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    all_reduce: CollFn,
    broadcast: CollFn,
    reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        CuStream,
    ) -> Res,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, CuStream) -> Res,
    reduce_scatter: CollFn,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, CuStream) -> Res,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, CuStream) -> Res,
    premulsum: unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> Res,
    op_destroy: unsafe extern "C" fn(c_int, Comm) -> Res,
}

/// `ncclScalarHostImmediate`: the PreMulSum scalar is read at the call.
const SCALAR_HOST_IMMEDIATE: c_int = 1;

impl Api {
    /// The library, opened once per process.
    fn get() -> Result<&'static Api> {
        static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
        API.get_or_init(Api::load)
            .as_ref()
            .map_err(|d| err(NcclWhy::Absent, d.clone()))
    }

    fn load() -> std::result::Result<Api, String> {
        let names: Vec<String> = match std::env::var(NCCL_LIB_ENV) {
            Ok(p) if !p.is_empty() => vec![p],
            _ => DEFAULT_LIBS.iter().map(|s| s.to_string()).collect(),
        };
        Api::load_from(&names)
    }

    /// Opens the first of `names` that loads.
    fn load_from(names: &[String]) -> std::result::Result<Api, String> {
        let mut tried = Vec::new();
        for name in names {
            // SAFETY: loading runs the library's initialisers; NCCL's only
            // set up its own state.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Api::bind(lib).map_err(|e| format!("{name}: {e}")),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "no NCCL library could be loaded (set {NCCL_LIB_ENV} to its path): {}",
            tried.join("; ")
        ))
    }

    fn bind(lib: libloading::Library) -> std::result::Result<Api, libloading::Error> {
        /// Looks a symbol up as the function type of the field it fills.
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the field's type is the symbol's C signature in
                // nccl.h (enums passed as int), and the library outlives
                // the pointer: both live in the same `Api`.
                *unsafe { lib.get(concat!($name, "\0").as_bytes())? }
            };
        }
        Ok(Api {
            get_version: sym!("ncclGetVersion"),
            error_string: sym!("ncclGetErrorString"),
            init_all: sym!("ncclCommInitAll"),
            destroy: sym!("ncclCommDestroy"),
            abort: sym!("ncclCommAbort"),
            async_error: sym!("ncclCommGetAsyncError"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            all_reduce: sym!("ncclAllReduce"),
            broadcast: sym!("ncclBroadcast"),
            reduce: sym!("ncclReduce"),
            all_gather: sym!("ncclAllGather"),
            reduce_scatter: sym!("ncclReduceScatter"),
            send: sym!("ncclSend"),
            recv: sym!("ncclRecv"),
            premulsum: sym!("ncclRedOpCreatePreMulSum"),
            op_destroy: sym!("ncclRedOpDestroy"),
            _lib: lib,
        })
    }

    fn check(&self, call: &str, r: Res) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for any result code.
        let s = unsafe { (self.error_string)(r) };
        let text = if s.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated static string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        Err(err(NcclWhy::Call, format!("{call} returned {r} ({text})")))
    }
}

/// The GPU a device pointer lives on.
pub fn device_of(ptr: u64) -> Result<i32> {
    oxccl_cuda::driver::init()?;
    let mut ord: c_int = -1;
    // SAFETY: `ord` is a valid out-pointer for this attribute (an int).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ord as *mut c_int).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    r.result()
        .map_err(|e| CudaError::driver("cuPointerGetAttribute", e))?;
    Ok(ord)
}

/// One NCCL operation, in oxccl's terms (`count` as in
/// `oxccl_core::Collective`: per rank for AllGather, ReduceScatter,
/// AllToAll, Gather and Scatter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NcclCall {
    pub kind: CollKind,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: u32,
}

pub use crate::latency::Latency;

/// One rank of an NCCL clique.
#[derive(Debug)]
pub struct NcclRank {
    rank: u32,
    nranks: u32,
    device: i32,
    ctx: Arc<Ctx>,
    stream: Stream,
    /// The communicator; the lock keeps one thread enqueueing on it at once.
    comm: Mutex<CommHandle>,
}

#[derive(Debug)]
struct CommHandle(Comm);

// SAFETY: an NCCL communicator may be used from any thread, one at a time
// (the mutex around it).
unsafe impl Send for CommHandle {}

/// NCCL communicators for every rank of this process, one GPU each.
#[derive(Debug)]
pub struct Nccl {
    version: i32,
    ranks: Vec<NcclRank>,
    timeout: Duration,
}

impl Nccl {
    /// Makes one communicator per entry of `devices` (rank `r` on GPU
    /// `devices[r]`). Refuses shared GPUs, `NCCL_NVLS_ENABLE` other than
    /// 0 and a missing library before calling NCCL.
    pub fn new(devices: &[i32], timeout: Duration) -> Result<Nccl> {
        check_placement(devices)?;
        nvls_guard()?;
        let api = Api::get()?;
        let count = oxccl_cuda::driver::device_count()?;
        if let Some(bad) = devices.iter().find(|&&d| d < 0 || d >= count) {
            return Err(BenchError::Invalid(format!(
                "GPU {bad} does not exist ({count} visible)"
            )));
        }
        let mut version: c_int = 0;
        // SAFETY: valid out-pointer.
        api.check("ncclGetVersion", unsafe { (api.get_version)(&mut version) })?;
        let n = devices.len();
        let mut ranks = Vec::with_capacity(n);
        let mut ctxs = Vec::with_capacity(n);
        for &d in devices {
            let ctx = Ctx::new(d)?;
            ranks.push(Stream::new(&ctx)?);
            ctxs.push(ctx);
        }
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); n];
        let nranks = c_int::try_from(n)
            .map_err(|_| BenchError::Invalid(format!("{n} ranks is too many")))?;
        // SAFETY: `comms` has room for `n` handles and `devices` holds `n`
        // distinct, existing ordinals (checked above).
        api.check("ncclCommInitAll", unsafe {
            (api.init_all)(comms.as_mut_ptr(), nranks, devices.as_ptr())
        })?;
        let ranks = ranks
            .into_iter()
            .zip(ctxs)
            .zip(comms)
            .enumerate()
            .map(|(r, ((stream, ctx), comm))| NcclRank {
                rank: r as u32,
                nranks: n as u32,
                device: devices[r],
                ctx,
                stream,
                comm: Mutex::new(CommHandle(comm)),
            })
            .collect();
        Ok(Nccl {
            version,
            ranks,
            timeout,
        })
    }

    /// NCCL's version as `major.minor.patch`.
    pub fn version(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    }

    pub fn nranks(&self) -> u32 {
        self.ranks.len() as u32
    }

    pub fn rank(&self, r: u32) -> Result<&NcclRank> {
        self.ranks.get(r as usize).ok_or_else(|| {
            BenchError::Invalid(format!("rank {r} out of range 0..{}", self.ranks.len()))
        })
    }

    /// Runs `f` for every rank at once, one thread each (NCCL's calls of
    /// one collective must be issued on every rank).
    pub fn run_all<R: Send>(
        &self,
        f: impl Fn(&NcclRank, &std::sync::Barrier) -> Result<R> + Sync,
    ) -> Result<Vec<R>> {
        let bar = std::sync::Barrier::new(self.ranks.len());
        std::thread::scope(|s| {
            let hs: Vec<_> = self
                .ranks
                .iter()
                .map(|rk| {
                    let (f, bar) = (&f, &bar);
                    s.spawn(move || f(rk, bar))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(BenchError::Invalid("NCCL rank thread panicked".into()))
                    })
                })
                .collect()
        })
    }

    /// Aborts every rank's communicator (after a failure, so peers
    /// blocked in NCCL's kernels are released); later calls fail.
    pub fn abort_all(&self) {
        let Ok(api) = Api::get() else { return };
        for rk in &self.ranks {
            if rk.ctx.bind().is_ok() {
                rk.abort(api);
            }
        }
    }

    /// 8-byte f32 AllReduce (sum) latency per call: eager (200 calls per
    /// run) and replayed from a CUDA graph of 100 captured calls; median
    /// of 15 runs, slowest rank.
    pub fn allreduce_latency(&self) -> Result<Latency> {
        let per = self.run_all(|rk, bar| rk.latency(bar, self.timeout))?;
        Ok(crate::latency::slowest(&per))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let Ok(api) = Api::get() else { return };
        for rk in &self.ranks {
            let comm = rk.comm.lock().unwrap_or_else(|p| p.into_inner()).0;
            if comm.is_null() || rk.ctx.bind().is_err() {
                continue;
            }
            // SAFETY: a live communicator (aborted ones are nulled),
            // released once.
            let _ = unsafe { (api.destroy)(comm) };
        }
    }
}

/// An NCCL reduction op; PreMulSum ops are destroyed with the guard.
struct OpGuard<'a> {
    op: c_int,
    made: Option<(&'static Api, &'a NcclRank)>,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        if let Some((api, rank)) = self.made {
            // An aborted communicator took its ops with it.
            let _ = rank.with_comm(|comm| {
                // SAFETY: the op was created on this live communicator
                // (held under its lock for the call).
                let _ = unsafe { (api.op_destroy)(self.op, comm) };
                Ok(())
            });
        }
    }
}

impl NcclRank {
    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// The stream NCCL's work of this rank runs on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Runs `f` on the live communicator, holding its lock so no abort
    /// frees it meanwhile.
    fn with_comm<R>(&self, f: impl FnOnce(Comm) -> Result<R>) -> Result<R> {
        let g = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.is_null() {
            return Err(err(
                NcclWhy::Timeout,
                format!(
                    "rank {}: communicator aborted after an earlier failure",
                    self.rank
                ),
            ));
        }
        f(g.0)
    }

    fn make_op(&self, api: &'static Api, call: &NcclCall) -> Result<OpGuard<'_>> {
        let simple = match call.op {
            RedOp::Sum => 0,
            RedOp::Prod => 1,
            RedOp::Max => 2,
            RedOp::Min => 3,
            RedOp::Avg => 4,
            RedOp::PreMulSumDevice(_) => {
                return Err(err(
                    NcclWhy::Unsupported,
                    "a device scalar: this harness makes host-immediate PreMulSum ops only",
                ))
            }
            RedOp::PreMulSum(s) => {
                let mut bits = oxccl_cuda::world::scale_bits(call.dtype, s).to_le_bytes();
                let mut op: c_int = 0;
                self.with_comm(|comm| {
                    // SAFETY: `bits` holds the scalar in the element type's
                    // encoding (little-endian, its low bytes), read at the call.
                    api.check("ncclRedOpCreatePreMulSum", unsafe {
                        (api.premulsum)(
                            &mut op,
                            bits.as_mut_ptr().cast(),
                            call.dtype as c_int,
                            SCALAR_HOST_IMMEDIATE,
                            comm,
                        )
                    })
                })?;
                return Ok(OpGuard {
                    op,
                    made: Some((api, self)),
                });
            }
        };
        Ok(OpGuard {
            op: simple,
            made: None,
        })
    }

    /// Checks `call` against this clique before anything is enqueued.
    fn validate(&self, call: &NcclCall) -> Result<()> {
        if call.root >= self.nranks {
            return Err(BenchError::Invalid(format!(
                "root {} out of range for {} ranks",
                call.root, self.nranks
            )));
        }
        if call.kind.is_reduction() && matches!(call.op, RedOp::PreMulSum(s) if !s.is_finite()) {
            return Err(err(
                NcclWhy::Unsupported,
                "PreMulSum with a non-finite scalar",
            ));
        }
        Ok(())
    }

    /// Enqueues one call of `call` on this rank's stream (returns at once).
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of this rank's GPU, of the
    /// lengths `oxccl_core::Collective` gives for `call` (or NCCL's
    /// in-place layout), valid until the stream reaches the work.
    pub unsafe fn enqueue(&self, call: &NcclCall, send: u64, recv: u64) -> Result<()> {
        self.validate(call)?;
        let api = Api::get()?;
        let op = self.make_op(api, call)?;
        // SAFETY: caller's contract.
        unsafe { self.enqueue_op(api, call, op.op, send, recv) }
    }

    /// # Safety
    /// As [`NcclRank::enqueue`]; `op` is valid on this communicator.
    unsafe fn enqueue_op(
        &self,
        api: &Api,
        call: &NcclCall,
        op: c_int,
        send: u64,
        recv: u64,
    ) -> Result<()> {
        self.ctx.bind()?;
        self.with_comm(|comm| {
            let (s, st) = (send as *const c_void, self.stream.raw);
            let r_ = recv as *mut c_void;
            let (n, dt, root) = (call.count, call.dtype as c_int, call.root as c_int);
            let block = (call.count * call.dtype.size()) as u64;
            // SAFETY: every call below gets pointers and lengths per the
            // caller's contract, a live communicator and a stream of its device.
            unsafe {
                match call.kind {
                    CollKind::AllReduce => api.check(
                        "ncclAllReduce",
                        (api.all_reduce)(s, r_, n, dt, op, comm, st),
                    ),
                    CollKind::Broadcast => api.check(
                        "ncclBroadcast",
                        (api.broadcast)(s, r_, n, dt, root, comm, st),
                    ),
                    CollKind::Reduce => {
                        api.check("ncclReduce", (api.reduce)(s, r_, n, dt, op, root, comm, st))
                    }
                    CollKind::AllGather => {
                        api.check("ncclAllGather", (api.all_gather)(s, r_, n, dt, comm, st))
                    }
                    CollKind::ReduceScatter => api.check(
                        "ncclReduceScatter",
                        (api.reduce_scatter)(s, r_, n, dt, op, comm, st),
                    ),
                    // The rest as nccl-tests builds them: grouped send/recv.
                    kind => self.grouped(api, comm, kind, call, send, recv, block),
                }
            }
        })
    }

    /// AllToAll, Gather, Scatter and the ring Send/Recv as one group of
    /// point-to-point calls.
    ///
    /// # Safety
    /// As [`NcclRank::enqueue`]; `comm` is this rank's, held under its lock.
    #[allow(clippy::too_many_arguments)] // reason: the call's description plus its resolved addresses
    unsafe fn grouped(
        &self,
        api: &Api,
        comm: Comm,
        kind: CollKind,
        call: &NcclCall,
        send: u64,
        recv: u64,
        block: u64,
    ) -> Result<()> {
        let (n, dt, st) = (call.count, call.dtype as c_int, self.stream.raw);
        let (me, nr, root) = (self.rank, self.nranks, call.root);
        let tx = |addr: u64, peer: u32| {
            // SAFETY: caller's contract: `addr` holds `n` elements.
            api.check("ncclSend", unsafe {
                (api.send)(addr as *const c_void, n, dt, peer as c_int, comm, st)
            })
        };
        let rx = |addr: u64, peer: u32| {
            // SAFETY: as above.
            api.check("ncclRecv", unsafe {
                (api.recv)(addr as *mut c_void, n, dt, peer as c_int, comm, st)
            })
        };
        // SAFETY: starts a group closed below on every path.
        api.check("ncclGroupStart", unsafe { (api.group_start)() })?;
        let body = || -> Result<()> {
            match kind {
                CollKind::AllToAll => (0..nr).try_for_each(|p| {
                    tx(send + u64::from(p) * block, p)?;
                    rx(recv + u64::from(p) * block, p)
                }),
                CollKind::Gather => {
                    tx(send, root)?;
                    if me == root {
                        (0..nr).try_for_each(|p| rx(recv + u64::from(p) * block, p))?;
                    }
                    Ok(())
                }
                CollKind::Scatter => {
                    if me == root {
                        (0..nr).try_for_each(|p| tx(send + u64::from(p) * block, p))?;
                    }
                    rx(recv, root)
                }
                CollKind::SendRecv => {
                    tx(send, (me + 1) % nr)?;
                    rx(recv, (me + nr - 1) % nr)
                }
                other => Err(err(
                    NcclWhy::Unsupported,
                    format!("{other} is not a grouped operation"),
                )),
            }
        };
        let r = body();
        // SAFETY: closes the group opened above.
        let end = api.check("ncclGroupEnd", unsafe { (api.group_end)() });
        r.and(end)
    }

    /// Waits for this rank's stream, polling NCCL's asynchronous error,
    /// until `timeout`; past it (or on an error) the communicator is
    /// aborted.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let api = Api::get()?;
        self.ctx.bind()?;
        let start = Instant::now();
        loop {
            // SAFETY: a valid stream of the bound context.
            let q = unsafe { sys::cuStreamQuery(self.stream.raw) };
            match q {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(CudaError::driver("cuStreamQuery", e).into()),
            }
            let mut async_err: Res = 0;
            self.with_comm(|comm| {
                // SAFETY: live communicator (under its lock), valid out-pointer.
                api.check("ncclCommGetAsyncError", unsafe {
                    (api.async_error)(comm, &mut async_err)
                })
            })?;
            // 7 is ncclInProgress: not an error.
            if async_err != 0 && async_err != 7 {
                let e = api.check("NCCL (asynchronous)", async_err);
                self.abort(api);
                return e;
            }
            if start.elapsed() > timeout {
                self.abort(api);
                return Err(err(
                    NcclWhy::Timeout,
                    format!(
                        "rank {} (GPU {}): NCCL's work not done after {} ms; communicator aborted",
                        self.rank,
                        self.device,
                        timeout.as_millis()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn abort(&self, api: &Api) {
        let mut g = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if !g.0.is_null() {
            // SAFETY: live communicator, aborted once, then forgotten.
            let _ = unsafe { (api.abort)(g.0) };
            g.0 = std::ptr::null_mut();
        }
    }

    /// Runs `warmup` calls, waits, calls `ready` (a barrier with the other
    /// ranks), then times `iters` calls with events on this rank's stream;
    /// returns the median call.
    ///
    /// # Safety
    /// As [`NcclRank::enqueue`], for the whole run.
    #[allow(clippy::too_many_arguments)] // reason: one timed run's whole description
    pub unsafe fn time(
        &self,
        call: &NcclCall,
        send: u64,
        recv: u64,
        warmup: u32,
        iters: u32,
        timeout: Duration,
        ready: impl FnOnce(),
    ) -> Result<Duration> {
        self.validate(call)?;
        let api = Api::get()?;
        let op = self.make_op(api, call)?;
        // One event between calls, as the sweep marks oxccl's laps: the
        // median call, made before the timed region.
        let events = (0..=iters.max(1))
            .map(|_| Event::new(&self.ctx))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for _ in 0..warmup {
            // SAFETY: caller's contract.
            unsafe { self.enqueue_op(api, call, op.op, send, recv)? };
        }
        self.wait(timeout)?;
        ready();
        events[0].record(&self.stream)?;
        for e in &events[1..] {
            // SAFETY: caller's contract.
            unsafe { self.enqueue_op(api, call, op.op, send, recv)? };
            e.record(&self.stream)?;
        }
        self.wait(timeout)?;
        let mut laps = events
            .windows(2)
            .map(|w| w[1].elapsed_since(&w[0]).map(|ms| f64::from(ms.max(0.0))))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        laps.sort_by(f64::total_cmp);
        Ok(Duration::from_secs_f64(laps[laps.len() / 2] / 1e3))
    }

    /// This rank's share of [`Nccl::allreduce_latency`].
    fn latency(&self, bar: &std::sync::Barrier, timeout: Duration) -> Result<Latency> {
        let call = NcclCall {
            kind: CollKind::AllReduce,
            count: 2,
            dtype: DataType::F32,
            op: RedOp::Sum,
            root: 0,
        };
        let (a, b) = (DevMem::zeroed(&self.ctx, 8)?, DevMem::zeroed(&self.ctx, 8)?);
        let api = Api::get()?;
        // SAFETY: `a` and `b` hold the call's 2 floats and outlive every
        // wait on the stream in this function (and the harness's graph).
        let launch = || unsafe { self.enqueue_op(api, &call, 0, a.ptr, b.ptr) };
        crate::latency::rank_latency(&self.stream, bar, &launch, &|| self.wait(timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ranks_on_one_gpu_are_refused_before_nccl() {
        let e = check_placement(&[0, 1, 0]).unwrap_err();
        match e {
            BenchError::Nccl { why, detail } => {
                assert_eq!(why, NcclWhy::SharedGpu);
                assert!(detail.contains("ranks 0 and 2 both on GPU 0"), "{detail}");
            }
            other => panic!("expected a shared-GPU refusal, got {other:?}"),
        }
        assert!(matches!(
            check_placement(&[0, 0]),
            Err(BenchError::Nccl {
                why: NcclWhy::SharedGpu,
                ..
            })
        ));
        assert!(matches!(check_placement(&[]), Err(BenchError::Invalid(_))));
        assert!(check_placement(&[3, 1, 0, 2]).is_ok());
        assert!(check_placement(&[0]).is_ok());
    }

    #[test]
    fn nvls_must_be_unset_or_zero() {
        assert_eq!(nvls_check(None), Ok(true));
        assert_eq!(nvls_check(Some(OsStr::new("0"))), Ok(false));
        for v in ["1", "2", "", "yes"] {
            assert!(
                matches!(
                    nvls_check(Some(OsStr::new(v))),
                    Err(BenchError::Nccl {
                        why: NcclWhy::Nvls,
                        ..
                    })
                ),
                "{v:?} accepted"
            );
        }
    }

    #[test]
    fn a_missing_library_is_a_typed_error() {
        // A name that cannot exist: loading fails, nothing panics.
        let Err(e) = Api::load_from(&["liboxccl-no-such-nccl.so.2".into()]) else {
            panic!("a library that does not exist was loaded");
        };
        assert!(e.contains("liboxccl-no-such-nccl.so.2"), "{e}");
        // The process-wide library: present (GPU machine) or Absent.
        match Api::get() {
            Ok(_)
            | Err(BenchError::Nccl {
                why: NcclWhy::Absent,
                ..
            }) => {}
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn nccl_without_the_library_or_gpu_refuses_cleanly() {
        // On CI (no libcuda, no libnccl) this is Absent or NoDriver; on a
        // GPU machine with NCCL it may succeed. It must never panic, and
        // a shared GPU is refused first wherever it runs.
        match Nccl::new(&[0], Duration::from_secs(5)) {
            Ok(n) => assert_eq!(n.nranks(), 1),
            Err(BenchError::Nccl { why, .. }) => {
                assert!(matches!(why, NcclWhy::Absent | NcclWhy::Nvls), "{why:?}")
            }
            Err(BenchError::Cuda(CudaError::NoDriver(_)) | BenchError::Invalid(_)) => {}
            Err(other) => panic!("unexpected error {other:?}"),
        }
        assert!(matches!(
            Nccl::new(&[0, 0], Duration::from_secs(5)),
            Err(BenchError::Nccl {
                why: NcclWhy::SharedGpu,
                ..
            })
        ));
    }
}
