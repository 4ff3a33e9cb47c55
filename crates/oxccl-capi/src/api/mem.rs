//! PreMulSum ops, registration and windows, `ncclMemAlloc`, and what is
//! declared but not supported yet (device communicators).

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use parking_lot::Mutex;

use crate::abi::{self, NcclCommT, NcclDataType, NcclRedOp, NcclResult, SUCCESS};
use crate::error::{guard, CError, CResult};
use crate::exec;
use crate::handle::{self, PreMul, Scalar};
use crate::window;

use super::out;

/// Makes a PreMulSum op for `comm`: each rank's input times the scalar,
/// then summed. `ncclScalarHostImmediate` reads the scalar now;
/// `ncclScalarDevice` reads it at every call that uses the op.
///
/// # Safety
/// `op` null or writable; `scalar` null or one element of `datatype`
/// (host memory for HostImmediate, the communicator's memory for Device,
/// kept alive until the op is destroyed).
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut NcclRedOp,
    scalar: *mut c_void,
    datatype: NcclDataType,
    residence: c_int,
    comm: NcclCommT,
) -> NcclResult {
    guard("ncclRedOpCreatePreMulSum", || {
        let c = handle::lookup(comm)?;
        let outp = out(op, "op")?;
        let dt = exec::dtype(datatype)?;
        let addr = scalar as usize;
        if addr == 0 || !addr.is_multiple_of(dt.size()) {
            return Err(CError::arg(format!(
                "scalar {scalar:p} is NULL or misaligned for {dt}"
            )));
        }
        let s = match residence {
            // SAFETY: the caller's host scalar of `dt`, checked aligned.
            abi::SCALAR_HOST_IMMEDIATE => Scalar::Value(unsafe { typed!(dt, read_at(addr)) }),
            abi::SCALAR_DEVICE => Scalar::At(addr),
            v => {
                return Err(CError::arg(format!(
                    "residence {v} is not ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
                )))
            }
        };
        if let Scalar::Value(v) = s {
            if !v.is_finite() {
                return Err(CError::arg(format!("PreMulSum scalar {v} is not finite")));
            }
        }
        let mut slots = c.premul.lock();
        let p = PreMul {
            dtype: dt,
            scalar: s,
        };
        let i = match slots.iter().position(Option::is_none) {
            Some(i) => {
                slots[i] = Some(p);
                i
            }
            None => {
                slots.push(Some(p));
                slots.len() - 1
            }
        };
        let h = c_int::try_from(i)
            .ok()
            .and_then(|i| i.checked_add(abi::NUM_OPS))
            .ok_or_else(|| CError::usage("too many PreMulSum ops on one communicator"))?;
        // SAFETY: checked by `out`.
        unsafe { outp.write(h) };
        Ok(SUCCESS)
    })
}

/// # Safety
/// `addr` holds an aligned, readable `T`.
unsafe fn read_at<T: oxccl::Element>(addr: usize) -> f64 {
    // SAFETY: forwarded.
    unsafe { crate::scalar::read_host::<T>(addr) }
}

/// Frees a PreMulSum op of `comm`; built-in ops and others' ops are
/// refused.
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: NcclRedOp, comm: NcclCommT) -> NcclResult {
    guard("ncclRedOpDestroy", || {
        let c = handle::lookup(comm)?;
        let slot = usize::try_from(op - abi::NUM_OPS)
            .ok()
            .filter(|&i| matches!(c.premul.lock().get(i), Some(Some(_))))
            .ok_or_else(|| {
                CError::arg(format!(
                    "op {op} is not a live PreMulSum op of this communicator"
                ))
            })?;
        c.premul.lock()[slot] = None;
        Ok(SUCCESS)
    })
}

/// Registers a buffer with `comm`: calls whose buffers lie in registered
/// ranges on every rank may run the direct (zero-copy) plans.
///
/// # Safety
/// `handle` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: NcclCommT,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    guard("ncclCommRegister", || {
        let c = handle::lookup(comm)?;
        let outp = out(handle, "handle")?;
        check_span(buff, size)?;
        // SAFETY: NCCL's contract for registered buffers is the facade's:
        // the range is one allocation of the rank's memory, kept until
        // deregistered and while calls on it run.
        let reg = unsafe { c.get()?.register(buff, size) }?;
        let token = Box::into_raw(Box::new(0u64)) as usize;
        c.registered.lock().insert(token, reg);
        // SAFETY: checked by `out`.
        unsafe { outp.write(token as *mut c_void) };
        Ok(SUCCESS)
    })
}

