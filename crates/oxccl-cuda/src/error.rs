//! The CUDA backend's error type.

use oxccl_core::WaitFault;
use thiserror::Error;

/// Everything oxccl-cuda can report. Nothing in this crate panics on a
/// missing driver: absence is [`CudaError::NoDriver`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CudaError {
    /// `libcuda` could not be loaded, or it reports no device.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// `libnvrtc` could not be loaded.
    #[error("no NVRTC (CUDA runtime compiler): {0}")]
    NoNvrtc(String),
    /// The installed driver is older than what oxccl needs.
    #[error(
        "the NVIDIA driver supports CUDA {}.{}; {what} needs CUDA {}.{} or newer (driver R525 or later for 12.0): update the driver",
        found / 1000, found % 1000 / 10, need / 1000, need % 1000 / 10
    )]
    DriverTooOld {
        found: i32,
        need: i32,
        what: &'static str,
    },
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {detail}")]
    Driver { call: &'static str, detail: String },
    /// NVRTC rejected the kernel sources (the log is included).
    #[error("NVRTC compilation of {module} for {arch} failed: {log}")]
    Compile {
        module: String,
        arch: String,
        log: String,
    },
    /// A plan the device encoding cannot express (too many operands...).
    #[error("plan not executable on CUDA: {0}")]
    Plan(String),
    /// Bad arguments (rank out of range, buffer count mismatch...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A device-side wait ended without what it awaited: past the
    /// deadline, or stopped by an abort or another rank's failure.
    #[error("{0}")]
    Wait(WaitFault),
    /// The clique was aborted and no rank was waiting at the time (so no
    /// wait recorded where).
    #[error("the communicator was aborted")]
    Aborted,
}

impl CudaError {
    /// A failed driver call, for code that calls the driver itself.
    pub fn driver(call: &'static str, e: impl std::fmt::Debug) -> Self {
        CudaError::Driver {
            call,
            detail: format!("{e:?}"),
        }
    }
}

/// Shorthand.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::CudaError;

    #[test]
    fn an_old_driver_is_named_with_what_is_needed() {
        let e = CudaError::DriverTooOld {
            found: 11080,
            need: 12000,
            what: "oxccl",
        };
        let m = e.to_string();
        assert!(m.contains("supports CUDA 11.8"), "{m}");
        assert!(m.contains("needs CUDA 12.0 or newer"), "{m}");
    }
}
