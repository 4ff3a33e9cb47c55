//! The collectives and Send/Recv. Each call is checked at once (a bad
//! argument returns `ncclInvalidArgument` and nothing is written); inside
//! a group it waits for the group's end, else it runs now: on CUDA it is
//! enqueued on the caller's stream and returns, on the host backend it
//! completes before returning.

use std::ffi::{c_int, c_void};

use oxccl::CollKind;

use crate::abi::{CudaStream, NcclCommT, NcclDataType, NcclRedOp, NcclResult, SUCCESS};
use crate::error::{guard, CResult};
use crate::exec::{self, Pending, Raw, What};
use crate::{group, handle};

/// Checks and runs (or queues) one call.
fn issue(comm: NcclCommT, raw: Raw) -> CResult<NcclResult> {
    let in_group = group::active();
    let r = (|| {
        let c = handle::lookup(comm)?;
        let call = exec::check(&c, raw).inspect_err(|e| {
            // A call refused for its arguments is posted to the peers,
            // whose matching calls then fail at once naming this rank
            // instead of waiting for it: now outside a group, at the
            // group's end inside one.
            if e.code != crate::abi::INVALID_ARGUMENT {
                return;
            }
            if in_group {
                group::with(|g| g.refused.push(c.clone()));
            } else if let Some(x) = c.ready() {
                x.refused_call();
            }
        })?;
        // Inside a group this range is the call's enqueue, as NCCL's.
        let _nvtx = oxccl::observe::range(exec::func(call.what), || exec::args(&c, &call));
        if in_group {
            group::with(|g| g.ops.push(Pending::new(c, call)));
            Ok(())
        } else {
            exec::run(&c, &call)
        }
    })();
    match r {
        Ok(()) => Ok(SUCCESS),
        Err(e) => {
            // As NCCL: an error inside a group fails the group's end too.
            if in_group {
                group::with(|g| {
                    g.error.get_or_insert_with(|| e.clone());
                });
            }
            Err(e)
        }
    }
}

/// Writes exported NCCL calls: each takes its C parameters in NCCL's
/// order (then `comm` and `stream`, last in every one), becomes one [`Raw`]
/// and goes through [`issue`] inside [`guard`]. The fields name which
/// parameter is which argument; a constant stands where the C call has no
/// such parameter.
macro_rules! nccl_calls {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($p:ident: $t:ty),*) => { $($field:ident: $value:expr),* $(,)? }
    )*) => {$(
        $(#[$doc])*
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($p: $t,)* comm: NcclCommT, stream: CudaStream) -> NcclResult {
            guard(stringify!($name), || issue(comm, Raw { $($field: $value,)* stream }))
        }
    )*};
}

const fn coll(k: CollKind) -> What {
    What::Coll(k)
}

nccl_calls! {
    /// # Safety
    /// Buffers as NCCL documents them: device memory (host memory on the
    /// host backend) of the sizes the call implies, valid until the work
    /// completes.
    fn ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
                     datatype: NcclDataType, op: NcclRedOp) => {
        what: coll(CollKind::AllReduce), send: sendbuff, recv: recvbuff, count: count,
        dtype: datatype, op: op, root: 0,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
                  datatype: NcclDataType, op: NcclRedOp, root: c_int) => {
        what: coll(CollKind::Reduce), send: sendbuff, recv: recvbuff, count: count, dtype: datatype,
        op: op, root: root,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
                     datatype: NcclDataType, root: c_int) => {
        what: coll(CollKind::Broadcast), send: sendbuff, recv: recvbuff, count: count,
        dtype: datatype, op: 0, root: root,
    }

    /// In-place Broadcast (the legacy name).
    ///
    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclBcast(buff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int) => {
        what: coll(CollKind::Broadcast), send: buff, recv: buff, count: count, dtype: datatype,
        op: 0, root: root,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize,
                         datatype: NcclDataType, op: NcclRedOp) => {
        what: coll(CollKind::ReduceScatter), send: sendbuff, recv: recvbuff, count: recvcount,
        dtype: datatype, op: op, root: 0,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize,
                     datatype: NcclDataType) => {
        what: coll(CollKind::AllGather), send: sendbuff, recv: recvbuff, count: sendcount,
        dtype: datatype, op: 0, root: 0,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
                    datatype: NcclDataType) => {
        what: coll(CollKind::AllToAll), send: sendbuff, recv: recvbuff, count: count,
        dtype: datatype, op: 0, root: 0,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
                  datatype: NcclDataType, root: c_int) => {
        what: coll(CollKind::Gather), send: sendbuff, recv: recvbuff, count: count, dtype: datatype,
        op: 0, root: root,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
                   datatype: NcclDataType, root: c_int) => {
        what: coll(CollKind::Scatter), send: sendbuff, recv: recvbuff, count: count,
        dtype: datatype, op: 0, root: root,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclSend(sendbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int) => {
        what: What::Send, send: sendbuff, recv: std::ptr::null_mut(), count: count, dtype: datatype,
        op: 0, root: peer,
    }

    /// # Safety
    /// As for `ncclAllReduce`.
    fn ncclRecv(recvbuff: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int) => {
        what: What::Recv, send: std::ptr::null(), recv: recvbuff, count: count, dtype: datatype,
        op: 0, root: peer,
    }
}
