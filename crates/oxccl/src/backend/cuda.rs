//! The CUDA backend's entry points.
//!
//! PLACEHOLDER: the CUDA engineer replaces this module (within the current
//! session) with the real binding to `oxccl-cuda`. Until then it reports a
//! clean [`Error::BackendUnavailable`] and `available()` is false, so
//! `Backend::Auto` falls back to the host backend and GPU tests print
//! `skipped: no CUDA device`. The interface the facade relies on is exactly
//! these two functions.

use std::sync::Arc;

use super::{Backend, BackendOptions};
use crate::error::Error;

/// Whether a CUDA device can be used in this process.
pub fn available() -> bool {
    false
}

/// Creates the CUDA backend for a clique of `opts.nranks` ranks (ranks
/// round-robin over the visible devices).
pub fn create(_opts: &BackendOptions) -> Result<Arc<dyn Backend>, Error> {
    Err(Error::BackendUnavailable(
        "CUDA backend not built yet".into(),
    ))
}
