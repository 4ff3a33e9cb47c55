//! A backend that launches nothing: for tests of the facade's own logic
//! (the plan cache, selection, validation) and for measuring the facade's
//! CPU cost per call (`oxccl-bench`'s `facade_overhead`). It claims to be a
//! GPU backend with registered memory, Simple and LL, so the facade takes
//! the CUDA path; it hands out distinct fake addresses that must never be
//! dereferenced (reads and writes do nothing) and counts plan preparations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use oxccl_core::{Plan, Proto};

use super::{Backend, BackendKind, Launch, PreparedPlan, RawBuf, Timer, WallTimer};
use crate::error::Error;

/// The null backend. `max_channels` and `chunk_bytes` are what it reports.
#[derive(Debug)]
pub struct NullBackend {
    pub max_channels: u32,
    pub chunk_bytes: usize,
    next: AtomicU64,
    prepared: AtomicU64,
}

impl NullBackend {
    /// A null backend reporting `max_channels` channels and FIFO slots of
    /// `chunk_bytes`.
    pub fn new(max_channels: u32, chunk_bytes: usize) -> NullBackend {
        NullBackend {
            max_channels,
            chunk_bytes,
            // Away from 0, so a fake address is never null.
            next: AtomicU64::new(1 << 20),
            prepared: AtomicU64::new(0),
        }
    }

    /// How many times `prepare_plan` ran.
    pub fn prepared(&self) -> u64 {
        self.prepared.load(Ordering::Relaxed)
    }
}

impl Backend for NullBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn describe(&self) -> String {
        "null (launches nothing)".into()
    }
    fn blocking(&self) -> bool {
        false
    }
    fn registered_alloc(&self) -> bool {
        true
    }
    fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }
    fn max_channels(&self) -> u32 {
        self.max_channels
    }
    fn protocols(&self) -> &'static [Proto] {
        &[Proto::Simple, Proto::LL]
    }
    fn prepare_plan(&self, plan: &Plan, _: usize, _: Proto) -> PreparedPlan {
        // As a device refuses a plan with more blocks than fit at once.
        if let Some(rp) = plan
            .ranks
            .iter()
            .find(|rp| rp.channels.len() > self.max_channels as usize)
        {
            return Err(Error::Backend(format!(
                "rank {}: {} channels; the null backend runs at most {}",
                rp.rank,
                rp.channels.len(),
                self.max_channels
            )));
        }
        self.prepared.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Arc::new(())))
    }
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        // Touch what a real launch reads, so none of it is optimised out.
        std::hint::black_box((launch.plan.bufs.len(), launch.bufs, launch.handle));
        Ok(())
    }
    fn alloc(&self, _: u32, bytes: usize) -> Result<RawBuf, Error> {
        let addr = self
            .next
            .fetch_add(bytes.next_multiple_of(256) as u64, Ordering::Relaxed);
        Ok(RawBuf { addr, bytes })
    }
    unsafe fn free(&self, _: u32, _: RawBuf) {}
    unsafe fn write(&self, _: u32, _: RawBuf, _: &[u8]) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn read(&self, _: u32, _: RawBuf, _: &mut [u8]) -> Result<(), Error> {
        Ok(())
    }
    fn synchronize(&self, _: u32) -> Result<(), Error> {
        Ok(())
    }
    /// Nothing is ever pending: its launches do nothing (the watchdog's
    /// question, answered).
    fn completion(&self, _: u32) -> Result<Box<dyn super::Completion>, Error> {
        Ok(Box::new(super::Done))
    }
    fn abort(&self, _why: &str) {}
    fn failure(&self) -> Option<Error> {
        None
    }
    fn timer(&self, _: u32) -> Result<Box<dyn Timer>, Error> {
        // Wall time on the calling thread: what a call costs the facade, as
        // nothing is launched.
        Ok(Box::<WallTimer>::default())
    }
    fn copy_bandwidth(&self, _: usize) -> Result<f64, Error> {
        Err(Error::Backend("no copies on the null backend".into()))
    }
}
