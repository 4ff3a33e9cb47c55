//! Errors and queries: version, error strings, async errors, rank and
//! count.

use std::ffi::{c_char, c_int};

use crate::abi::{self, NcclCommT, NcclResult, SUCCESS};
use crate::error::{self, guard, guard_value};
use crate::handle;

use super::out;

/// Writes the NCCL version whose interface this library implements (2.30.7 as 23007).
///
/// # Safety
/// `version` must be null or point to writable memory for an int.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    guard("ncclGetVersion", || {
        let p = out(version, "version")?;
        // SAFETY: checked non-null and aligned; the caller's int.
        unsafe { p.write(abi::VERSION_CODE) };
        Ok(SUCCESS)
    })
}

/// A static description of `result`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    guard_value(c"unknown result code".as_ptr(), || {
        error::result_str(result).as_ptr()
    })
}

/// The last error's message: `comm`'s own failure when it has one (what
/// `ncclCommGetAsyncError` reports: a wait that hit its deadline, a peer
/// that failed), else the calling thread's last error while it is among
/// the last 32 kept, else the process's last.
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: NcclCommT) -> *const c_char {
    guard_value(c"".as_ptr(), || {
        let failed = (!comm.is_null())
            .then(|| handle::lookup(comm).ok())
            .flatten()
            .and_then(|c| c.async_message());
        if let Some(msg) = failed {
            error::set_last(&msg);
        }
        error::last()
    })
}

/// Logging is set up once from `NCCL_DEBUG`/`OXCCL_DEBUG`; nothing to reset.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}

/// `ncclInProgress` while a nonblocking init runs, then the init's result,
/// then the communicator's failure if it failed. Safe from any thread.
///
/// # Safety
/// `async_error` must be null or point to a writable `ncclResult_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: NcclCommT,
    async_error: *mut NcclResult,
) -> NcclResult {
    guard("ncclCommGetAsyncError", || {
        let c = handle::lookup(comm)?;
        let p = out(async_error, "asyncError")?;
        // SAFETY: checked; the caller's result slot.
        unsafe { p.write(c.async_result()) };
        Ok(SUCCESS)
    })
}

/// # Safety
/// `count` must be null or point to a writable int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: NcclCommT, count: *mut c_int) -> NcclResult {
    guard("ncclCommCount", || {
        let c = handle::lookup(comm)?;
        let p = out(count, "count")?;
        if c.nranks == 0 {
            // A nonblocking split's child, not made yet (or failed).
            c.get()?;
        }
        // SAFETY: checked.
        unsafe { p.write(c.nranks as c_int) };
        Ok(SUCCESS)
    })
}

/// # Safety
/// `rank` must be null or point to a writable int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclCommT, rank: *mut c_int) -> NcclResult {
    guard("ncclCommUserRank", || {
        let c = handle::lookup(comm)?;
        let p = out(rank, "rank")?;
        if c.nranks == 0 {
            // A nonblocking split's child, not made yet (or failed).
            c.get()?;
        }
        // SAFETY: checked.
        unsafe { p.write(c.rank as c_int) };
        Ok(SUCCESS)
    })
}

/// The CUDA device ordinal the communicator's rank runs on; 0 on the host
/// backend.
///
/// # Safety
/// `device` must be null or point to a writable int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclCommT, device: *mut c_int) -> NcclResult {
    guard("ncclCommCuDevice", || {
        let c = handle::lookup(comm)?;
        let p = out(device, "device")?;
        let dev = c.get()?.cuda_device().unwrap_or(0);
        // SAFETY: checked.
        unsafe { p.write(dev) };
        Ok(SUCCESS)
    })
}