/// Forgets a registration of `comm`; a handle it did not give is refused.
#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: NcclCommT, handle: *mut c_void) -> NcclResult {
    guard("ncclCommDeregister", || {
        let c = handle::lookup(comm)?;
        let reg = c
            .registered
            .lock()
            .remove(&(handle as usize))
            .ok_or_else(|| {
                CError::arg(format!(
                    "handle {handle:p} is not a registration of this communicator"
                ))
            })?;
        let done = c.get().map(|x| x.deregister(reg));
        // SAFETY: the token was made by Box::into_raw in ncclCommRegister
        // and leaves the table only here, once.
        drop(unsafe { Box::from_raw(handle as *mut u64) });
        done??;
        Ok(SUCCESS)
    })
}

/// Host allocations of `ncclMemAlloc`: address → layout.
static HOST_ALLOCS: Mutex<Option<HashMap<usize, Layout>>> = Mutex::new(None);

/// Device allocations of `ncclMemAlloc` by address, so `ncclMemFree`
/// frees only what it handed out, the way it was made.
static DEVICE_ALLOCS: Mutex<Option<HashMap<u64, oxccl::backend::cuda::SymMem>>> = Mutex::new(None);

fn host_backend() -> CResult<bool> {
    let cfg = super::init::facade_config(&Default::default())?;
    Ok(cfg.backend == oxccl::BackendKind::Host)
}

/// Memory for buffers, as NCCL's `ncclMemAlloc` makes it: on CUDA, memory
/// of the calling thread's current context's device (make the device
/// current first, as NCCL requires) from the virtual memory management
/// API (`cuMemCreate`, exportable as a POSIX file descriptor, mapped with
/// read/write access for the device and every device with peer access to
/// it, the size rounded up to the recommended granularity), or
/// `cuMemAlloc` memory on a device without VMM; on the host backend,
/// page-aligned zeroed host memory. Either kind goes to every collective,
/// to `ncclCommRegister` and to `ncclCommWindowRegister`. A size of 0
/// succeeds with a NULL pointer, as NCCL's (its `cudaMalloc` of 0 bytes)
/// does; `ncclMemFree(NULL)` succeeds.
///
/// # Safety
/// `ptr` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guard("ncclMemAlloc", || {
        let outp = out(ptr, "ptr")?;
        let p = if size == 0 {
            std::ptr::null_mut()
        } else if host_backend()? {
            host_alloc(size)?
        } else {
            let m = oxccl::backend::cuda::alloc_symmetric(size)?;
            let d = m.ptr;
            DEVICE_ALLOCS
                .lock()
                .get_or_insert_with(HashMap::new)
                .insert(d, m);
            d as usize as *mut c_void
        };
        // SAFETY: checked by `out`.
        unsafe { outp.write(p) };
        Ok(SUCCESS)
    })
}

fn host_alloc(size: usize) -> CResult<*mut c_void> {
    let layout = Layout::from_size_align(size, 4096)
        .map_err(|e| CError::arg(format!("size {size}: {e}")))?;
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(CError {
            code: abi::SYSTEM_ERROR,
            msg: format!("out of host memory for {size} bytes"),
        });
    }
    HOST_ALLOCS
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(p as usize, layout);
    Ok(p.cast())
}

/// Frees memory from `ncclMemAlloc` (NULL: nothing to free, success, as
/// in NCCL); any other pointer is refused. Device memory is released once
/// the device's work in its context has finished.
#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return Ok(SUCCESS);
        }
        let host = HOST_ALLOCS
            .lock()
            .as_mut()
            .and_then(|m| m.remove(&(ptr as usize)));
        if let Some(layout) = host {
            // SAFETY: allocated with this layout in ncclMemAlloc, freed
            // once (removed from the table above).
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            return Ok(SUCCESS);
        }
        let addr = ptr as usize as u64;
        let device = DEVICE_ALLOCS.lock().as_mut().and_then(|s| s.remove(&addr));
        let Some(m) = device else {
            return Err(CError::arg(format!(
                "{ptr:p} was not allocated by ncclMemAlloc"
            )));
        };
        // SAFETY: made by ncclMemAlloc, freed once (removed from the table
        // above); the free waits for the work of its context, as NCCL's
        // does, and the caller uses the pointer no more.
        unsafe { oxccl::backend::cuda::free_symmetric(m) }?;
        Ok(SUCCESS)
    })
}

