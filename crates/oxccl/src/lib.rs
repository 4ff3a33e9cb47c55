//! oxccl: collective communications in the style of NCCL.
pub mod backend;
pub mod error;

pub use backend::BackendKind;
pub use error::{Error, Result};
