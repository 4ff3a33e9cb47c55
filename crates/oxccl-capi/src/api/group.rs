//! `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`.

use crate::abi::{NcclResult, NcclSimInfo, SUCCESS};
use crate::error::{guard, CError, CResult};
use crate::exec::What;
use crate::group;

use super::out;

/// Opens a group (they nest).
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    guard("ncclGroupStart", || {
        oxccl::observe::mark(oxccl::observe::Func::GroupStart, Default::default);
        group::with(|g| g.depth += 1);
        Ok(SUCCESS)
    })
}

/// Closes a group; the outermost end waits for inits started in the group
/// and runs its operations together (Send/Recv pairs, several
/// communicators from one thread). An error of any call in the group is
/// returned here and nothing of the group runs. When a communicator of
/// the group is nonblocking, the end returns `ncclInProgress` and all of
/// it happens in the background ([`super::group_end`]).
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard("ncclGroupEnd", || {
        let _nvtx = oxccl::observe::range(oxccl::observe::Func::GroupEnd, Default::default);
        let Some(st) = close()? else {
            return Ok(SUCCESS);
        };
        if st.error.is_none() && super::group_end::nonblocking(&st) {
            return super::group_end::start(st);
        }
        super::group_end::finish(st)?;
        Ok(SUCCESS)
    })
}

/// Leaves one level; the group's contents when that was the outermost.
fn close() -> CResult<Option<group::State>> {
    let depth = group::with(|g| {
        g.depth = g.depth.checked_sub(1)?;
        Some(g.depth)
    });
    match depth {
        None => Err(CError::usage("ncclGroupEnd without ncclGroupStart")),
        Some(0) => Ok(Some(group::take())),
        Some(_) => Ok(None),
    }
}

/// Closes a group without running it and reports the selector's predicted
/// time of its collectives in `simInfo->estimatedTime` (microseconds;
/// Send/Recv are not modelled and count 0).
///
/// # Safety
/// `sim_info` must be null or an `ncclSimInfo_t` made with
/// `NCCL_SIM_INFO_INITIALIZER`.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(sim_info: *mut NcclSimInfo) -> NcclResult {
    guard("ncclGroupSimulateEnd", || {
        let p = out(sim_info, "simInfo")?;
        let Some(mut st) = close()? else {
            return Ok(SUCCESS);
        };
        for c in &st.inits {
            c.join_init();
        }
        super::init::finish_splits(std::mem::take(&mut st.splits))?;
        if let Some(e) = st.error {
            return Err(e);
        }
        let mut us = 0.0f64;
        for op in &st.ops {
            if let (What::Coll(k), Some(comm)) = (op.call.what, op.comm.ready()) {
                let ch = comm.choice_for(k, op.call.count, op.call.dtype)?;
                us += ch.predicted_us.unwrap_or(0.0);
            }
        }
        // SAFETY: checked non-null and aligned; the struct's first field
        // is its size, and the time is written only when it fits.
        unsafe {
            if (*p).size >= std::mem::size_of::<NcclSimInfo>() {
                (*p).estimated_time = us as f32;
            }
        }
        Ok(SUCCESS)
    })
}
