//! User buffers every rank can address, their per-device pool, and each
//! rank's scratch area.

use crate::driver::{DevMem, Event, Stream};
use crate::error::{CudaError, Result};

use super::{lock, World};

/// Bytes `len` rounds up to in the buffer pool.
fn pool_class(bytes: usize) -> usize {
    let b = bytes.max(256);
    if b <= 64 << 20 {
        b.next_power_of_two()
    } else {
        b.div_ceil(64 << 20) * (64 << 20)
    }
}

impl World {
    /// Zeroed device memory that every rank can address: on `rank`'s device.
    pub fn alloc(&self, rank: u32, bytes: usize) -> Result<u64> {
        let dev = self.dev(rank)?;
        let class = pool_class(bytes);
        let reused = lock(&dev.pool).get_mut(&class).and_then(Vec::pop);
        let mem = match reused {
            Some(m) => m,
            None => DevMem::zeroed(&dev.ctx, class)?,
        };
        // SAFETY: `mem` holds `class` >= `bytes` bytes; the memset is on
        // the setup stream, which never waits for the ranks' kernels.
        unsafe { memset_zero(&dev.setup, mem.ptr, bytes)? };
        let ptr = mem.ptr;
        lock(&self.live).insert(ptr, (rank, mem));
        Ok(ptr)
    }

    /// Returns memory from [`World::alloc`] to the pool.
    pub fn free(&self, rank: u32, ptr: u64) -> Result<()> {
        let (owner, mem) = lock(&self.live).remove(&ptr).ok_or_else(|| {
            CudaError::Invalid(format!("{ptr:#x} was not allocated by this clique"))
        })?;
        if owner != rank {
            let e = CudaError::Invalid(format!("{ptr:#x} belongs to rank {owner}, not {rank}"));
            lock(&self.live).insert(ptr, (owner, mem));
            return Err(e);
        }
        let dev = self.dev(rank)?;
        lock(&dev.pool).entry(mem.bytes).or_default().push(mem);
        Ok(())
    }

    /// Scratch area of at least `bytes` for `rank` (grows; never shrinks).
    pub(super) fn scratch(&self, rank: u32, bytes: usize) -> Result<u64> {
        let st = self.rank(rank)?;
        let mut s = lock(&st.scratch);
        if let Some(m) = s.as_ref() {
            if m.bytes >= bytes {
                return Ok(m.ptr);
            }
        }
        let m = DevMem::zeroed(&self.dev(rank)?.ctx, bytes.next_power_of_two())?;
        let ptr = m.ptr;
        if let Some(old) = s.replace(m) {
            lock(&st.retired).push(old);
        }
        Ok(ptr)
    }

    /// Copies `bytes` device-to-device on `rank`'s stream `iters` times and
    /// returns the median time of one copy, in seconds (the copy ceiling).
    pub fn time_copy(&self, rank: u32, bytes: usize, iters: usize) -> Result<f64> {
        let dev = self.dev(rank)?;
        let st = self.rank(rank)?;
        let a = DevMem::zeroed(&dev.ctx, bytes)?;
        let b = DevMem::zeroed(&dev.ctx, bytes)?;
        let (e0, e1) = (Event::new(&dev.ctx)?, Event::new(&dev.ctx)?);
        let mut times = Vec::new();
        for i in 0..iters + 2 {
            e0.record(&st.stream)?;
            // SAFETY: both allocations hold `bytes` bytes and outlive the sync below.
            unsafe { st.stream.copy_dtod(b.ptr, a.ptr, bytes)? };
            e1.record(&st.stream)?;
            let ms = e1.elapsed_since(&e0)?;
            if i >= 2 {
                times.push(f64::from(ms) / 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times.get(times.len() / 2).copied().unwrap_or(0.0))
    }
}

/// # Safety
/// `ptr` must be device memory of at least `bytes` bytes in `s`'s context.
unsafe fn memset_zero(s: &Stream, ptr: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    s.ctx().bind()?;
    // SAFETY: caller's contract.
    unsafe {
        cudarc::driver::sys::cuMemsetD8Async(ptr, 0, bytes, s.raw)
            .result()
            .map_err(|e| CudaError::driver("cuMemsetD8Async", e))?;
    }
    s.synchronize()
}
