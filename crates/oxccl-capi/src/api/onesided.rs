//! NCCL 2.29's one-sided calls on registered windows. Windows are real
//! (`ncclCommWindowRegister`), and `ncclWinGetUserPtr` answers; the
//! one-sided transfers (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`)
//! are not implemented yet: they check their communicator and return
//! `ncclInvalidUsage` saying so, with nothing written.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::{CudaStream, NcclCommT, NcclDataType, NcclResult, SUCCESS};
use crate::error::{guard, CError, CResult};
use crate::handle;
use crate::window;

fn unsupported(what: &str) -> CResult<NcclResult> {
    Err(CError::usage(format!(
        "{what} (one-sided transfers on windows) is not supported by oxccl yet; \
         use ncclSend/ncclRecv"
    )))
}

/// The pointer `win` was registered with (`ncclCommWindowRegister`) on
/// this rank. A handle `comm` did not give, or one deregistered already,
/// is refused with nothing written.
///
/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclWinGetUserPtr(
    comm: NcclCommT,
    win: *mut c_void,
    out: *mut *mut c_void,
) -> NcclResult {
    guard("ncclWinGetUserPtr", || {
        handle::lookup(comm)?;
        let outp = super::out(out, "outUserPtr")?;
        let p = window::user_ptr(comm, win as usize)?;
        // SAFETY: checked by `out`.
        unsafe { outp.write(p as usize as *mut c_void) };
        Ok(SUCCESS)
    })
}

/// Each named call, with NCCL's arguments, checks its communicator (the
/// argument named before the `;`) and returns `ncclInvalidUsage` saying
/// the call is not supported yet; nothing is read or written.
macro_rules! not_supported_yet {
    ($($name:ident($comm:ident; $($arg:ident: $ty:ty),* $(,)?);)*) => {$(
        /// Not supported yet: `ncclInvalidUsage`.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub extern "C" fn $name($($arg: $ty),*) -> NcclResult {
            guard(stringify!($name), || {
                handle::lookup($comm)?;
                unsupported(stringify!($name))
            })
        }
    )*};
}

not_supported_yet! {
    ncclPutSignal(comm;
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
    );
    ncclSignal(comm;
        _peer: c_int, _sig_idx: c_int, _ctx: c_int, _flags: c_uint, comm: NcclCommT, _stream: CudaStream,
    );
    ncclWaitSignal(comm; _n_desc: c_int, _descs: *mut c_void, comm: NcclCommT, _stream: CudaStream);
}
