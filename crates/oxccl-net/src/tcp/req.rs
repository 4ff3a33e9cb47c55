//! A pending isend or irecv: how many of its parts are still moving, the
//! message size its parts agreed on, and the first error.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::NetError;

/// Called when any request completes or fails, so a proxy thread that
/// parks between tests wakes up.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

#[derive(Debug)]
pub(crate) struct Req {
    remaining: AtomicUsize,
    /// The message's size; `u64::MAX` until a part knows it.
    size: AtomicU64,
    error: OnceLock<NetError>,
}

impl Req {
    pub fn new(parts: usize, size: Option<u64>) -> Arc<Req> {
        Arc::new(Req {
            remaining: AtomicUsize::new(parts),
            size: AtomicU64::new(size.unwrap_or(u64::MAX)),
            error: OnceLock::new(),
        })
    }

    /// A receive part read the message's size: the first sets it, the
    /// others must agree.
    pub fn agree_size(&self, size: u64) -> Result<(), String> {
        match self
            .size
            .compare_exchange(u64::MAX, size, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(s) if s == size => Ok(()),
            Err(s) => Err(format!(
                "the sockets of one message announce {s} and {size} bytes"
            )),
        }
    }

    /// `n` more parts (a receive learns them from its first part's
    /// header, before that part is done).
    pub fn add_parts(&self, n: usize) {
        self.remaining.fetch_add(n, Ordering::AcqRel);
    }

    /// One part is done; `true` when it was the last.
    pub fn part_done(&self) -> bool {
        self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }

    pub fn fail(&self, e: NetError) {
        let _ = self.error.set(e);
    }

    /// `Some(size)` when done, an error when failed, `None` while running.
    pub fn poll(&self) -> Result<Option<usize>, NetError> {
        if let Some(e) = self.error.get() {
            return Err(e.clone());
        }
        if self.remaining.load(Ordering::Acquire) == 0 {
            return Ok(Some(self.size.load(Ordering::Acquire) as usize));
        }
        Ok(None)
    }
}
