//! Communicator handles. A `ncclComm_t` given out here is a token, not an
//! address: a serial number no other communicator of this process ever
//! gets (a generation per handle), placed in a range of values that is no
//! valid address on the platforms we build for, so C code that
//! dereferences one faults at once instead of reading something. A table
//! maps live tokens to their `Arc<CComm>`; every call looks the handle up
//! there before touching anything, so a destroyed, aborted, foreign or
//! made-up handle is an `ncclInvalidArgument`, never a dereference, and a
//! stale handle never reaches a communicator made after it was destroyed
//! (as an address could, once its allocation was reused).
//!
//! Lookups run on every call, from every rank thread (and from a
//! framework's watchdog polling `ncclCommGetAsyncError`), so the common
//! case touches nothing shared: each thread remembers the few handles it
//! looked up last (`recent`), and the table is behind a read-write lock
//! that concurrent lookups share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use oxccl::{BackendKind, Communicator, RedOp};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::abi::{self, NcclCommT, NcclResult};
use crate::error::{CError, CResult};
pub use crate::scalar::Space;

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
    /// A nonblocking split's child is a stand-in of 0 ranks until the
    /// split is done, when its handle is given the real child.
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
    /// The first failure of nonblocking work on this communicator that ran
    /// in the background (a split of it, a group end).
    background: Mutex<Option<CError>>,
    background_done: Condvar,
    /// How many such operations are running: read without the lock by
    /// every call ([`CComm::callable`]) and by `ncclCommGetAsyncError`,
    /// changed only while holding `background` (whose condition variable
    /// waits for it to reach 0).
    running: AtomicU32,
    /// Set (under `background`, before `running` drops) once it holds an
    /// error, so readers take the lock only then.
    background_failed: AtomicBool,
    /// Out of the handle table: destroyed, aborted, or its handle given to
    /// another communicator (a split's stand-in). Threads' remembered
    /// lookups of it are void from then on.
    unlisted: AtomicBool,
}

/// Live handles, and the serial the next one gets.
#[derive(Debug, Default)]
struct Live {
    next: u64,
    map: HashMap<usize, Arc<CComm>>,
}

static LIVE: RwLock<Option<Live>> = RwLock::new(None);

/// Where handle values start: bits 52..56 set and 63..56 clear, so no
/// handle is a canonical user-space address on x86-64 (47-bit) or AArch64
/// (48-bit, top byte ignored). Serials are shifted by 4, keeping handles
/// 16-byte aligned like the pointers C code expects.
const HANDLE_BASE: usize = 0x00f0_0000_0000_0000;
/// Serials that fit below bit 52 once shifted: 2^48 handles.
const MAX_SERIAL: u64 = (1 << 48) - 1;

/// The handle of serial `n`.
fn token(n: u64) -> usize {
    HANDLE_BASE | (n as usize) << 4
}

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
            background: Mutex::new(None),
            background_done: Condvar::new(),
            running: AtomicU32::new(0),
            background_failed: AtomicBool::new(false),
            unlisted: AtomicBool::new(false),
        }
    }

    /// A nonblocking split or group end of this communicator starts in the
    /// background: until it ends, `ncclCommGetAsyncError` says
    /// `ncclInProgress` and calls are refused (NCCL's users poll first).
    pub fn begin_background(&self) {
        let _b = self.background.lock();
        self.running.fetch_add(1, Ordering::AcqRel);
    }

    /// One background operation ended; its failure, if any, becomes the
    /// communicator's asynchronous error (the first one stays).
    pub fn end_background(&self, r: Result<(), &CError>) {
        let mut b = self.background.lock();
        if let Err(e) = r {
            b.get_or_insert_with(|| e.clone());
            self.background_failed.store(true, Ordering::Release);
        }
        // The error is visible before the count drops, so a reader that
        // sees no operation running also sees its failure.
        let _ = self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.background_done.notify_all();
    }

    /// Waits for the background operations (finalize, destroy).
    pub fn wait_background(&self) {
        let mut b = self.background.lock();
        while self.running.load(Ordering::Acquire) > 0 {
            self.background_done.wait(&mut b);
        }
    }

    /// The first background failure, if there was one (the lock is taken
    /// only then).
    fn background_error(&self) -> Option<CError> {
        if !self.background_failed.load(Ordering::Acquire) {
            return None;
        }
        self.background.lock().clone()
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
        if self.running.load(Ordering::Acquire) > 0 {
            return Err(CError::usage(
                "a nonblocking split or group end of this communicator is still running: poll ncclCommGetAsyncError until it is not ncclInProgress",
            ));
        }
        if self.nranks == 0 {
            // A nonblocking split's stand-in: still splitting, or failed.
            self.get()?;
        }
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
        if self.running.load(Ordering::Acquire) > 0 {
            return abi::IN_PROGRESS;
        }
        if let Some(e) = self.background_error() {
            return e.code;
        }
        if let Some(c) = self.comm.get() {
            return c.async_error().map_or(abi::SUCCESS, |e| e.nccl_result());
        }
        match &*self.init_error.lock() {
            Some(e) => e.code,
            None => abi::IN_PROGRESS,
        }
    }

    /// The message of the failure [`CComm::async_result`] reports, if it
    /// reports one: what `ncclGetLastError(comm)` then returns, so a
    /// framework that found the error by polling can say what it was.
    pub fn async_message(&self) -> Option<String> {
        if self.revoked.load(Ordering::Acquire) {
            return None;
        }
        if self.running.load(Ordering::Acquire) > 0 {
            return None;
        }
        if let Some(e) = self.background_error() {
            return Some(e.msg);
        }
        if let Some(c) = self.comm.get() {
            return c.async_error().map(|e| e.to_string());
        }
        self.init_error.lock().as_ref().map(|e| e.msg.clone())
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
                match p.scalar {
                    Scalar::Value(v) => RedOp::PreMulSum(v),
                    // As NCCL: the kernel reads it when the call runs (no
                    // host wait, legal while a graph is captured).
                    Scalar::At(addr) if self.get()?.reads_device_scalars() => {
                        RedOp::PreMulSumDevice(addr as u64)
                    }
                    Scalar::At(addr) => RedOp::PreMulSum(crate::scalar::read(
                        self.get()?,
                        self.space()?,
                        addr,
                        dtype,
                        stream,
                    )?),
                }
            }
            v => {
                return Err(CError::arg(format!(
                    "op {v} is not an ncclRedOp_t (0..=4, or a PreMulSum op)"
                )))
            }
        })
    }
}

