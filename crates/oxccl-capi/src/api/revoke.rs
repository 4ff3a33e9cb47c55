//! `ncclCommRevoke` (NCCL 2.28.7): stop a communicator's in-flight work
//! and keep the handle for management (destroy, abort, shrink, split).

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use crate::abi::{NcclCommT, NcclResult, SUCCESS};
use crate::error::{guard, CError};
use crate::handle;

/// Aborts `comm`'s pending work (peers' waits on it fail, as with an
/// abort), waits until its streams have drained, and marks it revoked:
/// calls and `ncclCommFinalize` are `ncclInvalidUsage` from then on,
/// `ncclCommGetAsyncError` reports success (the revoked work is not an
/// error), and the handle stays valid for destroy, abort, shrink and
/// split. Returns when the communicator is quiescent, so it never reports
/// `ncclInProgress`. `revokeFlags` must be `NCCL_REVOKE_DEFAULT` (0).
#[no_mangle]
pub extern "C" fn ncclCommRevoke(comm: NcclCommT, flags: c_int) -> NcclResult {
    guard("ncclCommRevoke", || {
        let c = handle::lookup(comm)?;
        if flags != 0 {
            return Err(CError::arg(format!(
                "revokeFlags {flags} is not NCCL_REVOKE_DEFAULT (0)"
            )));
        }
        c.join_init();
        if let Some(x) = c.ready() {
            x.abort();
            // Drained: whatever was pending has failed or finished.
            let _ = x.synchronize();
        }
        c.revoked.store(true, Ordering::Release);
        Ok(SUCCESS)
    })
}
