//! The bench crate's error type.

use std::fmt;

use thiserror::Error;

/// What a measurement can report.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum BenchError {
    /// The CUDA backend failed (no driver, a driver call, a device wait).
    #[error(transparent)]
    Cuda(#[from] oxccl_cuda::CudaError),
    /// NCCL (the baseline) could not run: `why` says whether it is absent,
    /// refuses the placement or failed.
    #[error("NCCL {why}: {detail}")]
    Nccl { why: NcclWhy, detail: String },
    /// Bad arguments (rank out of range, zero ranks...).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Shorthand.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Why NCCL could not run, for callers that print `n/a` for some reasons
/// and fail on others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclWhy {
    /// No NCCL library could be loaded (or it lacks a symbol).
    Absent,
    /// Two ranks on one GPU: NCCL refuses that placement.
    SharedGpu,
    /// `NCCL_NVLS_ENABLE` is set to something other than `0`.
    Nvls,
    /// The request has no NCCL equivalent here.
    Unsupported,
    /// An NCCL call returned an error.
    Call,
    /// A wait for NCCL's work passed its deadline (communicators aborted).
    Timeout,
}

impl fmt::Display for NcclWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NcclWhy::Absent => "unavailable",
            NcclWhy::SharedGpu => "refuses several ranks on one GPU",
            NcclWhy::Nvls => "refused (NVLink multicast)",
            NcclWhy::Unsupported => "unsupported",
            NcclWhy::Call => "call failed",
            NcclWhy::Timeout => "timed out",
        })
    }
}
