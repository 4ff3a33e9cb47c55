//! Device memory from the virtual memory management API, as NCCL's
//! `ncclMemAlloc` makes it: physical memory (`cuMemCreate`, exportable as
//! a POSIX file descriptor where the device supports it) mapped at a
//! reserved address range (`cuMemAddressReserve` + `cuMemMap`), readable
//! and writable by the owning device and by every device with peer access
//! to it (`cuMemSetAccess`). The size is rounded up to the allocation
//! granularity the driver recommends.
//!
//! Such memory is what symmetric windows are made of: a peer on another
//! device reaches it without `cuCtxEnablePeerAccess` (access is granted
//! per mapping), and another process may import the allocation from its
//! file descriptor. A device without VMM support gets `cuMemAlloc`
//! memory instead ([`SymMem::vmm`] says which), as NCCL falls back to
//! `cudaMalloc`. [`export_fd`] and [`Import`] carry such an allocation to
//! a peer process (windows of ranks that are processes).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute as A, CUresult};

use crate::driver::{check, guarded, init, Ctx};
use crate::error::{CudaError, Result};

/// This process's live exportable VMM allocations of
/// [`alloc_in_current_context`]: (start, size, handle). Only these are
/// exported to peer processes ([`export_fd`]): their mapping starts at
/// offset 0 of one physical allocation of exactly that size, which is
/// what an importer maps.
static EXPORTABLE: Mutex<Vec<Live>> = Mutex::new(Vec::new());

/// (start, size, handle) of one exportable allocation.
type Live = (u64, usize, sys::CUmemGenericAllocationHandle);

fn exportable() -> std::sync::MutexGuard<'static, Vec<Live>> {
    EXPORTABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// One allocation of [`alloc_in_current_context`]; give it back with
/// [`SymMem::free`] (dropping it leaks the memory: a free must wait for
/// the device, which a destructor should not do unasked).
#[derive(Debug)]
pub struct SymMem {
    /// Start of the mapping.
    pub ptr: u64,
    /// Bytes mapped (the request rounded up to the granularity).
    pub size: usize,
    /// The physical allocation (VMM), or `None` for `cuMemAlloc` memory.
    handle: Option<sys::CUmemGenericAllocationHandle>,
    /// The context that was current at allocation (the runtime's primary
    /// context of the device), made current again to free.
    ctx: sys::CUcontext,
    /// Whether the allocation was made exportable as a file descriptor.
    pub exportable: bool,
}

// SAFETY: the handles are plain driver identifiers, usable from any thread
// with the context made current (`free` does that).
unsafe impl Send for SymMem {}
// SAFETY: as above; nothing is mutated through `&SymMem`.
unsafe impl Sync for SymMem {}

impl SymMem {
    /// Whether this is VMM memory (`false`: `cuMemAlloc` memory, the
    /// device has no virtual memory management).
    pub fn vmm(&self) -> bool {
        self.handle.is_some()
    }

