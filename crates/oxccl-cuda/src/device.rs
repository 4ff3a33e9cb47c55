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
        let total_mem = ctx.total_mem()?;
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

/// The variable that turns a GPU test's skip into a failure. Every device
/// run sets it, so a broken GPU machine cannot pass by skipping.
pub const REQUIRE_GPU_VAR: &str = "OXCCL_REQUIRE_GPU";

/// What a GPU test does with the outcome of probing CUDA.
#[derive(Debug, PartialEq)]
pub enum GpuGate<T> {
    /// CUDA is there: run.
    Run(T),
    /// No driver or no device, and none is required: print the reason and
    /// return (`skipped: no CUDA device (<why>)`).
    Skip(String),
}

/// The one rule every GPU test follows: only the absence of a driver or of
/// a device ([`CudaError::NoDriver`]) skips, and only while `required` (the
/// value of [`REQUIRE_GPU_VAR`]) is unset, empty or `0`. With `1` a missing
/// device is an error; so is every other failure (NVRTC missing, a driver
/// call failing) and a value other than `0`/`1`. Pure, so the rule itself
/// is tested without a GPU.
pub fn gpu_gate<T>(probe: Result<T>, required: Option<&str>) -> Result<GpuGate<T>, String> {
    let required = match required.map(str::trim) {
        None | Some("" | "0") => false,
        Some("1") => true,
        Some(other) => {
            return Err(format!(
                "{REQUIRE_GPU_VAR}={other:?}: expected 1 (a GPU must be there) or 0"
            ))
        }
    };
    match probe {
        Ok(v) => Ok(GpuGate::Run(v)),
        Err(CudaError::NoDriver(why)) if !required => Ok(GpuGate::Skip(why)),
        Err(e @ CudaError::NoDriver(_)) => Err(format!(
            "{REQUIRE_GPU_VAR}=1 but there is no CUDA device: {e}"
        )),
        Err(e) => Err(format!("CUDA is present but unusable: {e}")),
    }
}

/// For GPU tests and device examples: `Some(v)` when `probe` succeeded;
/// `None` after printing `<test>: skipped: no CUDA device (<why>)` when
/// there is no driver or device and [`REQUIRE_GPU_VAR`] is not `1`.
///
/// # Panics
/// On every other outcome (see [`gpu_gate`]): the test fails.
#[track_caller]
pub fn skip_or_fail<T>(test: &str, probe: Result<T>) -> Option<T> {
    let required = std::env::var(REQUIRE_GPU_VAR).ok();
    match gpu_gate(probe, required.as_deref()) {
        Ok(GpuGate::Run(v)) => Some(v),
        Ok(GpuGate::Skip(why)) => {
            println!("{test}: skipped: no CUDA device ({why})");
            None
        }
        Err(msg) => panic!("{test}: {msg}"),
    }
}

/// [`skip_or_fail`] on [`available`]: the guard at the top of every GPU
/// test.
///
/// # Panics
/// When CUDA is present but unusable, or absent while required.
#[track_caller]
pub fn device_or_skip(test: &str) -> Option<CudaInfo> {
    skip_or_fail(test, available())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_driver() -> Result<()> {
        Err(CudaError::NoDriver("libcuda.so could not be loaded".into()))
    }

    #[test]
    fn only_a_missing_driver_skips_and_only_when_not_required() {
        for unset in [None, Some(""), Some("0"), Some(" 0 ")] {
            assert_eq!(
                gpu_gate(no_driver(), unset),
                Ok(GpuGate::Skip("libcuda.so could not be loaded".into()))
            );
        }
        let e = gpu_gate(no_driver(), Some("1")).unwrap_err();
        assert!(
            e.contains("OXCCL_REQUIRE_GPU=1") && e.contains("libcuda"),
            "{e}"
        );
        assert_eq!(gpu_gate(Ok(7), Some("1")), Ok(GpuGate::Run(7)));
        assert_eq!(gpu_gate(Ok(7), None), Ok(GpuGate::Run(7)));
    }

    #[test]
    fn other_failures_fail_even_when_not_required() {
        let others = [
            CudaError::NoNvrtc("libnvrtc.so could not be loaded".into()),
            CudaError::driver("cuInit", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
            CudaError::Compile {
                module: "exec".into(),
                arch: "sm_90".into(),
                log: "error".into(),
            },
        ];
        for e in others {
            let want = e.to_string();
            for required in [None, Some("0"), Some("1")] {
                let got = gpu_gate::<()>(Err(e.clone()), required).unwrap_err();
                assert!(got.contains(&want), "{required:?}: {got}");
            }
        }
    }

    #[test]
    fn a_bad_require_value_is_an_error_not_a_skip() {
        for bad in ["yes", "true", "2", "on"] {
            let e = gpu_gate(no_driver(), Some(bad)).unwrap_err();
            assert!(e.contains(bad), "{e}");
            assert!(gpu_gate(Ok(()), Some(bad)).is_err());
        }
    }

    #[test]
    #[should_panic(expected = "CUDA is present but unusable")]
    fn skip_or_fail_panics_on_other_errors() {
        skip_or_fail::<()>("t", Err(CudaError::NoNvrtc("missing".into())));
    }
}
