//! Thin owning wrappers over the CUDA driver API (through cudarc's
//! dynamically loaded bindings): contexts, device memory from `cuMemAlloc`,
//! host-mapped memory, streams, events, modules and graphs.
//!
//! cudarc's safe allocations come from the stream-ordered pool, which peer
//! access and IPC cannot use, so every allocation here is `cuMemAlloc`.
//! cudarc panics when `libcuda` is missing or lacks a symbol; [`init`]
//! checks the library first and contains such panics, and nothing here is
//! reachable before [`init`] succeeded.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys};

use crate::error::{CudaError, Result};

/// Runs a closure that calls into cudarc, turning a panic (a missing
/// library or symbol) into an error.
pub(crate) fn guarded<T>(what: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        Err(CudaError::NoDriver(format!("{what}: {msg}")))
    })
}

/// Hardware work queues per context that oxccl asks for when the user has
/// not chosen.
const MAX_CONNECTIONS: &str = "32";

/// Queues a process asks for when it drives one rank of a clique whose
/// ranks are processes (see [`prefer_process_rank_queues`]).
const PROCESS_RANK_CONNECTIONS: &str = "4";

/// What [`widen_hardware_queues`] sets: `MAX_CONNECTIONS`, or
/// `PROCESS_RANK_CONNECTIONS` once a process said it drives one rank.
static QUEUES: std::sync::Mutex<&str> = std::sync::Mutex::new(MAX_CONNECTIONS);

/// Asks for few hardware queues: this process drives one rank of a clique
/// whose ranks are processes. MPS serves fewer clients the more queues
/// each asks for (seen on the H200: with 32, a fourth client's context
/// failed with CUDA_ERROR_OUT_OF_MEMORY), and one rank needs only its own
/// stream apart from the setup stream (`World::across_processes` makes
/// them first, so they get queues of their own). Effective only before
/// the first CUDA use of the process and unless the user set the variable.
pub fn prefer_process_rank_queues() {
    *QUEUES.lock().unwrap_or_else(|p| p.into_inner()) = PROCESS_RANK_CONNECTIONS;
}

/// Every rank has its own stream and the kernels of ranks on one GPU spin on
/// each other, so no two rank streams may share a hardware queue: a rank's
/// next kernel queued behind a peer's spinning one would wait for it forever.
/// The driver's default is 8 queues per context, and 8 ranks plus a setup
/// stream already exceed it (seen on the H200 on 2026-12-02: registered
/// AllGather with 8 ranks × 16 channels hung at the default and ran with 32).
/// The driver reads `CUDA_DEVICE_MAX_CONNECTIONS` when a context is made, so
/// it is set here, before `cuInit`, unless the user set it.
fn widen_hardware_queues() {
    const VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
    match std::env::var(VAR) {
        Ok(v) => tracing::debug!("{VAR}={v} set by the user; left alone"),
        Err(_) => {
            // Runs once, at the first CUDA use (communicator creation),
            // inside `init`'s OnceLock. A thread of the application reading
            // the environment at that very moment would race glibc's setenv;
            // users who cannot rule that out set the variable themselves.
            let n = *QUEUES.lock().unwrap_or_else(|p| p.into_inner());
            std::env::set_var(VAR, n);
            tracing::debug!("{VAR} set to {n} (rank streams must not share queues)");
        }
    }
}

/// The oldest driver oxccl runs on, as `cuDriverGetVersion` reports it
/// (CUDA 12.0, driver R525): the driver API level the crate is built
/// against (cudarc's `cuda-12000`), so every entry point it calls exists.
pub const MIN_DRIVER: i32 = 12000;

/// The first driver with `cuFuncLoad` (CUDA 12.4).
const FUNC_LOAD_DRIVER: i32 = 12040;

/// The CUDA version the installed driver supports (`12040` for 12.4),
/// readable before `cuInit`.
pub fn driver_version() -> Result<i32> {
    guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: valid out-pointer; needs no initialisation.
        unsafe { check("cuDriverGetVersion", sys::cuDriverGetVersion(&mut v))? };
        Ok(v)
    })
}

/// Drivers before CUDA 12.4 cannot load a function ahead of its first
/// launch (`cuFuncLoad`), and from 12.2 they load lazily by default, so a
/// first launch would wait for peers' spinning kernels: ask for eager
/// loading (read by `cuInit`) unless the user chose.
fn load_modules_eagerly() {
    const VAR: &str = "CUDA_MODULE_LOADING";
    if std::env::var_os(VAR).is_none() {
        // Same reasoning as `widen_hardware_queues` for setting it here.
        std::env::set_var(VAR, "EAGER");
        tracing::debug!("{VAR}=EAGER set (driver without cuFuncLoad)");
    }
}

