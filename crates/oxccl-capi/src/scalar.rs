//! PreMulSum scalars in memory (`ncclScalarDevice`) and where a
//! communicator's buffers live. Apart from the handle table so that it
//! and the call checks (`exec.rs`) both use it without naming each other.

use oxccl::{Communicator, DataType, Element, RawStream};

use crate::error::{CError, CResult};

/// Where a communicator's buffers live: what the pointers the caller
/// passes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Host memory of this process (the host backend, `OXCCL_BACKEND=host`).
    Host,
    /// CUDA device memory; work is ordered on the caller's stream.
    Device,
}

/// A PreMulSum scalar at `addr` (`ncclScalarDevice`) read on the host at
/// call time, for communicators that do not read it themselves (see
/// `Communicator::reads_device_scalars`; every CUDA backend does, as
/// NCCL's kernels do): on the host backend directly; in device memory,
/// after the work issued on the call's `stream` (the scalar is often
/// computed there), which this waits for (a call on a stream being
/// captured into a graph is refused there).
pub fn read(
    comm: &Communicator,
    space: Space,
    addr: usize,
    dt: DataType,
    stream: usize,
) -> CResult<f64> {
    match space {
        // SAFETY: checked non-null and aligned when the op was made; the
        // caller keeps it valid while the op exists (NCCL's contract).
        Space::Host => Ok(unsafe { typed!(dt, read_host(addr)) }),
        Space::Device => {
            let mut word = 0u64;
            // SAFETY: the scalar is one element of `dt` (at most 8 bytes)
            // of device memory the caller keeps alive while the op exists;
            // `stream` is the caller's stream of this call.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut((&mut word as *mut u64).cast::<u8>(), dt.size())
            };
            // SAFETY: as above.
            unsafe { comm.read_raw(RawStream(stream as u64), addr as u64, bytes) }
                .map_err(CError::from)?;
            // SAFETY: `word` is 8-aligned and holds the element's bytes.
            Ok(unsafe { typed!(dt, read_host(&word as *const u64 as usize)) })
        }
    }
}

/// # Safety
/// `addr` must hold a readable, aligned `T`.
pub unsafe fn read_host<T: Element>(addr: usize) -> f64 {
    // SAFETY: forwarded.
    unsafe { std::ptr::read(addr as *const T) }.to_f64()
}