/// Registers a new handle and returns it: a value no handle of this
/// process had before. (After 2^48 of them, years of making one a
/// microsecond, there are no more: an error rather than a repeat.)
pub fn publish(c: Arc<CComm>) -> CResult<NcclCommT> {
    let mut live = LIVE.write();
    let live = live.get_or_insert_with(Live::default);
    if live.next >= MAX_SERIAL {
        return Err(CError {
            code: abi::INTERNAL_ERROR,
            msg: "this process has used up its communicator handles".into(),
        });
    }
    live.next += 1;
    let h = token(live.next);
    live.map.insert(h, c);
    Ok(h as NcclCommT)
}

/// The live communicator behind `h`.
pub fn lookup(h: NcclCommT) -> CResult<Arc<CComm>> {
    if h.is_null() {
        return Err(CError::arg("comm is NULL"));
    }
    let key = h as usize;
    if let Some(c) = recent::get(key) {
        return Ok(c);
    }
    let c = LIVE
        .read()
        .as_ref()
        .and_then(|l| l.map.get(&key).cloned())
        .ok_or_else(|| {
            CError::arg(format!(
                "comm {h:p} is not a live communicator of this library (destroyed already, or not made by it)"
            ))
        })?;
    recent::put(key, &c);
    Ok(c)
}

/// Each thread's last few lookups. An entry holds its communicator weakly
/// (a thread that stops calling keeps nothing alive) and is good while
/// the communicator is alive and still in the table under that handle:
/// handles are never reused, so an entry can only go stale, never point
/// to another communicator. A lookup racing a destroy returns the
/// communicator as a lookup just before the destroy would.
mod recent {
    use std::cell::RefCell;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Weak};

    use super::CComm;

    /// Enough for a thread that drives a few communicators in turn (the
    /// groups of tensor and data parallelism).
    const SLOTS: usize = 4;

    #[derive(Default)]
    struct Recent {
        slots: [Option<(usize, Weak<CComm>)>; SLOTS],
        next: usize,
    }

    thread_local! {
        static RECENT: RefCell<Recent> = RefCell::new(Recent::default());
    }

    /// The communicator remembered for `key`, if it is still good (a
    /// stale entry is dropped).
    pub fn get(key: usize) -> Option<Arc<CComm>> {
        RECENT
            .try_with(|r| {
                let mut r = r.try_borrow_mut().ok()?;
                let slot = r
                    .slots
                    .iter_mut()
                    .find(|s| s.as_ref().is_some_and(|(k, _)| *k == key))?;
                let c = slot.as_ref().and_then(|(_, w)| w.upgrade());
                match c {
                    Some(c) if !c.unlisted.load(Ordering::Acquire) => Some(c),
                    _ => {
                        *slot = None;
                        None
                    }
                }
            })
            .ok()
            .flatten()
    }

    /// Remembers `c` as `key`'s communicator, in place of the oldest entry.
    pub fn put(key: usize, c: &Arc<CComm>) {
        let _ = RECENT.try_with(|r| {
            if let Ok(mut r) = r.try_borrow_mut() {
                let i = r.next;
                r.slots[i] = Some((key, Arc::downgrade(c)));
                r.next = (i + 1) % SLOTS;
            }
        });
    }
}

/// Takes `h` out of the table (destroy, abort); later lookups fail.
pub fn retire(h: NcclCommT) -> CResult<Arc<CComm>> {
    if h.is_null() {
        return Err(CError::arg("comm is NULL"));
    }
    LIVE.write()
        .as_mut()
        .and_then(|l| l.map.remove(&(h as usize)))
        .inspect(|c| c.unlisted.store(true, Ordering::Release))
        .ok_or_else(|| {
            CError::arg(format!(
                "comm {h:p} is not a live communicator of this library (destroyed already, or not made by it)"
            ))
        })
}