/// Loads libcuda and calls `cuInit` once per process.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        guarded("cuInit", || {
            // SAFETY: only probes whether the shared library can be opened.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::NoDriver(
                    "libcuda.so could not be loaded (no NVIDIA driver on this machine)".into(),
                ));
            }
            let version = driver_version()?;
            if version < MIN_DRIVER {
                return Err(CudaError::DriverTooOld {
                    found: version,
                    need: MIN_DRIVER,
                    what: "oxccl's CUDA backend (its driver API level)",
                });
            }
            widen_hardware_queues();
            if version < FUNC_LOAD_DRIVER {
                load_modules_eagerly();
            }
            result::init().map_err(init_error)
        })
    })
    .clone()
}

/// A failed `cuInit`: no device (or only the toolkit's stub library) means
/// no usable driver; anything else is a broken driver, which must not pass
/// for an absent one (GPU tests skip only on [`CudaError::NoDriver`]).
fn init_error(e: result::DriverError) -> CudaError {
    use sys::CUresult::{CUDA_ERROR_NO_DEVICE, CUDA_ERROR_STUB_LIBRARY};
    match e.0 {
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_STUB_LIBRARY => {
            CudaError::NoDriver(format!("cuInit failed: {e:?}"))
        }
        _ => CudaError::driver("cuInit", e),
    }
}

pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| CudaError::driver(call, e))
}

/// Number of visible devices (0 when the driver is present but has none).
pub fn device_count() -> Result<i32> {
    init()?;
    result::device::get_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))
}

/// Puts the calling thread in relaxed stream-capture mode
/// (`cuThreadExchangeStreamCaptureMode`), so that its event queries never
/// invalidate a graph capture another thread runs in global mode (what
/// `torch.cuda.graph` does by default): for a thread that only watches.
pub fn relax_capture_mode() -> Result<()> {
    init()?;
    exchange_capture_mode(&mut sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
}

/// Sets the calling thread's stream-capture mode to `mode` and leaves the
/// previous one there (`cuThreadExchangeStreamCaptureMode`).
fn exchange_capture_mode(mode: &mut sys::CUstreamCaptureMode) -> Result<()> {
    guarded("cuThreadExchangeStreamCaptureMode", || {
        // SAFETY: valid in-out pointer.
        unsafe {
            check(
                "cuThreadExchangeStreamCaptureMode",
                sys::cuThreadExchangeStreamCaptureMode(mode),
            )
        }
    })
}

/// Runs `f` with the calling thread in relaxed stream-capture mode and
/// then puts its mode back: for setup a captured call needs (page-locking
/// host memory) made while the thread captures in global mode, where the
/// driver may refuse such calls as unsafe during capture.
pub fn relaxed_capture<R>(f: impl FnOnce() -> R) -> Result<R> {
    init()?;
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    exchange_capture_mode(&mut mode)?;
    let r = f();
    exchange_capture_mode(&mut mode)?;
    Ok(r)
}

/// The device of the calling thread's current context (`cuCtxGetDevice`):
/// the device the runtime made current (`cudaSetDevice`), which NCCL runs
/// a rank on. `None` when no context is current (the runtime would then
/// use device 0).
pub fn current_device() -> Result<Option<i32>> {
    init()?;
    guarded("cuCtxGetDevice", || {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { check("cuCtxGetCurrent", sys::cuCtxGetCurrent(&mut ctx))? };
        if ctx.is_null() {
            return Ok(None);
        }
        let mut dev = 0;
        // SAFETY: valid out-pointer; a context is current (checked).
        unsafe { check("cuCtxGetDevice", sys::cuCtxGetDevice(&mut dev))? };
        Ok(Some(dev))
    })
}

/// A device's primary context, retained for the lifetime of this value.
#[derive(Debug)]
pub struct Ctx {
    pub ordinal: i32,
    pub dev: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Bytes of the [`DevMem`] allocations made through this handle and
    /// not yet freed (what `ncclCommMemStats` reports).
    held: AtomicU64,
}

/// What to say when a context cannot be made because the MPS server of the
/// GPU serves no more clients: a hard limit of the device, met at
/// communicator creation rather than as a deadline at the first call.
fn mps_full(code: sys::cudaError_enum) -> Option<&'static str> {
    use sys::cudaError_enum as E;
    match code {
        E::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED | E::CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED => Some(
            "the GPU's MPS server has no room for another client process (MPS serves a bounded \
             number of clients per GPU, fewer the more hardware queues each asks for with \
             CUDA_DEVICE_MAX_CONNECTIONS); run fewer rank processes per GPU, ask for fewer \
             queues (CUDA_DEVICE_MAX_CONNECTIONS=2), run the ranks as threads of one process \
             (no such limit), or stop MPS (ranks as processes then go through host memory)",
        ),
        // Seen on the H200 under MPS: 16 rank processes ran, and of 32 the
        // 16th to start failed here, with the device's memory mostly free.
        E::CUDA_ERROR_OUT_OF_MEMORY => Some(
            "no memory for another context: the device's memory is full, or, under MPS, the \
             server has no room for another client process (on the H200, 32 rank processes \
             failed here where 16 ran); run fewer rank processes per GPU, ask for fewer \
             hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=2), give each a smaller heap \
             (OXCCL_PROC_HEAP), or run the ranks as threads of one process",
        ),
        _ => None,
    }
}

