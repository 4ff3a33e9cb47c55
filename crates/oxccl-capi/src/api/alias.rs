//! NCCL's profiling twins: every `ncclX` is also exported as `pncclX`, as
//! NCCL's library does, so a profiler that interposes the `nccl` names (or
//! a program that calls the `pnccl` names directly) finds them. Each twin
//! calls the function of the same name without the `p`, nothing else.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::{
    CudaStream, NcclCommT, NcclDataType, NcclRedOp, NcclResult, NcclSimInfo, NcclUniqueId,
};

use super::{coll, group, grow, init, mem, onesided, param, query, revoke, stats};

macro_rules! twins {
    ($($alias:ident => $m:ident :: $target:ident ( $($p:ident : $t:ty),* ) -> $r:ty;)*) => {$(
        #[doc = concat!("`", stringify!($target), "` under NCCL's profiling name.")]
        ///
        /// # Safety
        /// As for the function it calls.
        #[no_mangle]
        #[allow(clippy::too_many_arguments, unused_unsafe)]
        pub unsafe extern "C" fn $alias($($p: $t),*) -> $r {
            // SAFETY: the caller's contract is the target's, passed on unchanged.
            unsafe { $m::$target($($p),*) }
        }
    )*};
}

twins! {
    pncclGetVersion => query::ncclGetVersion(version: *mut c_int) -> NcclResult;
    pncclGetErrorString => query::ncclGetErrorString(result: NcclResult) -> *const c_char;
    pncclGetLastError => query::ncclGetLastError(comm: NcclCommT) -> *const c_char;
    pncclResetDebugInit => query::ncclResetDebugInit() -> ();
    pncclCommGetAsyncError => query::ncclCommGetAsyncError(comm: NcclCommT, e: *mut NcclResult) -> NcclResult;
    pncclCommCount => query::ncclCommCount(comm: NcclCommT, count: *mut c_int) -> NcclResult;
    pncclCommUserRank => query::ncclCommUserRank(comm: NcclCommT, rank: *mut c_int) -> NcclResult;
    pncclCommCuDevice => query::ncclCommCuDevice(comm: NcclCommT, device: *mut c_int) -> NcclResult;

    pncclGetUniqueId => init::ncclGetUniqueId(id: *mut NcclUniqueId) -> NcclResult;
    pncclCommInitRankConfig => init::ncclCommInitRankConfig(comm: *mut NcclCommT, nranks: c_int, id: NcclUniqueId, rank: c_int, config: *mut c_void) -> NcclResult;
    pncclCommInitRank => init::ncclCommInitRank(comm: *mut NcclCommT, nranks: c_int, id: NcclUniqueId, rank: c_int) -> NcclResult;
    pncclCommInitRankScalable => init::ncclCommInitRankScalable(comm: *mut NcclCommT, nranks: c_int, rank: c_int, n_id: c_int, ids: *mut NcclUniqueId, config: *mut c_void) -> NcclResult;
    pncclCommInitAll => init::ncclCommInitAll(comms: *mut NcclCommT, ndev: c_int, devlist: *const c_int) -> NcclResult;
    pncclCommFinalize => init::ncclCommFinalize(comm: NcclCommT) -> NcclResult;
    pncclCommDestroy => init::ncclCommDestroy(comm: NcclCommT) -> NcclResult;
    pncclCommAbort => init::ncclCommAbort(comm: NcclCommT) -> NcclResult;
    pncclCommSplit => init::ncclCommSplit(comm: NcclCommT, color: c_int, key: c_int, newcomm: *mut NcclCommT, config: *mut c_void) -> NcclResult;
    pncclCommShrink => init::ncclCommShrink(comm: NcclCommT, exclude: *mut c_int, count: c_int, newcomm: *mut NcclCommT, config: *mut c_void, flags: c_int) -> NcclResult;
    pncclCommSuspend => stats::ncclCommSuspend(comm: NcclCommT, flags: c_int) -> NcclResult;
    pncclCommResume => stats::ncclCommResume(comm: NcclCommT) -> NcclResult;
    pncclCommMemStats => stats::ncclCommMemStats(comm: NcclCommT, stat: c_int, value: *mut u64) -> NcclResult;
    pncclCommRevoke => revoke::ncclCommRevoke(comm: NcclCommT, flags: c_int) -> NcclResult;
    pncclCommGetUniqueId => grow::ncclCommGetUniqueId(comm: NcclCommT, id: *mut NcclUniqueId) -> NcclResult;
    pncclCommGrow => grow::ncclCommGrow(comm: NcclCommT, nranks: c_int, id: *const NcclUniqueId, rank: c_int, newcomm: *mut NcclCommT, config: *mut c_void) -> NcclResult;

    pncclMemAlloc => mem::ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult;
    pncclMemFree => mem::ncclMemFree(ptr: *mut c_void) -> NcclResult;
    pncclCommRegister => mem::ncclCommRegister(comm: NcclCommT, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> NcclResult;
    pncclCommDeregister => mem::ncclCommDeregister(comm: NcclCommT, handle: *mut c_void) -> NcclResult;
    pncclCommWindowRegister => mem::ncclCommWindowRegister(comm: NcclCommT, buff: *mut c_void, size: usize, win: *mut *mut c_void, flags: c_int) -> NcclResult;
    pncclCommWindowDeregister => mem::ncclCommWindowDeregister(comm: NcclCommT, win: *mut c_void) -> NcclResult;
    pncclDevCommCreate => mem::ncclDevCommCreate(comm: NcclCommT, reqs: *const c_void, out: *mut c_void) -> NcclResult;
    pncclDevCommDestroy => mem::ncclDevCommDestroy(comm: NcclCommT, dev: *const c_void) -> NcclResult;
    pncclRedOpCreatePreMulSum => mem::ncclRedOpCreatePreMulSum(op: *mut NcclRedOp, scalar: *mut c_void, datatype: NcclDataType, residence: c_int, comm: NcclCommT) -> NcclResult;
    pncclRedOpDestroy => mem::ncclRedOpDestroy(op: NcclRedOp, comm: NcclCommT) -> NcclResult;

    pncclWinGetUserPtr => onesided::ncclWinGetUserPtr(comm: NcclCommT, win: *mut c_void, out: *mut *mut c_void) -> NcclResult;
    pncclPutSignal => onesided::ncclPutSignal(localbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, peer_win: *mut c_void, offset: usize, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclSignal => onesided::ncclSignal(peer: c_int, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclWaitSignal => onesided::ncclWaitSignal(n_desc: c_int, descs: *mut c_void, comm: NcclCommT, stream: CudaStream) -> NcclResult;

    pncclAllReduce => coll::ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclReduce => coll::ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, root: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclBroadcast => coll::ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclBcast => coll::ncclBcast(buff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclReduceScatter => coll::ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: NcclDataType, op: NcclRedOp, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclAllGather => coll::ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: NcclDataType, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclAlltoAll => coll::ncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclGather => coll::ncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclScatter => coll::ncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclSend => coll::ncclSend(sendbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;
    pncclRecv => coll::ncclRecv(recvbuff: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: NcclCommT, stream: CudaStream) -> NcclResult;

    pncclGroupStart => group::ncclGroupStart() -> NcclResult;
    pncclGroupEnd => group::ncclGroupEnd() -> NcclResult;
    pncclGroupSimulateEnd => group::ncclGroupSimulateEnd(sim_info: *mut NcclSimInfo) -> NcclResult;

    pncclParamBind => param::ncclParamBind(out: *mut *const c_void, key: *const c_char) -> NcclResult;
    pncclParamGetI8 => param::ncclParamGetI8(h: *const c_void, out: *mut i8) -> NcclResult;
    pncclParamGetI16 => param::ncclParamGetI16(h: *const c_void, out: *mut i16) -> NcclResult;
    pncclParamGetI32 => param::ncclParamGetI32(h: *const c_void, out: *mut i32) -> NcclResult;
    pncclParamGetI64 => param::ncclParamGetI64(h: *const c_void, out: *mut i64) -> NcclResult;
    pncclParamGetU8 => param::ncclParamGetU8(h: *const c_void, out: *mut u8) -> NcclResult;
    pncclParamGetU16 => param::ncclParamGetU16(h: *const c_void, out: *mut u16) -> NcclResult;
    pncclParamGetU32 => param::ncclParamGetU32(h: *const c_void, out: *mut u32) -> NcclResult;
    pncclParamGetU64 => param::ncclParamGetU64(h: *const c_void, out: *mut u64) -> NcclResult;
    pncclParamGetStr => param::ncclParamGetStr(h: *const c_void, out: *mut *const c_char) -> NcclResult;
    pncclParamGet => param::ncclParamGet(h: *const c_void, out: *mut c_void, max_len: c_int, len: *mut c_int) -> NcclResult;
    pncclParamGetParameter => param::ncclParamGetParameter(key: *const c_char, value: *mut *const c_char, len: *mut c_int) -> NcclResult;
    pncclParamGetAllParameterKeys => param::ncclParamGetAllParameterKeys(table: *mut *const *const c_char, len: *mut c_int) -> NcclResult;
    pncclParamDumpAll => param::ncclParamDumpAll() -> ();
}
