//! User buffers every rank can address, their per-device pool, and each
//! rank's scratch area.
//!
//! Lifetimes are stream-ordered. A buffer freed by rank r may still be in
//! use by work r enqueued before the free: r's own kernels (and graph
//! replays) on r's stream, and, inside those same calls, peers' kernels
//! reading or writing it as registered memory. Peers' accesses end before
//! r's kernel of the same call does (a plan's owner finishes only after
//! every peer's last remote access to its buffers: the checker's finish
//! rule), so "r's stream has passed the free" means "nobody touches it".
//! [`World::free`] therefore records an event on r's stream and pools the
//! memory with it; [`World::alloc`] hands pooled memory to
//!
//! - the same rank at once: its zeroing is enqueued on that rank's stream,
//!   behind the old work, and everything that later touches the new
//!   buffer (the rank's launches, copies and, through them, its peers)
//!   follows it on that stream;
//! - another rank only once the event has completed (`cuEventQuery`,
//!   which never waits). Making the other rank's stream wait for the event
//!   instead could deadlock: the event may follow a call that cannot
//!   complete before the allocating rank joins it with a later launch.
//!
//! Nothing here waits for the device: no `cuMemFree` while the clique
//! lives (it waits for every running kernel, and a rank held there while a
//! peer's kernel spins waiting for it stalls both until the deadline), no
//! host synchronisation on the zeroing.

use crate::driver::{DevMem, Event};
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

/// Alloc and free order their work on the rank's stream, so they cannot
/// run while that stream is being captured into a graph (the zeroing would
/// become part of the graph, and a free's event would mark nothing).
fn refuse_during_capture(s: &crate::driver::Stream, rank: u32, what: &str) -> Result<()> {
    if s.capturing()? {
        return Err(CudaError::Invalid(format!(
            "{what} on rank {rank} while its stream is being captured into a graph: \
             allocate before capture and free after the graph's last replay"
        )));
    }
    Ok(())
}

/// Memory returned by [`World::free`], reusable as the module says.
#[derive(Debug)]
pub(super) struct Freed {
    mem: DevMem,
    /// The rank that freed it.
    rank: u32,
    /// Recorded on `rank`'s stream at the free.
    done: Event,
}

impl World {
    /// Device bytes this clique holds now over all its devices: links,
    /// scratch, heaps, the pool and the buffers [`World::alloc`] handed
    /// out (not memory mapped from other processes, nor callers' own).
    pub fn held_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.ctx.held_bytes()).sum()
    }

    /// Zeroed device memory that every rank can address, on `rank`'s
    /// device. The zeroing is ordered on `rank`'s stream: it is complete
    /// for everything later issued there (launches, copies, and peers'
    /// accesses inside those launches); the call itself does not wait.
    pub fn alloc(&self, rank: u32, bytes: usize) -> Result<u64> {
        let dev = self.dev(rank)?;
        let st = self.rank(rank)?;
        refuse_during_capture(&st.stream, rank, "alloc")?;
        let class = pool_class(bytes);
        let reused = {
            let mut pool = lock(&dev.pool);
            let list = pool.entry(class).or_default();
            // Newest first: the same rank's own frees are the usual hit.
            let mut pick = None;
            for i in (0..list.len()).rev() {
                if list[i].rank == rank || list[i].done.done()? {
                    pick = Some(i);
                    break;
                }
            }
            pick.map(|i| list.swap_remove(i))
        };
        let mem = match reused {
            Some(f) => {
                lock(&dev.events).push(f.done);
                f.mem
            }
            None => self.fresh(rank, class)?,
        };
        // SAFETY: `mem` holds `class` >= `bytes` bytes and is owned by the
        // clique (in `live`) until freed, which orders after this memset.
        unsafe { st.stream.zero_async(mem.ptr, bytes)? };
        let ptr = mem.ptr;
        lock(&self.live).insert(ptr, (rank, mem));
        Ok(ptr)
    }

    /// Zeroed page-locked host memory that `rank`'s kernels write through
    /// [`crate::driver::HostMapped::dev_ptr`] (a step trace's stamps: read by the host
    /// while and after the kernel runs, without draining its stream).
    pub fn host_mapped(&self, rank: u32, bytes: usize) -> Result<crate::driver::HostMapped> {
        crate::driver::HostMapped::zeroed(&self.dev(rank)?.ctx, bytes)
    }

    /// Returns memory from [`World::alloc`] to the pool. It is handed out
    /// again only after everything `rank` issued before this call has
    /// completed (see the module documentation); the call does not wait.
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
        let st = self.rank(rank)?;
        if let Err(e) = refuse_during_capture(&st.stream, rank, "free") {
            lock(&self.leaked).push(mem);
            return Err(e);
        }
        let recycled = lock(&dev.events).pop();
        let done = match recycled {
            Some(e) => e,
            None => Event::ordering(&dev.ctx)?,
        };
        if let Err(e) = done.record(&st.stream) {
            // Without the event nothing says when the memory is free:
            // keep it out of the pool rather than risk reusing it early.
            lock(&self.leaked).push(mem);
            return Err(e);
        }
        lock(&dev.pool)
            .entry(mem.bytes)
            .or_default()
            .push(Freed { mem, rank, done });
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
        let dev = self.dev(rank)?;
        let bytes = bytes.next_power_of_two();
        let m = match &self.shared {
            None => DevMem::zeroed(&dev.ctx, bytes)?,
            Some(sh) => {
                let m = sh.heap.carve(rank, bytes)?;
                // SAFETY: `m` holds `bytes` bytes; waiting for the setup
                // stream waits for this memset only, never a rank's kernels.
                unsafe { dev.setup.zero_async(m.ptr, bytes)? };
                dev.setup.synchronize()?;
                m
            }
        };
        let ptr = m.ptr;
        if let Some(old) = s.replace(m) {
            lock(&st.retired).push(old);
        }
        Ok(ptr)
    }

    /// `bytes` of new memory every rank can address (contents undefined):
    /// `cuMemAlloc` on the rank's device, or, when ranks are processes,
    /// part of the rank's heap that every peer process maps.
    fn fresh(&self, rank: u32, bytes: usize) -> Result<DevMem> {
        match &self.shared {
            Some(sh) => sh.heap.carve(rank, bytes),
            None => DevMem::uninit(&self.dev(rank)?.ctx, bytes),
        }
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
