//! Communicator handles. A `ncclComm_t` given out here is the address of
//! an `Arc<CComm>` kept in a table of live communicators; every call looks
//! the handle up there before touching anything, so a destroyed, foreign
//! or made-up handle is an `ncclInvalidArgument`, never a dereference.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use oxccl::{BackendKind, Communicator, RedOp};
use parking_lot::Mutex;

use crate::abi::{self, NcclCommT, NcclResult};
use crate::error::{CError, CResult};

/// Where a communicator's buffers live: what the pointers the caller
/// passes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Host memory of this process (the host backend, `OXCCL_BACKEND=host`).
    Host,
    /// CUDA device memory; work is ordered on the caller's stream.
    Device,
}

/// A PreMulSum op's scalar: a value read at creation, or an address read
/// at each call (`ncclScalarDevice`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Value(f64),
    At(usize),
}

/// A PreMulSum op made by `ncclRedOpCreatePreMulSum`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreMul {
    pub dtype: oxccl::DataType,
    pub scalar: Scalar,
}

/// One rank's communicator as the C ABI holds it.
#[derive(Debug)]
pub struct CComm {
    /// Set once initialisation has finished (at once for blocking inits).
    comm: OnceLock<Communicator>,
    /// Why initialisation failed, if it did.
    init_error: Mutex<Option<CError>>,
    /// A nonblocking or grouped init still running.
    init_thread: Mutex<Option<JoinHandle<()>>>,
    pub nranks: u32,
    pub rank: u32,
    pub blocking: bool,
    pub name: Option<String>,
    pub aborted: AtomicBool,
    /// `ncclCommRevoke` ran: no more calls, management only.
    pub revoked: AtomicBool,
    /// Between `ncclCommSuspend` and `ncclCommResume`: no calls.
    pub suspended: AtomicBool,
    /// PreMulSum ops: handle `NUM_OPS + i` is slot `i`.
    pub premul: Mutex<Vec<Option<PreMul>>>,
    /// `ncclCommRegister` records: handle address → the facade's.
    pub registered: Mutex<HashMap<usize, oxccl::Registration>>,
}

static LIVE: Mutex<Option<HashMap<usize, Arc<CComm>>>> = Mutex::new(None);

impl CComm {
    pub fn new(nranks: u32, rank: u32, blocking: bool, name: Option<String>) -> CComm {
        CComm {
            comm: OnceLock::new(),
            init_error: Mutex::new(None),
            init_thread: Mutex::new(None),
            nranks,
            rank,
            blocking,
            name,
            aborted: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            suspended: AtomicBool::new(false),
            premul: Mutex::new(Vec::new()),
            registered: Mutex::new(HashMap::new()),
        }
    }

    /// Records the end of initialisation.
    pub fn finish_init(&self, r: CResult<Communicator>) {
        match r {
            Ok(c) => {
                let _ = self.comm.set(c);
            }
            Err(e) => *self.init_error.lock() = Some(e),
        }
    }

    pub fn set_init_thread(&self, t: JoinHandle<()>) {
        *self.init_thread.lock() = Some(t);
    }