/// Gives the live handle `h`, now `old`'s, to `new` (a nonblocking
/// split's child replacing its stand-in). False, and nothing changed,
/// when `h` was destroyed or aborted meanwhile.
pub fn replace(h: usize, old: &Arc<CComm>, new: Arc<CComm>) -> bool {
    let mut live = LIVE.write();
    match live.as_mut().and_then(|l| l.map.get_mut(&h)) {
        Some(slot) if Arc::ptr_eq(slot, old) => {
            old.unlisted.store(true, Ordering::Release);
            *slot = new;
            true
        }
        _ => false,
    }
}

/// Marks a communicator aborted: its clique's waits fail, and it is dropped.
pub fn abort(c: &CComm) {
    c.aborted.store(true, Ordering::Release);
    if let Some(comm) = c.ready() {
        comm.abort();
        comm.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm() -> Arc<CComm> {
        Arc::new(CComm::new(1, 0, true, None))
    }

    #[test]
    fn a_handle_is_never_given_out_twice() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let h = publish(comm()).unwrap();
            assert!(seen.insert(h as usize), "handle {h:p} given out twice");
            assert!(lookup(h).is_ok());
            retire(h).expect("a live handle");
        }
        // Every retired one stays dead, whatever was made since.
        let live = publish(comm()).unwrap();
        for &old in &seen {
            let e = lookup(old as NcclCommT).expect_err("a retired handle");
            assert_eq!(e.code, abi::INVALID_ARGUMENT);
            assert!(retire(old as NcclCommT).is_err());
        }
        assert!(lookup(live).is_ok());
        retire(live).unwrap();
    }

    #[test]
    fn a_remembered_lookup_goes_stale_with_its_handle() {
        let c = comm();
        let h = publish(c.clone()).unwrap();
        // Twice: the second is answered from this thread's memory.
        assert!(Arc::ptr_eq(&lookup(h).unwrap(), &c));
        assert!(Arc::ptr_eq(&lookup(h).unwrap(), &c));
        // Destroyed: refused, though this thread remembered it and the
        // communicator is still alive (held here).
        retire(h).unwrap();
        assert_eq!(lookup(h).unwrap_err().code, abi::INVALID_ARGUMENT);
        assert_eq!(Arc::strong_count(&c), 1, "nothing else keeps it alive");
    }

    #[test]
    fn a_replaced_handle_leads_to_its_new_communicator() {
        let (old, new) = (comm(), comm());
        let h = publish(old.clone()).unwrap();
        assert!(Arc::ptr_eq(&lookup(h).unwrap(), &old));
        assert!(replace(h as usize, &old, new.clone()));
        assert!(Arc::ptr_eq(&lookup(h).unwrap(), &new));
        retire(h).unwrap();
    }

    #[test]
    fn other_threads_see_a_destroy_at_once() {
        // Held here throughout, as a call in flight would hold it.
        let c = comm();
        let h = publish(c.clone()).unwrap() as usize;
        let (looked, retired) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(lookup(h as NcclCommT).is_ok());
                looked.wait();
                retired.wait();
                assert!(lookup(h as NcclCommT).is_err());
            });
            looked.wait();
            retire(h as NcclCommT).unwrap();
            retired.wait();
        });
        drop(c);
    }

    #[test]
    fn more_communicators_than_remembered_all_resolve() {
        let cs: Vec<_> = (0..10).map(|_| comm()).collect();
        let hs: Vec<_> = cs.iter().map(|c| publish(c.clone()).unwrap()).collect();
        for _ in 0..3 {
            for (h, c) in hs.iter().zip(&cs) {
                assert!(Arc::ptr_eq(&lookup(*h).unwrap(), c));
            }
        }
        for h in hs {
            retire(h).unwrap();
        }
    }

    #[test]
    fn background_work_is_seen_without_the_lock() {
        let c = comm();
        assert!(c.callable().is_ok());
        c.begin_background();
        assert_eq!(c.callable().unwrap_err().code, abi::INVALID_USAGE);
        assert_eq!(c.async_result(), abi::IN_PROGRESS);
        c.end_background(Err(&CError::arg("the split failed")));
        assert!(c.callable().is_ok());
        assert_eq!(c.async_result(), abi::INVALID_ARGUMENT);
        assert_eq!(c.async_message().as_deref(), Some("the split failed"));
        // The first failure stays; the count never goes below zero.
        c.end_background(Err(&CError::usage("later")));
        assert_eq!(c.async_result(), abi::INVALID_ARGUMENT);
        c.wait_background();
    }

    #[test]
    fn handles_are_no_addresses() {
        let h = publish(comm()).unwrap() as usize;
        assert_eq!(h & 0xf, 0, "16-byte aligned");
        assert!(h >> 47 != 0, "above every user-space address");
        assert_eq!(h >> 56, 0, "no top-byte tag");
        retire(h as NcclCommT).unwrap();
    }
}
