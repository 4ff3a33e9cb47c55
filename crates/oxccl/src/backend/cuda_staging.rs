//! Staging areas of the staged CUDA path, shared by its eager calls
//! (`cuda_staged.rs`) and its graph-captured ones
//! (`cuda_staged_capture.rs`): page-locked host memory of the host
//! backend's heap, and where each of a call's buffers lands in it.

use std::sync::Arc;

use oxccl_cuda::driver::relaxed_capture;
use oxccl_cuda::driver::Ctx;
use oxccl_cuda::ipc::Pinned;

use super::cuda::map_error;
use super::{Backend, RawBuf};
use crate::error::Error;

/// One staging area: host memory from the host backend's shared heap,
/// page-locked.
#[derive(Debug)]
pub(super) struct Stage {
    pub buf: RawBuf,
    pin: Pinned,
}

impl Stage {
    /// `bytes` bytes of `host`'s heap for `rank`, page-locked in `ctx`
    /// (in relaxed capture mode: a captured call stages while its thread
    /// captures, where the driver may refuse setup calls as unsafe).
    pub fn new(
        host: &Arc<dyn Backend>,
        rank: u32,
        ctx: &Arc<Ctx>,
        bytes: usize,
    ) -> Result<Stage, Error> {
        let buf = host.alloc(rank, bytes)?;
        // SAFETY: `buf` is mapped heap memory of this process, kept until
        // the Stage (and its registration, dropped first) goes.
        let pin = relaxed_capture(|| unsafe {
            Pinned::register(ctx, buf.addr as usize as *mut u8, buf.bytes)
        })
        .and_then(|r| r)
        .map_err(map_error);
        match pin {
            Ok(pin) => Ok(Stage { buf, pin }),
            Err(e) => {
                // SAFETY: just allocated, used by nothing.
                unsafe { host.free(rank, buf) };
                Err(e)
            }
        }
    }

    /// Unpins the area and returns it to `host`.
    ///
    /// # Safety
    /// No copy or plan uses the area any more.
    pub unsafe fn free(self, host: &dyn Backend, rank: u32) {
        drop(self.pin);
        // SAFETY: the area came from `host.alloc`; caller's contract.
        unsafe { host.free(rank, self.buf) };
    }
}

/// Non-overlapping spans `(start, end)` covering `bufs` (empty ones left
/// out), in address order.
pub(super) fn spans(bufs: &[RawBuf]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = bufs
        .iter()
        .filter(|b| b.bytes > 0)
        .map(|b| (b.addr, b.end()))
        .collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s < last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Where each of `live` lands when span `i` of `spans` is staged at
/// `bases[i]` (empty buffers: `RawBuf::NULL`).
pub(super) fn staged(live: &[RawBuf], spans: &[(u64, u64)], bases: &[u64]) -> Vec<RawBuf> {
    live.iter()
        .map(|b| {
            let i = spans
                .iter()
                .position(|&(s, e)| b.bytes > 0 && b.addr >= s && b.end() <= e);
            match i {
                Some(i) => RawBuf {
                    addr: bases[i] + (b.addr - spans[i].0),
                    bytes: b.bytes,
                },
                None => RawBuf::NULL,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(addr: u64, bytes: usize) -> RawBuf {
        RawBuf { addr, bytes }
    }

    #[test]
    fn spans_merge_overlaps_only() {
        // Out of place: two spans; in-place AllGather: the input inside
        // the output is one span; adjacent buffers stay apart; empty ones
        // are left out.
        assert_eq!(spans(&[b(100, 10), b(200, 10)]), [(100, 110), (200, 210)]);
        assert_eq!(spans(&[b(120, 10), b(100, 40)]), [(100, 140)]);
        assert_eq!(spans(&[b(100, 10), b(110, 10)]), [(100, 110), (110, 120)]);
        assert_eq!(spans(&[b(100, 0), RawBuf::NULL, b(5, 5)]), [(5, 10)]);
        assert_eq!(spans(&[b(0, 50), b(10, 5), b(40, 20)]), [(0, 60)]);
    }
}
