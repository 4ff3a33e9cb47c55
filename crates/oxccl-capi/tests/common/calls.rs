//! The C entry points the Rust-side tests call directly (linked against
//! this crate's library, as a C program would be).

use std::ffi::{c_int, c_void};

use oxccl_capi::abi::{CudaStream, NcclCommT, NcclResult};

extern "C" {
    pub fn ncclCommInitAll(comms: *mut NcclCommT, ndev: c_int, devlist: *const c_int)
        -> NcclResult;
    pub fn ncclCommDestroy(comm: NcclCommT) -> NcclResult;
    pub fn ncclGroupStart() -> NcclResult;
    pub fn ncclGroupEnd() -> NcclResult;
    pub fn ncclAllReduce(
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: c_int,
        op: c_int,
        comm: NcclCommT,
        stream: CudaStream,
    ) -> NcclResult;
}
