//! The bench crate's error type.

use thiserror::Error;

use crate::nccl::NcclWhy;

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
