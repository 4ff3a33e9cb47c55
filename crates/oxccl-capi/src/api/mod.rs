//! The exported functions, by theme. Each is `unsafe extern "C"` (the
//! caller vouches for its pointers as NCCL's documentation says), checks
//! what it can, and runs through [`crate::error::guard`].

mod alias;
mod coll;
mod group;
mod group_end;
mod grow;
pub(crate) mod init;
mod mem;
mod onesided;
mod param;
mod query;
mod revoke;
mod split_bg;
mod stats;

use crate::error::{CError, CResult};

/// An output pointer the call will write one `T` through: non-null and
/// aligned, or `ncclInvalidArgument` naming it.
pub(crate) fn out<T>(p: *mut T, what: &str) -> CResult<*mut T> {
    if p.is_null() {
        return Err(CError::arg(format!("{what} is NULL")));
    }
    if !p.is_aligned() {
        return Err(CError::arg(format!("{what} {p:p} is misaligned")));
    }
    Ok(p)
}