    /// Waits for a running init thread, if any (group ends and teardown).
    pub fn join_init(&self) {
        let t = self.init_thread.lock().take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    /// Whether a background init is still running.
    pub fn initializing(&self) -> bool {
        self.comm.get().is_none() && self.init_error.lock().is_none()
    }

    /// The communicator, once initialised.
    pub fn get(&self) -> CResult<&Communicator> {
        if let Some(c) = self.comm.get() {
            return Ok(c);
        }
        if let Some(e) = self.init_error.lock().clone() {
            return Err(CError {
                code: e.code,
                msg: format!("the communicator's initialisation failed: {}", e.msg),
            });
        }
        Err(CError::usage(
            "the communicator is still initialising (nonblocking or grouped init): poll ncclCommGetAsyncError until it is not ncclInProgress",
        ))
    }

    /// Whether calls may be issued: not revoked, not suspended.
    pub fn callable(&self) -> CResult<()> {
        if self.revoked.load(Ordering::Acquire) {
            return Err(CError::usage(
                "the communicator was revoked (ncclCommRevoke): only destroy, abort, split and shrink are allowed",
            ));
        }
        if self.suspended.load(Ordering::Acquire) {
            return Err(CError::usage(
                "the communicator is suspended (ncclCommSuspend): call ncclCommResume first",
            ));
        }
        Ok(())
    }

    /// The raw communicator if ready (no error built).
    pub fn ready(&self) -> Option<&Communicator> {
        self.comm.get()
    }

    /// Where this communicator's buffers live.
    pub fn space(&self) -> CResult<Space> {
        Ok(match self.get()?.backend() {
            BackendKind::Cuda => Space::Device,
            _ => Space::Host,
        })
    }

    /// `ncclCommGetAsyncError`: in progress while initialising, else the
    /// init's or the clique's failure, else success.
    pub fn async_result(&self) -> NcclResult {
        if self.revoked.load(Ordering::Acquire) {
            // Revoked and quiescent: the aborted work is not an error.
            return abi::SUCCESS;
        }
        if let Some(c) = self.comm.get() {
            return c.async_error().map_or(abi::SUCCESS, |e| e.nccl_result());
        }
        match &*self.init_error.lock() {
            Some(e) => e.code,
            None => abi::IN_PROGRESS,
        }
    }

    /// The reduction op behind an `ncclRedOp_t` value (read as an int).
    /// An `ncclScalarDevice` scalar is read now, after the work issued on
    /// `stream` (the caller's stream of the call).
    pub fn op(&self, op: std::ffi::c_int, dtype: oxccl::DataType, stream: usize) -> CResult<RedOp> {
        Ok(match op {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            v if v >= abi::NUM_OPS => {
                let slot = (v - abi::NUM_OPS) as usize;
                let p = self.premul.lock().get(slot).copied().flatten().ok_or_else(|| {
                    CError::arg(format!(
                        "op {v} is not a PreMulSum op of this communicator (made by ncclRedOpCreatePreMulSum on another communicator, or destroyed)"
                    ))
                })?;
                if p.dtype != dtype {
                    return Err(CError::arg(format!(
                        "op {v} was made for {} but the call is on {dtype}",
                        p.dtype
                    )));
                }
                RedOp::PreMulSum(match p.scalar {
                    Scalar::Value(v) => v,
                    Scalar::At(addr) => crate::exec::read_scalar(self, addr, dtype, stream)?,
                })
            }
            v => {
                return Err(CError::arg(format!(
                    "op {v} is not an ncclRedOp_t (0..=4, or a PreMulSum op)"
                )))
            }
        })
    }
}

/// Registers a new handle and returns it.
pub fn publish(c: Arc<CComm>) -> NcclCommT {
    let h = Arc::as_ptr(&c) as NcclCommT;
    LIVE.lock()
        .get_or_insert_with(HashMap::new)
        .insert(h as usize, c);
    h
}

/// The live communicator behind `h`.
pub fn lookup(h: NcclCommT) -> CResult<Arc<CComm>> {
    if h.is_null() {
        return Err(CError::arg("comm is NULL"));
    }
    LIVE.lock()
        .as_ref()
        .and_then(|m| m.get(&(h as usize)).cloned())
        .ok_or_else(|| {
            CError::arg(format!(
                "comm {h:p} is not a live communicator of this library (destroyed already, or not made by it)"
            ))
        })
}

/// Takes `h` out of the table (destroy, abort); later lookups fail.
pub fn retire(h: NcclCommT) -> CResult<Arc<CComm>> {
    if h.is_null() {
        return Err(CError::arg("comm is NULL"));
    }
    LIVE.lock()
        .as_mut()
        .and_then(|m| m.remove(&(h as usize)))
        .ok_or_else(|| {
            CError::arg(format!(
                "comm {h:p} is not a live communicator of this library (destroyed already, or not made by it)"
            ))
        })
}

/// Marks a communicator aborted: its clique's waits fail, and it is dropped.
pub fn abort(c: &CComm) {
    c.aborted.store(true, Ordering::Release);
    if let Some(comm) = c.ready() {
        comm.abort();
        comm.destroy();
    }
}
