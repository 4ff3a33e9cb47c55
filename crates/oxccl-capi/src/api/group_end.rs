//! The outermost `ncclGroupEnd`'s work ([`finish`]), now or in the
//! background. A nonblocking group end: when a communicator of the group is
//! nonblocking (`config.blocking = 0`), `ncclGroupEnd` returns
//! `ncclInProgress` at once, as NCCL does, and a thread of its own waits
//! for the group's inits and splits and runs its operations. Until it is
//! done, `ncclCommGetAsyncError` says `ncclInProgress` on every
//! communicator with an operation in the group and calls on them are
//! refused; then it says `ncclSuccess` or the group's failure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::abi::{self, NcclResult, IN_PROGRESS};
use crate::error::{CError, CResult};
use crate::exec;
use crate::group;
use crate::handle::CComm;

/// What the outermost end does: waits for the group's inits and splits,
/// then runs its operations.
pub(super) fn finish(mut st: group::State) -> CResult<()> {
    for c in &st.inits {
        c.join_init();
    }
    let split = super::init::finish_splits(std::mem::take(&mut st.splits));
    if let Some(e) = st.error.take() {
        st.post_refusal();
        return Err(e);
    }
    split?;
    for c in &st.inits {
        c.get()?;
    }
    exec::run_group(&st.ops)
}

/// Whether the group's end is nonblocking: one of its communicators (an
/// operation's, or one initialised in it) is.
pub(super) fn nonblocking(st: &group::State) -> bool {
    st.ops.iter().any(|p| !p.comm.blocking) || st.inits.iter().any(|c| !c.blocking)
}

/// Starts the group's end in the background.
pub(super) fn start(st: group::State) -> CResult<NcclResult> {
    let mut comms: Vec<Arc<CComm>> = Vec::new();
    for p in &st.ops {
        if !comms.iter().any(|c| Arc::ptr_eq(c, &p.comm)) {
            comms.push(p.comm.clone());
        }
    }
    for c in &comms {
        c.begin_background();
    }
    let marked = comms.clone();
    std::thread::Builder::new()
        .name("oxccl-group-end".into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| finish(st))).unwrap_or_else(|_| {
                Err(CError {
                    code: abi::INTERNAL_ERROR,
                    msg: "the group's end panicked".into(),
                })
            });
            for c in &comms {
                c.end_background(r.as_ref().map(|_| ()));
            }
        })
        .map_err(|e| {
            for c in &marked {
                c.end_background(Ok(()));
            }
            CError {
                code: abi::SYSTEM_ERROR,
                msg: format!("could not start the group's end thread: {e}"),
            }
        })?;
    Ok(IN_PROGRESS)
}
