//! NCCL 2.29's one-sided calls on registered windows. oxccl has no
//! symmetric windows yet, so these check their communicator and return
//! `ncclInvalidUsage` saying so; nothing is written.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::{CudaStream, NcclCommT, NcclDataType, NcclResult};
use crate::error::{guard, CError, CResult};
use crate::handle;

fn unsupported(what: &str) -> CResult<NcclResult> {
    Err(CError::usage(format!(
        "{what} needs symmetric memory windows, which oxccl does not support yet \
         (ncclCommWindowRegister returns ncclInvalidUsage); use ncclSend/ncclRecv"
    )))
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclWinGetUserPtr(
    comm: NcclCommT,
    _win: *mut c_void,
    _out: *mut *mut c_void,
) -> NcclResult {
    guard("ncclWinGetUserPtr", || {
        handle::lookup(comm)?;
        unsupported("ncclWinGetUserPtr")
    })
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclPutSignal(
    _localbuff: *const c_void,
    _count: usize,
    _datatype: NcclDataType,
    _peer: c_int,
    _peer_win: *mut c_void,
    _offset: usize,
    _sig_idx: c_int,
    _ctx: c_int,
    _flags: c_uint,
    comm: NcclCommT,
    _stream: CudaStream,
) -> NcclResult {
    guard("ncclPutSignal", || {
        handle::lookup(comm)?;
        unsupported("ncclPutSignal")
    })
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclSignal(
    _peer: c_int,
    _sig_idx: c_int,
    _ctx: c_int,
    _flags: c_uint,
    comm: NcclCommT,
    _stream: CudaStream,
) -> NcclResult {
    guard("ncclSignal", || {
        handle::lookup(comm)?;
        unsupported("ncclSignal")
    })
}

/// Not supported yet: `ncclInvalidUsage`.
#[no_mangle]
pub extern "C" fn ncclWaitSignal(
    _n_desc: c_int,
    _descs: *mut c_void,
    comm: NcclCommT,
    _stream: CudaStream,
) -> NcclResult {
    guard("ncclWaitSignal", || {
        handle::lookup(comm)?;
        unsupported("ncclWaitSignal")
    })
}
