//! The core crate's error type.

use thiserror::Error;

/// Everything that can go wrong in oxccl-core.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    /// A name (data type, op, algorithm...) that is not known.
    #[error("unknown {what} {value:?}; expected one of: {expected}")]
    Parse {
        what: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A request that the named generator cannot serve.
    #[error("algorithm {algo} does not implement {coll}")]
    Unsupported { algo: String, coll: String },
    /// Arguments that make no plan (zero ranks, root out of range...).
    #[error("invalid plan request: {0}")]
    InvalidRequest(String),
    /// The checker or the interpreter found a broken plan.
    #[error("plan check failed: {0}")]
    PlanCheck(String),
}
