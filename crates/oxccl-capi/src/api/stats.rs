//! Memory statistics, suspend and resume (NCCL 2.29/2.30).
//!
//! What oxccl holds on the GPU for a communicator (its clique's links,
//! scratch, heaps, pools and `alloc` buffers) lives as long as the clique:
//! a `cuMemFree` while peers' kernels may spin waits for every kernel of
//! the device, so none of it is released while the communicator lives.
//! `ncclCommMemStats` says so honestly: nothing suspendable, everything
//! persistent. `ncclCommSuspend` therefore frees nothing; it makes the
//! communicator refuse calls until `ncclCommResume`, as NCCL's does.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use crate::abi::{NcclCommT, NcclResult, SUCCESS};
use crate::error::{guard, CError};
use crate::handle;

use super::out;

/// `NCCL_SUSPEND_MEM`: release what can be released (here: nothing).
const SUSPEND_MEM: c_int = 1;

/// `ncclCommMemStat_t` values.
const GPU_MEM_SUSPEND: c_int = 0;
const GPU_MEM_SUSPENDED: c_int = 1;
const GPU_MEM_PERSIST: c_int = 2;
const GPU_MEM_TOTAL: c_int = 3;

/// Writes one memory statistic of `comm`: suspendable bytes (0), whether
/// it is suspended, persistent bytes and the total, as the module says.
///
/// # Safety
/// `value` must be null or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommMemStats(
    comm: NcclCommT,
    stat: c_int,
    value: *mut u64,
) -> NcclResult {
    guard("ncclCommMemStats", || {
        let c = handle::lookup(comm)?;
        let p = out(value, "value")?;
        let held = c.get()?.device_memory_bytes();
        let v = match stat {
            GPU_MEM_SUSPEND => 0,
            GPU_MEM_SUSPENDED => u64::from(c.suspended.load(Ordering::Acquire)),
            GPU_MEM_PERSIST | GPU_MEM_TOTAL => held,
            s => {
                return Err(CError::arg(format!(
                    "stat {s} is not an ncclCommMemStat_t (0..=3)"
                )))
            }
        };
        // SAFETY: checked non-null and aligned; the caller's uint64_t.
        unsafe { p.write(v) };
        Ok(SUCCESS)
    })
}

/// Stops `comm` from taking calls until [`ncclCommResume`]; its pending
/// work completes first. Releases nothing (see the module).
#[no_mangle]
pub extern "C" fn ncclCommSuspend(comm: NcclCommT, flags: c_int) -> NcclResult {
    guard("ncclCommSuspend", || {
        let c = handle::lookup(comm)?;
        if flags & !SUSPEND_MEM != 0 {
            return Err(CError::arg(format!(
                "flags {flags:#x} holds bits other than NCCL_SUSPEND_MEM"
            )));
        }
        c.join_init();
        // Work already failed is the async error's to report.
        let _ = c.get()?.synchronize();
        c.suspended.store(true, Ordering::Release);
        Ok(SUCCESS)
    })
}

/// Lets a suspended `comm` take calls again.
#[no_mangle]
pub extern "C" fn ncclCommResume(comm: NcclCommT) -> NcclResult {
    guard("ncclCommResume", || {
        let c = handle::lookup(comm)?;
        if !c.suspended.swap(false, Ordering::AcqRel) {
            return Err(CError::usage(
                "ncclCommResume on a communicator that is not suspended",
            ));
        }
        Ok(SUCCESS)
    })
}
