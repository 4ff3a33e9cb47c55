//! Memory shared between processes of one host: device memory
//! from `cuMemAlloc` exported as a legacy IPC handle and opened by peer
//! processes, and host memory page-locked in place so copies between it
//! and the device run at full speed.
//!
//! Legacy IPC is chosen over VMM handles here because its handle is 64
//! plain bytes that travel in the bootstrap's all-gather (no file
//! descriptors), and it works for several processes on one GPU as well as
//! for processes on different GPUs (seen on the H200, shared facts G). It
//! only takes base pointers of `cuMemAlloc` memory: `DevMem` is exactly
//! that (never the stream-ordered pool, which IPC refuses).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use crate::driver::{check, Ctx, DevMem};
use crate::error::{CudaError, Result};

/// Bytes of an IPC handle.
pub const HANDLE_BYTES: usize = 64;

/// The IPC handle of `mem` (a whole `cuMemAlloc` allocation), for peer
/// processes to [`Imported::open`].
pub fn export(mem: &DevMem, ctx: &Ctx) -> Result<[u8; HANDLE_BYTES]> {
    // SAFETY: a DevMem is a live cuMemAlloc allocation of `ctx`.
    unsafe { export_base(mem.ptr, ctx) }
}

/// The IPC handle of the `cuMemAlloc` allocation whose base is `base`.
///
/// # Safety
/// `base` must be the first byte of a live `cuMemAlloc` allocation of
/// `ctx` (the driver refuses other memory with an error, but a freed and
/// reused address would export someone else's memory).
pub unsafe fn export_base(base: u64, ctx: &Ctx) -> Result<[u8; HANDLE_BYTES]> {
    ctx.bind()?;
    let mut h = sys::CUipcMemHandle_st {
        reserved: [0; HANDLE_BYTES],
    };
    // SAFETY: `base` is the base of a live cuMemAlloc allocation in the
    // bound context (caller's contract); `h` is a valid out-pointer.
    unsafe { check("cuIpcGetMemHandle", sys::cuIpcGetMemHandle(&mut h, base))? };
    Ok(h.reserved.map(|c| c as u8))
}

/// A peer process's allocation mapped into this process (closed on drop).
#[derive(Debug)]
pub struct Imported {
    pub ptr: u64,
    ctx: Arc<Ctx>,
}

impl Imported {
    /// Maps the allocation behind `handle` (from [`export`] in another
    /// process) into `ctx`. Fails in the exporting process itself.
    pub fn open(ctx: &Arc<Ctx>, handle: &[u8]) -> Result<Imported> {
        let reserved: [u8; HANDLE_BYTES] = handle.try_into().map_err(|_| {
            CudaError::Invalid(format!(
                "an IPC handle has {HANDLE_BYTES} bytes, got {}",
                handle.len()
            ))
        })?;
        ctx.bind()?;
        let h = sys::CUipcMemHandle_st {
            reserved: reserved.map(|b| b as std::ffi::c_char),
        };
        let mut ptr = 0;
        // SAFETY: `h` is a handle's bytes (a wrong one is refused by the
        // driver with an error); `ptr` is a valid out-pointer.
        unsafe {
            check(
                "cuIpcOpenMemHandle",
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                ),
            )?
        };
        Ok(Imported {
            ptr,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Host memory this process already owns (a shared-memory heap, say),
/// page-locked in place for the lifetime of this value.
#[derive(Debug)]
pub struct Pinned {
    ptr: *mut c_void,
    ctx: Arc<Ctx>,
}

// SAFETY: the registration is a handle to memory the caller keeps alive;
// it is only unregistered, once, on drop.
unsafe impl Send for Pinned {}
// SAFETY: as above; nothing is mutated through `&Pinned`.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Page-locks `bytes` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must be mapped memory of this process that stays
    /// mapped until the returned value drops.
    pub unsafe fn register(ctx: &Arc<Ctx>, ptr: *mut u8, bytes: usize) -> Result<Pinned> {
        ctx.bind()?;
        let p = ptr.cast::<c_void>();
        // SAFETY: caller's contract.
        unsafe {
            check(
                "cuMemHostRegister",
                sys::cuMemHostRegister_v2(p, bytes.max(1), sys::CU_MEMHOSTREGISTER_PORTABLE),
            )?
        };
        Ok(Pinned {
            ptr: p,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: registered by `register`, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
        }
    }
}
