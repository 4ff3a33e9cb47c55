//! NCCL 2.30's C types and values, as this library reads them: every enum
//! is a plain `c_int` (a caller may pass any integer, and PreMulSum ops are
//! values past the named ones), so nothing foreign is transmuted into a
//! Rust enum.

use std::ffi::c_int;

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;
/// `cudaStream_t` (`CUstream`): never dereferenced here.
pub type CudaStream = *mut std::ffi::c_void;

pub const SUCCESS: NcclResult = 0;
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const SYSTEM_ERROR: NcclResult = 2;
pub const INTERNAL_ERROR: NcclResult = 3;
pub const INVALID_ARGUMENT: NcclResult = 4;
pub const INVALID_USAGE: NcclResult = 5;
pub const REMOTE_ERROR: NcclResult = 6;
pub const IN_PROGRESS: NcclResult = 7;
/// `ncclTimeout` (2.30).
pub const TIMEOUT: NcclResult = 8;

/// The release whose interface this is: 2.30.7, `NCCL_VERSION_CODE`.
pub const VERSION_CODE: c_int = 2 * 10000 + 30 * 100 + 7;

/// Ops 0..=4 are built in; PreMulSum handles start here.
pub const NUM_OPS: c_int = 5;
/// `ncclScalarDevice` and `ncclScalarHostImmediate`.
pub const SCALAR_DEVICE: c_int = 0;
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_ABORT`.
pub const SHRINK_ABORT: c_int = 1;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclSimInfo {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub estimated_time: f32,
}

/// The opaque struct behind `ncclComm_t`. Never dereferenced: a handle's
/// address is a key into this library's table of live communicators.
#[repr(C)]
#[derive(Debug)]
pub struct NcclComm {
    _opaque: [u8; 0],
}
pub type NcclCommT = *mut NcclComm;

/// NCCL's name for a result code (`ncclGetErrorString`).
pub fn result_name(r: NcclResult) -> &'static std::ffi::CStr {
    match r {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        INTERNAL_ERROR => c"internal error - please report this issue to the oxccl developers",
        INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        IN_PROGRESS => c"NCCL operation in progress",
        TIMEOUT => c"operation timed out",
        _ => c"unknown result code",
    }
}