    /// Unmaps and releases the memory, after every piece of work in its
    /// context has finished (`cuCtxSynchronize`, as `cuMemFree` waits for
    /// the device).
    ///
    /// # Safety
    /// Nothing may touch the range once this returns (no work pending on
    /// another context, no later use of the pointer).
    pub unsafe fn free(self) -> Result<()> {
        exportable().retain(|&(p, _, _)| p != self.ptr);
        guarded("ncclMemFree", || {
            // SAFETY: the context was current when the memory was made and
            // is the owner's (the runtime keeps its primary context alive
            // while memory of it lives); pushed and popped here.
            unsafe { check("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(self.ctx))? };
            // SAFETY: a current context; the range and handle are this
            // allocation's, each released once (self is consumed).
            let r = unsafe {
                check("cuCtxSynchronize", sys::cuCtxSynchronize()).and_then(|()| {
                    match self.handle {
                        Some(h) => {
                            check("cuMemUnmap", sys::cuMemUnmap(self.ptr, self.size))?;
                            check("cuMemRelease", sys::cuMemRelease(h))?;
                            check(
                                "cuMemAddressFree",
                                sys::cuMemAddressFree(self.ptr, self.size),
                            )
                        }
                        None => check("cuMemFree", sys::cuMemFree_v2(self.ptr)),
                    }
                })
            };
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops the context pushed above.
            let p = unsafe { check("cuCtxPopCurrent", sys::cuCtxPopCurrent_v2(&mut popped)) };
            r.and(p)
        })
    }
}

fn attribute(dev: sys::CUdevice, a: A) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer; `dev` is a device of the driver.
    unsafe {
        check(
            "cuDeviceGetAttribute",
            sys::cuDeviceGetAttribute(&mut v, a, dev),
        )?
    };
    Ok(v)
}

/// `bytes` (at least 1) of memory of the calling thread's current
/// context's device: VMM memory where the device supports it, else
/// `cuMemAlloc` memory. An error when no context is current.
pub fn alloc_in_current_context(bytes: usize) -> Result<SymMem> {
    init()?;
    guarded("ncclMemAlloc", || {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { check("cuCtxGetCurrent", sys::cuCtxGetCurrent(&mut ctx))? };
        if ctx.is_null() {
            return Err(CudaError::Invalid(
                "no CUDA context is current on this thread: make the device current first \
                 (cudaSetDevice, or any runtime call on it)"
                    .into(),
            ));
        }
        let mut dev = 0;
        // SAFETY: valid out-pointer; a context is current.
        unsafe { check("cuCtxGetDevice", sys::cuCtxGetDevice(&mut dev))? };
        if attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        )? == 0
        {
            tracing::debug!(
                dev,
                "oxccl: no VMM on this device; ncclMemAlloc uses cuMemAlloc"
            );
            let mut p = 0;
            // SAFETY: valid out-pointer; a current context.
            unsafe { check("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, bytes.max(1)))? };
            return Ok(SymMem {
                ptr: p,
                size: bytes.max(1),
                handle: None,
                ctx,
                exportable: false,
            });
        }
        let fd = attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        )? != 0;
        vmm(ctx, dev, bytes, fd)
    })
}

/// The VMM path of [`alloc_in_current_context`]; every step undone on
/// failure.
fn vmm(ctx: sys::CUcontext, dev: sys::CUdevice, bytes: usize, fd: bool) -> Result<SymMem> {
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    if fd {
        prop.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    }
    let mut gran = 0usize;
    // SAFETY: valid out-pointer and properties.
    unsafe {
        check(
            "cuMemGetAllocationGranularity",
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            ),
        )?
    };
    let gran = gran.max(1);
    let size = bytes
        .max(1)
        .checked_next_multiple_of(gran)
        .ok_or_else(|| CudaError::Invalid(format!("{bytes} bytes overflow the address space")))?;
    let mut handle = 0;
    // SAFETY: valid out-pointer and properties.
    let mut made = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) };
    let mut exportable = fd;
    if fd
        && matches!(
            made,
            CUresult::CUDA_ERROR_NOT_SUPPORTED | CUresult::CUDA_ERROR_NOT_PERMITTED
        )
    {
        // Exportable memory refused (a container without the handle
        // type): memory for this process alone is still VMM memory.
        tracing::debug!(
            dev,
            ?made,
            "oxccl: exportable VMM memory refused; not exportable"
        );
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType(0);
        exportable = false;
        // SAFETY: as above.
        made = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) };
    }
    check("cuMemCreate", made)?;
    let release = |e: CudaError| {
        // SAFETY: the handle made above, released once on this path.
        let _ = unsafe { sys::cuMemRelease(handle) };
        e
    };
    let mut va = 0;
    // SAFETY: valid out-pointer; no fixed address asked for.
    unsafe {
        check(
            "cuMemAddressReserve",
            sys::cuMemAddressReserve(&mut va, size, gran, 0, 0),
        )
    }
    .map_err(release)?;
    let unreserve = |e: CudaError| {
        // SAFETY: the range reserved above, freed once on this path.
        let _ = unsafe { sys::cuMemAddressFree(va, size) };
        release(e)
    };
    // SAFETY: `va..va+size` is reserved and unmapped; `handle` holds `size`.
    unsafe { check("cuMemMap", sys::cuMemMap(va, size, 0, handle, 0)) }.map_err(unreserve)?;
    let unmap = |e: CudaError| {
        // SAFETY: the mapping made above, undone once on this path.
        let _ = unsafe { sys::cuMemUnmap(va, size) };
        unreserve(e)
    };
    let access = access_list(dev).map_err(unmap)?;
    // SAFETY: a mapped range; `access` holds `access.len()` descriptors.
    unsafe {
        check(
            "cuMemSetAccess",
            sys::cuMemSetAccess(va, size, access.as_ptr(), access.len()),
        )
    }
    .map_err(unmap)?;
    tracing::debug!(
        dev,
        va,
        size,
        gran,
        exportable,
        peers = access.len() - 1,
        "oxccl: VMM allocation"
    );
    if exportable {
        self::exportable().push((va, size, handle));
    }
    Ok(SymMem {
        ptr: va,
        size,
        handle: Some(handle),
        ctx,
        exportable,
    })
}

