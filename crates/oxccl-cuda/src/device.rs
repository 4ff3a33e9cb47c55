//! Device discovery: whether CUDA can be used here, and what is there.

use cudarc::driver::sys::CUdevice_attribute as A;

use crate::driver::{self, Ctx};
use crate::error::{CudaError, Result};
use crate::kernels;

/// One visible GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    /// Compute capability as `major * 10 + minor` (90 on the H200).
    pub arch: u32,
    pub sm_count: u32,
    pub total_mem: usize,
}

/// What [`available`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaInfo {
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    pub devices: Vec<DeviceInfo>,
}

/// Whether this process can run the CUDA backend: the driver loads, at
/// least one device is visible and NVRTC loads. Never panics; without
/// CUDA it returns [`CudaError::NoDriver`] (or [`CudaError::NoNvrtc`]).
pub fn available() -> Result<CudaInfo> {
    let n = driver::device_count()?;
    if n <= 0 {
        return Err(CudaError::NoDriver(
            "the driver reports no CUDA device".into(),
        ));
    }
    let nvrtc_version = kernels::nvrtc_version()?;
    let mut driver_version = 0;
    driver::guarded("cuDriverGetVersion", || {
        // SAFETY: valid out-pointer; the driver is initialised.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| CudaError::driver("cuDriverGetVersion", e))
    })?;
    let devices = (0..n).map(device_info).collect::<Result<Vec<_>>>()?;
    Ok(CudaInfo {
        driver_version,
        nvrtc_version,
        devices,
    })
}

/// Describes device `ordinal`.
pub fn device_info(ordinal: i32) -> Result<DeviceInfo> {
    driver::guarded("device query", || {
        let ctx = Ctx::new(ordinal)?;
        let name = cudarc::driver::result::device::get_name(ctx.dev)
            .map_err(|e| CudaError::driver("cuDeviceGetName", e))?;
        // SAFETY: valid device.
        let total_mem = unsafe { cudarc::driver::result::device::total_mem(ctx.dev) }
            .map_err(|e| CudaError::driver("cuDeviceTotalMem", e))?;
        let major = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = ctx.attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(DeviceInfo {
            ordinal,
            name,
            arch: (major * 10 + minor) as u32,
            sm_count: sms as u32,
            total_mem,
        })
    })
}

/// For tests: `Some(info)` when a device is usable, else prints
/// `skipped: no CUDA device (<why>)` and returns `None`.
pub fn device_or_skip(test: &str) -> Option<CudaInfo> {
    match available() {
        Ok(i) => Some(i),
        Err(e) => {
            println!("{test}: skipped: no CUDA device ({e})");
            None
        }
    }
}
