//! The crate's one error type.

use thiserror::Error;

/// Everything that can go wrong in this crate.
#[derive(Debug, Error)]
pub enum TopoError {
    /// The XML is not well formed, or an element or attribute has a value
    /// that cannot be used; `line` and `col` are 1-based.
    #[error("topology XML, line {line}, column {col}: {msg}")]
    Xml { line: u32, col: u32, msg: String },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// No preset has that name.
    #[error("unknown preset {0:?}; known: {1}")]
    UnknownPreset(String, String),
    /// An argument is out of range (for example zero hosts).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Sweep JSON for calibration could not be read.
    #[error("sweep JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Short for `Result<T, TopoError>`.
pub type Result<T> = std::result::Result<T, TopoError>;
