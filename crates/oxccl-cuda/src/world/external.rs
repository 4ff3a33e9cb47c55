//! Memory the caller allocated (`cuMemAlloc`, stream-ordered pool memory
//! from `cuMemAllocAsync`, VMM memory from `cuMemCreate`): the checks made
//! when a range is registered for zero-copy (direct) plans.
//!
//! A rank's own kernel addresses any of these kinds on its device, so FIFO
//! plans run on unregistered external memory as they are. A direct plan
//! has peers load and store the range: ranks on the same device share the
//! primary context and reach it like the owner; ranks on other devices
//! need the allocation's access granted to their device (peer access for
//! `cuMemAlloc`, `cuMemPoolSetAccess` for a pool, `cuMemSetAccess` for
//! VMM). [`World::check_external`] checks what the driver reports, once
//! per registration, never per call.

use cudarc::driver::sys::{self, CUpointer_attribute as P};

use crate::driver::check;
use crate::error::{CudaError, Result};

use super::World;

/// One pointer attribute of `ptr` as a plain value.
///
/// # Safety
/// `T` must be the attribute's documented C type.
unsafe fn attr<T: Default>(a: P, ptr: u64) -> Result<T> {
    let mut v = T::default();
    // SAFETY: `v` is a valid out-pointer of the attribute's type (caller).
    unsafe {
        check(
            "cuPointerGetAttribute",
            sys::cuPointerGetAttribute((&mut v as *mut T).cast(), a, ptr),
        )?
    };
    Ok(v)
}

/// The device a VMM mapping at `ptr` lives on (its allocation's location).
fn vmm_device(ptr: u64) -> Result<i32> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer; `ptr` is only looked up.
    unsafe {
        check(
            "cuMemRetainAllocationHandle",
            sys::cuMemRetainAllocationHandle(&mut h, ptr as usize as *mut std::ffi::c_void),
        )?
    };
    // SAFETY: all-zero is a valid value of this C struct.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: `h` was retained above and is released once, below.
    let r = unsafe {
        let r = check(
            "cuMemGetAllocationPropertiesFromHandle",
            sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, h),
        );
        let _ = sys::cuMemRelease(h);
        r
    };
    r?;
    if prop.location.type_ != sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CudaError::Invalid(
            "the allocation is not on a device".into(),
        ));
    }
    Ok(prop.location.id)
}

impl World {
    /// Checks that `bytes` bytes at `ptr` are device memory on `rank`'s
    /// device that every rank of the clique may load and store, as a
    /// registered range must be. Nothing is changed. (When ranks are
    /// processes, registration changes nothing: calls share their
    /// allocations with the peers themselves, [`World::share_range`].)
    pub fn check_external(&self, rank: u32, ptr: u64, bytes: usize) -> Result<()> {
        let dev = self.dev(rank)?;
        dev.ctx.bind()?;
        let bad = |why: String| {
            CudaError::Invalid(format!(
                "register {bytes} bytes at {ptr:#x} on rank {rank}: {why}"
            ))
        };
        // SAFETY: DEVICE_ORDINAL is an int.
        let ordinal: i32 = match unsafe { attr(P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) } {
            Ok(o) => o,
            // VMM memory answers through its allocation handle instead.
            Err(e) => vmm_device(ptr)
                .map_err(|v| bad(format!("not device memory the driver knows ({e}; {v})")))?,
        };
        if ordinal != dev.ctx.ordinal {
            return Err(bad(format!(
                "the memory is on device {ordinal}, rank {rank} runs on device {}",
                dev.ctx.ordinal
            )));
        }
        // The allocation's extent, where the driver reports one (it may
        // not for every kind): the range must lie inside it.
        // SAFETY: RANGE_START_ADDR is a CUdeviceptr, RANGE_SIZE a size_t.
        let range = unsafe {
            attr::<u64>(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr)
                .and_then(|s| Ok((s, attr::<usize>(P::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr)?)))
        };
        match range {
            Ok((start, size)) if ptr + bytes as u64 > start + size as u64 => {
                return Err(bad(format!(
                    "the allocation at {start:#x} holds {size} bytes and ends before the range does"
                )));
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(ptr, error = %e, "allocation extent not reported"),
        }
        for other in &self.devices {
            if other.ctx.dev == dev.ctx.dev {
                continue;
            }
            other.ctx.bind()?;
            // SAFETY: ACCESS_FLAGS is a CUmemAccess_flags (a C enum, u32).
            let flags: u32 = match unsafe { attr(P::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, ptr) } {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(ptr, error = %e, "access flags not reported");
                    continue;
                }
            };
            if flags & 3 != 3 {
                return Err(bad(format!(
                    "device {} (a peer's) may not read and write it (access flags {flags}); \
                     grant access with cuMemSetAccess (VMM) or cuMemPoolSetAccess (pool memory)",
                    other.ctx.ordinal
                )));
            }
        }
        Ok(())
    }
}
