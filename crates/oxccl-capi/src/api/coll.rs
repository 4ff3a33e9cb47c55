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
        let call = exec::check(&c, raw)?;
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

#[allow(clippy::too_many_arguments)]
fn raw(
    what: What,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    stream: CudaStream,
) -> Raw {
    Raw {
        what,
        send,
        recv,
        count,
        dtype,
        op,
        root,
        stream,
    }
}

/// # Safety
/// Buffers as NCCL documents them: device memory (host memory on the host
/// backend) of the sizes the call implies, valid until the work completes.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::AllReduce);
    guard("ncclAllReduce", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, count, datatype, op, 0, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::Reduce);
    guard("ncclReduce", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, count, datatype, op, root, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::Broadcast);
    guard("ncclBroadcast", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, count, datatype, 0, root, stream),
        )
    })
}

/// In-place Broadcast (the legacy name).
///
/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::Broadcast);
    guard("ncclBcast", || {
        issue(comm, raw(w, buff, buff, count, datatype, 0, root, stream))
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::ReduceScatter);
    guard("ncclReduceScatter", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, recvcount, datatype, op, 0, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: NcclDataType,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::AllGather);
    guard("ncclAllGather", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, sendcount, datatype, 0, 0, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::AllToAll);
    guard("ncclAlltoAll", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, count, datatype, 0, 0, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::Gather);
    guard("ncclGather", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, count, datatype, 0, root, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let w = What::Coll(CollKind::Scatter);
    guard("ncclScatter", || {
        issue(
            comm,
            raw(w, sendbuff, recvbuff, count, datatype, 0, root, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let null = std::ptr::null_mut();
    guard("ncclSend", || {
        issue(
            comm,
            raw(What::Send, sendbuff, null, count, datatype, 0, peer, stream),
        )
    })
}

/// # Safety
/// As for `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclCommT,
    stream: CudaStream,
) -> NcclResult {
    let null = std::ptr::null();
    guard("ncclRecv", || {
        issue(
            comm,
            raw(What::Recv, null, recvbuff, count, datatype, 0, peer, stream),
        )
    })
}