// SAFETY: a CUcontext handle may be used from any thread once made current
// there; `bind` does that before every use.
unsafe impl Send for Ctx {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Ctx {}

impl Ctx {
    pub fn new(ordinal: i32) -> Result<Arc<Ctx>> {
        init()?;
        let dev = result::device::get(ordinal).map_err(|e| CudaError::driver("cuDeviceGet", e))?;
        // SAFETY: `dev` came from cuDeviceGet.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| CudaError::Driver {
            call: "cuDevicePrimaryCtxRetain",
            detail: match mps_full(e.0) {
                Some(why) => format!("{e:?}: {why}"),
                None => format!("{e:?}"),
            },
        })?;
        let c = Arc::new(Ctx {
            ordinal,
            dev,
            ctx,
            held: AtomicU64::new(0),
        });
        c.bind()?;
        Ok(c)
    }

    /// Bytes of device memory allocated through this handle and live now.
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained until `self` drops.
        unsafe { check("cuCtxSetCurrent", sys::cuCtxSetCurrent(self.ctx)) }
    }

    /// Whether `stream` (a caller's handle; the legacy and per-thread
    /// default streams stand for this context once it is current) belongs
    /// to this context.
    ///
    /// # Safety
    /// `stream` must be a live stream handle or a default-stream handle.
    pub unsafe fn owns_stream(&self, stream: sys::CUstream) -> Result<bool> {
        self.bind()?;
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: caller's contract; `c` is a valid out-pointer.
        unsafe { check("cuStreamGetCtx", sys::cuStreamGetCtx(stream, &mut c))? };
        Ok(c == self.ctx)
    }

    /// The device's memory in bytes.
    pub fn total_mem(&self) -> Result<usize> {
        // SAFETY: `dev` is a valid device.
        unsafe { result::device::total_mem(self.dev) }
            .map_err(|e| CudaError::driver("cuDeviceTotalMem", e))
    }

    pub fn attr(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: `dev` is a valid device.
        unsafe { result::device::get_attribute(self.dev, a) }
            .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))
    }

    /// Lets this context access memory of `peer`'s device. "Already
    /// enabled" counts as success.
    pub fn enable_peer(&self, peer: &Ctx) -> Result<()> {
        if peer.dev == self.dev {
            return Ok(());
        }
        let mut can = 0;
        // SAFETY: both devices are valid; `can` is a valid out-pointer.
        unsafe {
            check(
                "cuDeviceCanAccessPeer",
                sys::cuDeviceCanAccessPeer(&mut can, self.dev, peer.dev),
            )?
        };
        if can == 0 {
            return Err(CudaError::Invalid(format!(
                "device {} cannot access device {} (no P2P path)",
                self.ordinal, peer.ordinal
            )));
        }
        self.bind()?;
        // SAFETY: the peer context is retained for the call.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", r)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// Device memory from `cuMemAlloc`: addressable by peers (after peer access)
/// and usable by IPC, unlike pool memory.
#[derive(Debug)]
pub struct DevMem {
    pub ptr: u64,
    pub bytes: usize,
    ctx: Arc<Ctx>,
    /// False for a part of a larger allocation ([`DevMem::part`]), which
    /// its owner frees.
    owned: bool,
}

impl DevMem {
    /// Allocates `bytes` (at least 1), contents undefined. `cuMemAlloc`
    /// returns while other streams' kernels run (`sync_probe`, oxccl-bench).
    pub fn uninit(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevMem> {
        ctx.bind()?;
        // SAFETY: plain allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| CudaError::driver("cuMemAlloc", e))?;
        ctx.held.fetch_add(bytes.max(1) as u64, Ordering::Relaxed);
        Ok(DevMem {
            ptr,
            bytes,
            ctx: ctx.clone(),
            owned: true,
        })
    }

    /// `bytes` at `offset` into `self`, as memory that is never freed on
    /// its own (the allocation it lies in is freed when `self` drops, and
    /// the caller keeps `self` alive as long as the part is used).
    pub fn part(&self, offset: usize, bytes: usize) -> Result<DevMem> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            return Err(CudaError::Invalid(format!(
                "{bytes} bytes at {offset} outside an allocation of {}",
                self.bytes
            )));
        }
        Ok(DevMem {
            ptr: self.ptr + offset as u64,
            bytes,
            ctx: self.ctx.clone(),
            owned: false,
        })
    }

    /// Allocates `bytes` (at least 1) and zeroes them before returning.
    pub fn zeroed(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevMem> {
        let m = DevMem::uninit(ctx, bytes)?;
        let ptr = m.ptr;
        // SAFETY: `ptr` holds at least `bytes.max(1)` bytes. The memset runs
        // on the legacy stream, which the ranks' non-blocking streams never
        // wait for, and syncing it waits for nothing of theirs.
        unsafe {
            check("cuMemsetD8", sys::cuMemsetD8_v2(ptr, 0, bytes.max(1)))?;
            check(
                "cuStreamSynchronize",
                sys::cuStreamSynchronize(std::ptr::null_mut()),
            )?;
        }
        Ok(m)
    }

    /// Copies `src` to the start of this allocation (synchronous).
    pub fn upload(&self, src: &[u8]) -> Result<()> {
        if src.len() > self.bytes {
            return Err(CudaError::Invalid(format!(
                "upload of {} bytes into {} bytes",
                src.len(),
                self.bytes
            )));
        }
        self.ctx.bind()?;
        // SAFETY: bounds checked above.
        unsafe { result::memcpy_htod_sync(self.ptr, src) }
            .map_err(|e| CudaError::driver("cuMemcpyHtoD", e))
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.owned {
            self.ctx
                .held
                .fetch_sub(self.bytes.max(1) as u64, Ordering::Relaxed);
        }
        if self.owned && self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory mapped into every context's address space: the
/// host writes it directly (the abort flag) and kernels read it.
#[derive(Debug)]
pub struct HostMapped {
    host: *mut c_void,
    pub dev_ptr: u64,
    bytes: usize,
}

// SAFETY: the memory is plain bytes owned by this value; access goes
// through volatile reads/writes of whole words.
unsafe impl Send for HostMapped {}
// SAFETY: as above.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    pub fn zeroed(ctx: &Ctx, bytes: usize) -> Result<HostMapped> {
        ctx.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: plain pinned allocation.
        let host = unsafe { result::malloc_host(bytes, flags) }
            .map_err(|e| CudaError::driver("cuMemHostAlloc", e))?;
        // SAFETY: `host` holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut dev_ptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP.
        unsafe {
            check(
                "cuMemHostGetDevicePointer",
                sys::cuMemHostGetDevicePointer_v2(&mut dev_ptr, host, 0),
            )?
        };
        Ok(HostMapped {
            host,
            dev_ptr,
            bytes,
        })
    }

    /// Writes word `i` (volatile, visible to running kernels).
    pub fn store_u32(&self, i: usize, v: u32) {
        assert!((i + 1) * 4 <= self.bytes, "host-mapped word out of range");
        // SAFETY: in bounds (checked), aligned (page-aligned base).
        unsafe { std::ptr::write_volatile(self.host.cast::<u32>().add(i), v) };
    }

    pub fn load_u32(&self, i: usize) -> u32 {
        assert!((i + 1) * 4 <= self.bytes, "host-mapped word out of range");
        // SAFETY: in bounds (checked), aligned (page-aligned base).
        unsafe { std::ptr::read_volatile(self.host.cast::<u32>().add(i)) }
    }

    /// Reads 64-bit word `i` (volatile: what a running kernel wrote).
    pub fn load_u64(&self, i: usize) -> u64 {
        assert!((i + 1) * 8 <= self.bytes, "host-mapped word out of range");
        // SAFETY: in bounds (checked), aligned (page-aligned base).
        unsafe { std::ptr::read_volatile(self.host.cast::<u64>().add(i)) }
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        let _ = unsafe { result::free_host(self.host) };
    }
}

/// A non-blocking stream (no implicit sync with the legacy default stream).
#[derive(Debug)]
pub struct Stream {
    pub raw: sys::CUstream,
    ctx: Arc<Ctx>,
}

// SAFETY: stream handles may be used from any thread with the context bound.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: &Arc<Ctx>) -> Result<Stream> {
        ctx.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| CudaError::driver("cuStreamCreate", e))?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid stream.
        unsafe { result::stream::synchronize(self.raw) }
            .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
    }

    /// Enqueues a device-to-device copy.
    ///
    /// # Safety
    /// Both ranges must be valid device memory of `bytes` bytes until the
    /// stream reaches the copy.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: caller's contract.
        unsafe {
            check(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw),
            )
        }
    }

    /// Enqueues a copy of `bytes` bytes from `src` to `dst`, any two
    /// addresses of the unified address space (the driver infers the
    /// kind: a device's own memory, a peer device's, or mapped host
    /// memory), on the device's copy engines: no kernel of ours runs.
    ///
    /// # Safety
    /// Both ranges must be valid memory of `bytes` bytes, reachable from
    /// this stream's context, until the stream reaches the copy.
    pub unsafe fn copy_async(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        guarded("cuMemcpyAsync", || {
            // SAFETY: caller's contract.
            unsafe {
                check(
                    "cuMemcpyAsync",
                    sys::cuMemcpyAsync(dst, src, bytes, self.raw),
                )
            }
        })
    }

    /// Enqueues `f(data)` on a host thread of the driver, after the
    /// stream's earlier work and before its later work
    /// (`cuLaunchHostFunc`); under capture it becomes a host node of the
    /// graph, run at every replay.
    ///
    /// # Safety
    /// `data` must stay valid for every run of `f` (every replay of a
    /// graph the call is captured into); `f` must not call CUDA, and must
    /// not unwind.
    pub unsafe fn host_fn(
        &self,
        f: unsafe extern "C" fn(*mut std::ffi::c_void),
        data: *mut std::ffi::c_void,
    ) -> Result<()> {
        self.ctx.bind()?;
        guarded("cuLaunchHostFunc", || {
            // SAFETY: caller's contract.
            unsafe {
                check(
                    "cuLaunchHostFunc",
                    sys::cuLaunchHostFunc(self.raw, Some(f), data),
                )
            }
        })
    }

    /// Enqueues a 32-bit store of `v` at `addr` (a stream memory
    /// operation, `cuStreamWriteValue32_v2`). With the default flags the
    /// driver fences before the store (like `__threadfence_system()`,
    /// scoped to the stream), so everything the stream wrote earlier,
    /// copies included, is visible before the value is.
    ///
    /// # Safety
    /// `addr` must be a 4-byte aligned device address (device memory, or
    /// mapped host memory's device pointer; not managed memory) valid
    /// until the stream reaches the store.
    pub unsafe fn write_value(&self, addr: u64, v: u32) -> Result<()> {
        self.ctx.bind()?;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        guarded("cuStreamWriteValue32_v2", || {
            // SAFETY: caller's contract.
            unsafe {
                check(
                    "cuStreamWriteValue32_v2",
                    sys::cuStreamWriteValue32_v2(self.raw, addr, v, flags),
                )
            }
        })
    }

    /// Enqueues a wait until the 32-bit word at `addr` is at least `v`
    /// (`cuStreamWaitValue32_v2` with `CU_STREAM_WAIT_VALUE_GEQ`, an
    /// unsigned comparison): later work of the stream starts after it.
    /// The wait has no deadline.
    ///
    /// # Safety
    /// As [`Stream::write_value`].
    pub unsafe fn wait_value_geq(&self, addr: u64, v: u32) -> Result<()> {
        self.ctx.bind()?;
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        guarded("cuStreamWaitValue32_v2", || {
            // SAFETY: caller's contract.
            unsafe {
                check(
                    "cuStreamWaitValue32_v2",
                    sys::cuStreamWaitValue32_v2(self.raw, addr, v, flags),
                )
            }
        })
    }

    /// Work enqueued here after this call waits (on the device) for
    /// everything before `ev`'s last record.
    pub fn wait_event(&self, ev: &Event) -> Result<()> {
        // SAFETY: both handles are live and of the same context.
        unsafe { wait_event_raw(self.raw, ev) }
    }

    /// Whether work enqueued now would be captured into a graph rather
    /// than run.
    pub fn capturing(&self) -> Result<bool> {
        self.ctx.bind()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: valid stream and out-pointer.
        unsafe {
            check(
                "cuStreamIsCapturing",
                sys::cuStreamIsCapturing(self.raw, &mut st),
            )?
        };
        Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// An error instead of a wait on a stream being captured into a graph
    /// (waiting there would fail and invalidate the caller's capture).
    pub fn refuse_capture(&self, what: &str) -> Result<()> {
        if self.capturing()? {
            return Err(CudaError::Invalid(format!(
                "{what} waits for the stream, which is being captured into a CUDA graph: \
                 do it outside the capture"
            )));
        }
        Ok(())
    }

    /// Enqueues zeroing `bytes` bytes at `dst` (returns at once).
    ///
    /// # Safety
    /// `dst` must be valid device memory of `bytes` bytes until the stream
    /// reaches the memset.
    pub unsafe fn zero_async(&self, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: caller's contract.
        unsafe {
            check(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(dst, 0, bytes, self.raw),
            )
        }
    }

    /// Enqueues storing `v` (little-endian) at `dst` as two 32-bit memsets
    /// (returns at once; needs no host buffer that must outlive the call).
    ///
    /// # Safety
    /// `dst` must be valid, 4-byte aligned device memory of 8 bytes until
    /// the stream reaches the memsets.
    pub unsafe fn store_u64_async(&self, dst: u64, v: u64) -> Result<()> {
        debug_assert!(dst.is_multiple_of(4));
        self.ctx.bind()?;
        for (at, half) in [(dst, v as u32), (dst + 4, (v >> 32) as u32)] {
            // SAFETY: caller's contract.
            unsafe {
                check(
                    "cuMemsetD32Async",
                    sys::cuMemsetD32Async(at, half, 1, self.raw),
                )?
            };
        }
        Ok(())
    }

    /// Copies host bytes to device memory, ordered on this stream, and waits.
    ///
    /// The stream is drained first, so the copy itself never waits for a
    /// kernel: a copy of pageable memory holds a lock of the context while
    /// it waits, and `cuMemAlloc` in another thread (a peer rank preparing
    /// its launch) waits for that lock, so a copy queued behind a kernel
    /// that spins for that peer would hold both until the kernel's deadline
    /// (seen on the H200 with cuda-gdb: peers in `cuMemAlloc`'s rwlock,
    /// readers in `cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    /// `dst` must be valid device memory of `src.len()` bytes.
    pub unsafe fn write_sync(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.refuse_capture("writing device memory")?;
        self.synchronize()?;
        self.ctx.bind()?;
        // SAFETY: caller's contract; `src` outlives the synchronisation below.
        unsafe { result::memcpy_htod_async(dst, src, self.raw) }
            .map_err(|e| CudaError::driver("cuMemcpyHtoDAsync", e))?;
        self.synchronize()
    }

    /// Copies device memory to host bytes, ordered on this stream, and waits.
    /// The stream is drained first, as in [`Stream::write_sync`].
    ///
    /// # Safety
    /// `src` must be valid device memory of `dst.len()` bytes.
    pub unsafe fn read_sync(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.refuse_capture("reading device memory")?;
        self.synchronize()?;
        self.ctx.bind()?;
        // SAFETY: caller's contract; `dst` outlives the synchronisation below.
        unsafe { result::memcpy_dtoh_async(dst, src, self.raw) }
            .map_err(|e| CudaError::driver("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// A timing event.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Ctx>,
}

// SAFETY: event handles may be used from any thread with the context bound.
unsafe impl Send for Event {}

impl Event {
    /// An event for ordering only (no timestamps, cheaper to record).
    pub fn ordering(ctx: &Arc<Ctx>) -> Result<Event> {
        Event::with_flags(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    /// Whether everything before the event's last record has completed
    /// (true for an event never recorded). Never waits.
    pub fn done(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: valid event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(CudaError::driver("cuEventQuery", e)),
        }
    }

    /// A timing event.
    pub fn new(ctx: &Arc<Ctx>) -> Result<Event> {
        Event::with_flags(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    fn with_flags(ctx: &Arc<Ctx>, flags: sys::CUevent_flags) -> Result<Event> {
        ctx.bind()?;
        let raw =
            result::event::create(flags).map_err(|e| CudaError::driver("cuEventCreate", e))?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records on a stream given by its handle (a caller's stream).
    ///
    /// # Safety
    /// `s` must be a live stream of this event's context, or a
    /// default-stream handle while that context is current.
    pub unsafe fn record_raw(&self, s: sys::CUstream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: caller's contract.
        unsafe { check("cuEventRecord", sys::cuEventRecord(self.raw, s)) }
    }

    pub fn record(&self, s: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid event and stream of the same context.
        unsafe { result::event::record(self.raw, s.raw) }
            .map_err(|e| CudaError::driver("cuEventRecord", e))
    }

    /// Whether the work before the record has completed (`cuEventQuery`).
    pub fn query(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: valid event.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(CudaError::driver("cuEventQuery", e)),
        }
    }

    /// Waits for the work before the record (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid event.
        unsafe { result::event::synchronize(self.raw) }
            .map_err(|e| CudaError::driver("cuEventSynchronize", e))
    }

    /// Milliseconds from `start` to `self`, waiting for `self`.
    pub fn elapsed_since(&self, start: &Event) -> Result<f32> {
        self.ctx.bind()?;
        // SAFETY: valid events.
        unsafe {
            result::event::synchronize(self.raw)
                .map_err(|e| CudaError::driver("cuEventSynchronize", e))?;
            result::event::elapsed(start.raw, self.raw)
                .map_err(|e| CudaError::driver("cuEventElapsedTime", e))
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

/// Makes work enqueued on `s` after this call wait (on the device) for
/// everything before `ev`'s last record; the host does not wait.
///
/// # Safety
/// `s` must be a live stream of `ev`'s context, or a default-stream
/// handle while that context is current.
pub unsafe fn wait_event_raw(s: sys::CUstream, ev: &Event) -> Result<()> {
    ev.ctx.bind()?;
    // SAFETY: caller's contract; `ev` is live.
    unsafe { check("cuStreamWaitEvent", sys::cuStreamWaitEvent(s, ev.raw, 0)) }
}

/// A loaded module and the context it lives in.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<Ctx>,
}

// SAFETY: module and function handles are context-wide, usable from any
// thread with the context bound.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

/// A kernel of a [`Module`].
#[derive(Clone, Copy, Debug)]
pub struct Function(pub(crate) sys::CUfunction);

// SAFETY: see Module.
unsafe impl Send for Function {}
// SAFETY: see Module.
unsafe impl Sync for Function {}

impl Module {
    pub fn load(ctx: &Arc<Ctx>, cubin: &[u8]) -> Result<Module> {
        ctx.bind()?;
        // SAFETY: `cubin` is a complete image produced by NVRTC (or the
        // cache, which stores exactly such images).
        let raw = unsafe { result::module::load_data(cubin.as_ptr().cast()) }
            .map_err(|e| CudaError::driver("cuModuleLoadData", e))?;
        Ok(Module {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn function(&self, name: &str) -> Result<Function> {
        self.ctx.bind()?;
        let c = std::ffi::CString::new(name).map_err(|e| CudaError::Invalid(e.to_string()))?;
        // SAFETY: module is loaded.
        let f = unsafe { result::module::get_function(self.raw, c) }
            .map_err(|e| CudaError::driver("cuModuleGetFunction", e))?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded in `load`, unloaded once.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

impl Function {
    /// The driver's handle (for calls this wrapper does not cover).
    pub fn raw(&self) -> sys::CUfunction {
        self.0
    }

    /// Loads the function's code now rather than at its first launch.
    /// Under lazy loading (the driver's default since CUDA 12.2) a first
    /// launch loads the function and waits for every running kernel of
    /// the context first (`sync_probe`, oxccl-bench: 1.5 s, the probe's
    /// whole deadline, on the H200's driver 580); a rank doing that while
    /// a peer's kernel spins waiting for its launch would stall both until
    /// the deadline. `cuFuncLoad` itself returned in 0.06 ms beside a
    /// running kernel. Drivers before CUDA 12.4 lack it (it is looked up
    /// by name, since the bindings are CUDA 12.0's): then nothing is done,
    /// and [`init`] has asked for eager loading on such drivers, so no
    /// launch loads code there either.
    pub fn load(&self) -> Result<()> {
        match func_load() {
            // SAFETY: a function of a loaded module; the symbol has
            // cuFuncLoad's C signature.
            Some(f) => check("cuFuncLoad", unsafe { f(self.0) }),
            None => {
                tracing::debug!(
                    "cuFuncLoad absent (driver before CUDA 12.4); modules load eagerly"
                );
                Ok(())
            }
        }
    }

    /// Blocks of `threads` threads, each with `smem` bytes of dynamic
    /// shared memory, that fit on one SM at once.
    pub fn max_blocks_per_sm(&self, threads: u32, smem: u32) -> Result<u32> {
        let mut n = 0;
        // SAFETY: valid function; out-pointer valid.
        unsafe {
            check(
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut n,
                    self.0,
                    threads as i32,
                    smem as usize,
                ),
            )?
        };
        Ok(n.max(0) as u32)
    }

    /// Lets launches ask for up to `bytes` of dynamic shared memory (past
    /// the default 48 KiB the driver wants it said first).
    pub fn allow_dynamic_smem(&self, bytes: u32) -> Result<()> {
        let v = i32::try_from(bytes).map_err(|_| CudaError::Invalid(format!("{bytes} bytes")))?;
        // SAFETY: valid function; a plain attribute write.
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(
                self.0,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                v,
            )
        })
    }

    /// Launches with one parameter passed by value.
    ///
    /// # Safety
    /// `P` must match the kernel's parameter layout, and every pointer in
    /// it must stay valid until the stream reaches the kernel.
    pub unsafe fn launch<P>(
        &self,
        grid: u32,
        threads: u32,
        stream: &Stream,
        param: &P,
    ) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.launch_smem(grid, threads, 0, stream, param) }
    }

    /// [`Function::launch`] with `smem` bytes of dynamic shared memory per
    /// block (past 48 KiB, after [`Function::allow_dynamic_smem`]).
    ///
    /// # Safety
    /// As [`Function::launch`].
    pub unsafe fn launch_smem<P>(
        &self,
        grid: u32,
        threads: u32,
        smem: u32,
        stream: &Stream,
        param: &P,
    ) -> Result<()> {
        stream.ctx.bind()?;
        let mut args = [param as *const P as *mut c_void];
        // SAFETY: caller's contract; the driver copies the parameter before returning.
        unsafe {
            result::launch_kernel(
                self.0,
                (grid, 1, 1),
                (threads, 1, 1),
                smem,
                stream.raw,
                &mut args,
            )
        }
        .map_err(|e| CudaError::driver("cuLaunchKernel", e))
    }
}

/// `cuFuncLoad` (CUDA 12.4), looked up once in the loaded driver.
fn func_load() -> Option<unsafe extern "C" fn(sys::CUfunction) -> sys::CUresult> {
    static SYM: OnceLock<Option<unsafe extern "C" fn(sys::CUfunction) -> sys::CUresult>> =
        OnceLock::new();
    *SYM.get_or_init(|| {
        // SAFETY: `init` succeeded (the library is loaded); the symbol, if
        // present, has this C signature and lives as long as the library,
        // which cudarc keeps loaded for the process's life.
        unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn(sys::CUfunction) -> sys::CUresult>(b"cuFuncLoad\0")
                .ok()
                .map(|f| *f)
        }
    })
}

/// A captured and instantiated CUDA graph.
#[derive(Debug)]
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<Ctx>,
}

// SAFETY: graph handles may be launched from any thread with the context bound.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures everything `body` enqueues on `stream` into a graph.
    pub fn capture(stream: &Stream, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        stream.ctx.bind()?;
        // SAFETY: valid stream; relaxed mode so other threads' unrelated
        // driver calls are not disturbed by this capture.
        unsafe {
            check(
                "cuStreamBeginCapture",
                sys::cuStreamBeginCapture_v2(
                    stream.raw,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                ),
            )?
        };
        let body_result = body();
        // SAFETY: capture was begun above on this stream.
        let graph = unsafe { result::stream::end_capture(stream.raw) }
            .map_err(|e| CudaError::driver("cuStreamEndCapture", e))?;
        body_result?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` is a valid captured graph.
        unsafe {
            check(
                "cuGraphInstantiate",
                sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            )?
        };
        Ok(Graph {
            graph,
            exec,
            ctx: stream.ctx.clone(),
        })
    }

    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid instantiated graph and stream.
        unsafe { check("cuGraphLaunch", sys::cuGraphLaunch(self.exec, stream.raw)) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created in `capture`, destroyed once.
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.exec);
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{mps_full, sys::cudaError_enum as E};

    #[test]
    fn a_full_mps_server_is_named_with_the_ways_around_it() {
        for code in [
            E::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
            E::CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
            E::CUDA_ERROR_OUT_OF_MEMORY,
        ] {
            let why = mps_full(code).expect("an MPS limit");
            assert!(why.contains("fewer rank processes per GPU"), "{why}");
            assert!(why.contains("CUDA_DEVICE_MAX_CONNECTIONS"), "{why}");
        }
        assert_eq!(mps_full(E::CUDA_ERROR_INVALID_VALUE), None);
    }
}