/// The exportable allocation of [`alloc_in_current_context`] holding
/// `bytes` bytes at `ptr`, as a POSIX file descriptor another process can
/// import ([`Import::open`]), with the allocation's start and size here.
/// `None` when no such allocation holds the range (other memory, or an
/// allocation made without the file-descriptor handle type).
pub fn export_fd(ptr: u64, bytes: usize) -> Result<Option<(OwnedFd, u64, usize)>> {
    let end = ptr.saturating_add(bytes as u64);
    // Held while exporting, so the allocation cannot be freed meanwhile.
    let live = exportable();
    let Some(&(base, size, handle)) = live
        .iter()
        .find(|&&(b, s, _)| ptr >= b && end <= b + s as u64)
    else {
        return Ok(None);
    };
    guarded("cuMemExportToShareableHandle", || {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: a live allocation made with the POSIX file descriptor
        // handle type (listed above); the driver writes an int.
        unsafe {
            check(
                "cuMemExportToShareableHandle",
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut std::ffi::c_int).cast(),
                    handle,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                ),
            )?
        };
        if fd < 0 {
            return Err(CudaError::Invalid(format!(
                "cuMemExportToShareableHandle gave descriptor {fd}"
            )));
        }
        // SAFETY: a descriptor the driver just opened for this process,
        // owned by nobody else.
        Ok(Some((unsafe { OwnedFd::from_raw_fd(fd) }, base, size)))
    })
}

/// A peer process's exported allocation mapped into this process, read
/// and writable by the context's device (unmapped on drop).
#[derive(Debug)]
pub struct Import {
    pub ptr: u64,
    size: usize,
    ctx: Arc<Ctx>,
}

impl Import {
    /// Imports the allocation of `size` bytes behind `fd` (from
    /// [`export_fd`] in another process) and maps it whole into `ctx`.
    pub fn open(ctx: &Arc<Ctx>, fd: &OwnedFd, size: usize) -> Result<Import> {
        ctx.bind()?;
        guarded("cuMemImportFromShareableHandle", || {
            let mut h = 0;
            // SAFETY: the driver reads the descriptor (passed as its value,
            // as the API asks) and does not take it over; `h` is a valid
            // out-pointer.
            unsafe {
                check(
                    "cuMemImportFromShareableHandle",
                    sys::cuMemImportFromShareableHandle(
                        &mut h,
                        fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    ),
                )?
            };
            let release = |e: CudaError| {
                // SAFETY: the imported handle, released once on this path.
                let _ = unsafe { sys::cuMemRelease(h) };
                e
            };
            let mut va = 0;
            // SAFETY: valid out-pointer; no fixed address asked for.
            unsafe {
                check(
                    "cuMemAddressReserve",
                    sys::cuMemAddressReserve(&mut va, size, 0, 0, 0),
                )
            }
            .map_err(release)?;
            let unreserve = |e: CudaError| {
                // SAFETY: the range reserved above, freed once on this path.
                let _ = unsafe { sys::cuMemAddressFree(va, size) };
                release(e)
            };
            // SAFETY: a reserved, unmapped range of the allocation's size.
            unsafe { check("cuMemMap", sys::cuMemMap(va, size, 0, h, 0)) }.map_err(unreserve)?;
            let access = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: ctx.dev,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the mapping made above; one descriptor.
            let granted =
                unsafe { check("cuMemSetAccess", sys::cuMemSetAccess(va, size, &access, 1)) };
            if let Err(e) = granted {
                // SAFETY: the mapping made above, undone once on this path.
                let _ = unsafe { sys::cuMemUnmap(va, size) };
                return Err(unreserve(e));
            }
            // The mapping keeps the physical memory; the handle is not
            // needed any more.
            // SAFETY: the imported handle, released once.
            let _ = unsafe { sys::cuMemRelease(h) };
            Ok(Import {
                ptr: va,
                size,
                ctx: ctx.clone(),
            })
        })
    }
}

impl Drop for Import {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: the mapping and reservation made in `open`, undone
            // once; the world drops imports only after its last kernel.
            unsafe {
                let _ = sys::cuMemUnmap(self.ptr, self.size);
                let _ = sys::cuMemAddressFree(self.ptr, self.size);
            }
        }
    }
}

/// Read/write access for `dev` and every device that can access it as a
/// peer (what NCCL grants).
fn access_list(dev: sys::CUdevice) -> Result<Vec<sys::CUmemAccessDesc>> {
    let n = crate::driver::device_count()?;
    let mut v = Vec::new();
    for d in 0..n {
        let mut other = 0;
        // SAFETY: valid out-pointer; `d` is below the device count.
        unsafe { check("cuDeviceGet", sys::cuDeviceGet(&mut other, d))? };
        let reach = other == dev || {
            let mut can = 0;
            // SAFETY: valid out-pointer; two devices of the driver.
            unsafe {
                check(
                    "cuDeviceCanAccessPeer",
                    sys::cuDeviceCanAccessPeer(&mut can, other, dev),
                )?
            };
            can != 0
        };
        if reach {
            v.push(sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: other,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            });
        }
    }
    if !v.iter().any(|a| a.location.id == dev) {
        return Err(CudaError::Invalid(format!(
            "device {dev} is not among the driver's {n} devices"
        )));
    }
    Ok(v)
}
