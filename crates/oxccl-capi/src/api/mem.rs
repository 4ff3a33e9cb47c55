//! PreMulSum ops, registration, `ncclMemAlloc`, and what is declared but
//! not supported yet (symmetric windows, device communicators).

use std::alloc::Layout;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};

use parking_lot::Mutex;

use crate::abi::{self, NcclCommT, NcclDataType, NcclRedOp, NcclResult, SUCCESS};
use crate::error::{guard, CError, CResult};
use crate::exec;
use crate::handle::{self, PreMul, Scalar};

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
        if buff.is_null() || size == 0 {
            return Err(CError::arg("buff is NULL or size is 0"));
        }
        (buff as usize)
            .checked_add(size)
            .ok_or_else(|| CError::arg("buff + size overflows"))?;
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

/// Device allocations of `ncclMemAlloc` (addresses), so `ncclMemFree`
/// frees only what it handed out.
static DEVICE_ALLOCS: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

fn host_backend() -> CResult<bool> {
    let cfg = super::init::facade_config(&Default::default())?;
    Ok(cfg.backend == oxccl::BackendKind::Host)
}

/// Memory for buffers: device memory of the calling thread's current CUDA
/// context (`cuMemAlloc`; make the device current first, as NCCL
/// requires), or page-aligned zeroed host memory on the host backend.
/// Either kind goes to every collective and to `ncclCommRegister`.
///
/// # Safety
/// `ptr` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guard("ncclMemAlloc", || {
        let outp = out(ptr, "ptr")?;
        if size == 0 {
            return Err(CError::arg("size is 0"));
        }
        let p = if host_backend()? {
            host_alloc(size)?
        } else {
            let d = oxccl::backend::cuda::alloc_current(size)?;
            DEVICE_ALLOCS
                .lock()
                .get_or_insert_with(HashSet::new)
                .insert(d);
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

/// Frees memory from `ncclMemAlloc`; any other pointer is refused.
#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guard("ncclMemFree", || {
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
        let device = DEVICE_ALLOCS
            .lock()
            .as_mut()
            .is_some_and(|s| s.remove(&addr));
        if !device {
            return Err(CError::arg(format!(
                "{ptr:p} was not allocated by ncclMemAlloc"
            )));
        }
        // SAFETY: from `alloc_current` in ncclMemAlloc, freed once (removed
        // from the table above); cuMemFree waits for the device's work.
        unsafe { oxccl::backend::cuda::free_current(addr) }?;
        Ok(SUCCESS)
    })
}

fn unsupported(what: &str) -> CResult<NcclResult> {
    Err(CError::usage(format!(
        "{what} are not supported by oxccl yet; use the collectives on ordinary buffers"
    )))
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    comm: NcclCommT,
    _buff: *mut c_void,
    _size: usize,
    _win: *mut *mut c_void,
    _flags: c_int,
) -> NcclResult {
    guard("ncclCommWindowRegister", || {
        handle::lookup(comm)?;
        unsupported("symmetric memory windows")
    })
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: NcclCommT, _win: *mut c_void) -> NcclResult {
    guard("ncclCommWindowDeregister", || {
        handle::lookup(comm)?;
        unsupported("symmetric memory windows")
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