fn unsupported(what: &str) -> CResult<NcclResult> {
    Err(CError::usage(format!(
        "{what} are not supported by oxccl yet; use the collectives on ordinary buffers"
    )))
}

/// Registers `size` bytes at `buff` as this rank's window of `comm`
/// (`oxccl::Communicator::window_register`): every rank registers its
/// own, and calls whose buffers lie in windows on every rank may run the
/// direct, zero-copy plans. `winFlags`: `NCCL_WIN_COLL_SYMMETRIC` needs
/// `buff` aligned to `NCCL_WIN_REQUIRED_ALIGNMENT` (4096; refused with
/// `ncclInvalidArgument` otherwise); `NCCL_WIN_STRICT_ORDERING` and other
/// bits are accepted and change nothing. The handle written to `win` is
/// a token for `ncclWinGetUserPtr` and `ncclCommWindowDeregister`, never
/// an address. Nothing is written on an error.
///
/// # Safety
/// `win` null or writable; NCCL's contract for the range (one allocation
/// of the rank's memory, kept until deregistered and while calls on it
/// run).
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: NcclCommT,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    flags: c_int,
) -> NcclResult {
    guard("ncclCommWindowRegister", || {
        let c = handle::lookup(comm)?;
        let outp = out(win, "win")?;
        check_span(buff, size)?;
        let flags = flags as u32;
        if flags & oxccl::WIN_COLL_SYMMETRIC != 0
            && !(buff as u64).is_multiple_of(oxccl::WIN_REQUIRED_ALIGNMENT)
        {
            return Err(CError::arg(format!(
                "buff {buff:p} of a symmetric window (NCCL_WIN_COLL_SYMMETRIC) is not aligned \
                 to NCCL_WIN_REQUIRED_ALIGNMENT ({})",
                oxccl::WIN_REQUIRED_ALIGNMENT
            )));
        }
        c.callable()?;
        // SAFETY: NCCL's contract for windows is the facade's (above).
        let w = unsafe { c.get()?.window_register(buff, size, flags) }?;
        let h = window::publish(comm, w)?;
        // SAFETY: checked by `out`.
        unsafe { outp.write(h as *mut c_void) };
        Ok(SUCCESS)
    })
}

/// Ends a window of `comm`: later calls on its range run as on ordinary
/// memory. Local to the rank, and safe while calls on the window are
/// still running (they keep their plans; nothing is released). A handle
/// `comm` did not give, or one deregistered already, is refused.
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: NcclCommT, win: *mut c_void) -> NcclResult {
    guard("ncclCommWindowDeregister", || {
        let c = handle::lookup(comm)?;
        let w = window::take(comm, win as usize)?;
        c.get()?.window_deregister(&w)?;
        Ok(SUCCESS)
    })
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    comm: NcclCommT,
    _reqs: *const c_void,
    _out: *mut c_void,
) -> NcclResult {
    guard("ncclDevCommCreate", || {
        handle::lookup(comm)?;
        unsupported("device communicators")
    })
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(comm: NcclCommT, _dev: *const c_void) -> NcclResult {
    guard("ncclDevCommDestroy", || {
        handle::lookup(comm)?;
        unsupported("device communicators")
    })
}

/// The range a registration names: not NULL, not empty, not wrapping
/// the address space (`ncclCommRegister`, `ncclCommWindowRegister`).
fn check_span(buff: *mut c_void, size: usize) -> Result<(), CError> {
    if buff.is_null() || size == 0 {
        return Err(CError::arg("buff is NULL or size is 0"));
    }
    (buff as usize)
        .checked_add(size)
        .ok_or_else(|| CError::arg("buff + size overflows"))?;
    Ok(())
}
