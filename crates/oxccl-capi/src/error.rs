//! The boundary: every entry point runs its body through [`guard`], which
//! catches panics, turns errors into `ncclResult_t` codes and keeps the
//! message for `ncclGetLastError`.

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use parking_lot::Mutex;
use thiserror::Error;

use crate::abi::{self, NcclResult};

/// What an entry point can fail with: a result code and what to tell the
/// caller.
#[derive(Debug, Clone, Error)]
#[error("{msg}")]
pub struct CError {
    pub code: NcclResult,
    pub msg: String,
}

impl CError {
    pub fn arg(msg: impl Into<String>) -> CError {
        CError {
            code: abi::INVALID_ARGUMENT,
            msg: msg.into(),
        }
    }

    pub fn usage(msg: impl Into<String>) -> CError {
        CError {
            code: abi::INVALID_USAGE,
            msg: msg.into(),
        }
    }
}

impl From<oxccl::Error> for CError {
    fn from(e: oxccl::Error) -> CError {
        CError {
            code: e.nccl_result(),
            msg: e.to_string(),
        }
    }
}

pub type CResult<T> = Result<T, CError>;

/// Messages handed out by `ncclGetLastError` stay valid while the last
/// few errors are kept (NCCL's own buffer is overwritten by the next error).
const KEPT: usize = 32;

static LAST: Mutex<VecDeque<CString>> = Mutex::new(VecDeque::new());

thread_local! {
    /// This thread's last message (an index is not needed: a pointer into
    /// `LAST` is returned, so the string lives there).
    static MINE: std::cell::Cell<Option<*const std::ffi::c_char>> = const { std::cell::Cell::new(None) };
}

/// Records `msg` as the last error (of this thread and of the process).
pub fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let mut last = LAST.lock();
    if last.len() == KEPT {
        last.pop_front();
    }
    last.push_back(c);
    let p = last.back().map(|c| c.as_ptr());
    MINE.with(|m| m.set(p));
}

/// The last error message: this thread's if it is still kept, else the
/// process's latest, else "".
pub fn last() -> *const std::ffi::c_char {
    let last = LAST.lock();
    let mine = MINE.with(|m| m.get());
    if let Some(p) = mine.filter(|p| last.iter().any(|c| c.as_ptr() == *p)) {
        return p;
    }
    last.back().map_or(c"".as_ptr(), |c| c.as_ptr())
}

/// Runs one entry point's body: a panic becomes `ncclInternalError`, an
/// error its code; either is logged and kept for `ncclGetLastError`.
pub fn guard(name: &str, f: impl FnOnce() -> CResult<NcclResult>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let msg = format!("{name}: {}", e.msg);
            tracing::warn!("oxccl: {msg}");
            set_last(&msg);
            e.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let msg =
                format!("{name}: internal error (a panic was caught at the C boundary): {what}");
            tracing::error!("oxccl: {msg}");
            set_last(&msg);
            abi::INTERNAL_ERROR
        }
    }
}

/// For entry points that return a pointer or nothing: a panic is caught
/// and `fallback` returned.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The static text of a result code.
pub fn result_str(r: NcclResult) -> &'static CStr {
    abi::result_name(r)
}
