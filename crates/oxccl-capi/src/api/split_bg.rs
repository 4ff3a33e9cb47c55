//! Nonblocking split and shrink (the child's config has `blocking = 0`,
//! or the parent is nonblocking and no config is given): as NCCL, the
//! call writes the child's handle and returns `ncclInProgress` at once;
//! the child is made on a thread of its own. Until then
//! `ncclCommGetAsyncError` says `ncclInProgress` on the parent and on the
//! child, and calls on either are refused; then it says `ncclSuccess`, or
//! the failure (on the child's handle; on the parent's for a rank that
//! gets no child).
//!
//! The child's size and rank are known only once the ranks have met, so
//! the handle first holds a stand-in of 0 ranks, and the made child
//! takes its place in the handle table; a handle destroyed or aborted
//! meanwhile has its child destroyed or aborted when it is made.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::abi::{self, NcclCommT, NcclResult, IN_PROGRESS};
use crate::config::CommConfig;
use crate::error::{CError, CResult};
use crate::handle::{self, CComm};

/// How a child communicator is made from its parent (a split or a
/// shrink): `None` for a rank that gets no child.
pub(super) type MakeChild = dyn FnOnce() -> CResult<Option<oxccl::Communicator>> + Send;

/// Starts making `c`'s child with `make` in the background and writes its
/// handle (NULL where `expects_child` is false) through `outp`.
pub(super) fn start(
    c: &Arc<CComm>,
    make: Box<MakeChild>,
    cc: &CommConfig,
    outp: *mut NcclCommT,
    expects_child: bool,
) -> CResult<NcclResult> {
    let stand_in = Arc::new(CComm::new(0, 0, false, cc.name.clone()));
    let h = if expects_child {
        handle::publish(stand_in.clone())? as usize
    } else {
        0
    };
    c.begin_background();
    let (parent, child, name) = (c.clone(), stand_in.clone(), cc.name.clone());
    let t = std::thread::Builder::new()
        .name(format!("oxccl-split-r{}", c.rank))
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(make)).unwrap_or_else(|_| {
                Err(CError {
                    code: abi::INTERNAL_ERROR,
                    msg: "split panicked".into(),
                })
            });
            let r = match (r, h) {
                (Ok(Some(x)), h) if h != 0 => {
                    let k = Arc::new(CComm::new(x.nranks(), x.rank(), false, name));
                    k.finish_init(Ok(x));
                    if !handle::replace(h, &child, k.clone()) {
                        settle_orphan(&child, &k);
                    }
                    Ok(())
                }
                (Ok(None), 0) => Ok(()),
                (Ok(_), _) => Err(CError {
                    code: abi::INTERNAL_ERROR,
                    msg: "the split made a child where none was expected, or none where one was"
                        .into(),
                }),
                (Err(e), _) => Err(e),
            };
            match r {
                Err(e) if h != 0 => {
                    child.finish_init(Err(e));
                    parent.end_background(Ok(()));
                }
                r => parent.end_background(r.as_ref().map(|_| ())),
            }
        })
        .map_err(|e| {
            c.end_background(Ok(()));
            if h != 0 {
                let _ = handle::retire(h as NcclCommT);
            }
            CError {
                code: abi::SYSTEM_ERROR,
                msg: format!("could not start the split thread: {e}"),
            }
        })?;
    // Destroying or finalizing the child's handle waits for the thread.
    stand_in.set_init_thread(t);
    // SAFETY: `out` checked the pointer (the caller's `newcomm`).
    unsafe { outp.write(h as NcclCommT) };
    Ok(IN_PROGRESS)
}

/// The child's handle was destroyed or aborted before the child was made:
/// the child goes the same way.
fn settle_orphan(stand_in: &CComm, child: &Arc<CComm>) {
    if stand_in.aborted.load(std::sync::atomic::Ordering::Acquire) {
        handle::abort(child);
    } else if let Some(x) = child.ready() {
        let _ = x.synchronize();
        x.destroy();
    }
}
