//! `--memory external`: every call of a row on memory the caller owns,
//! through the raw entry points, on the caller's stream, as a framework
//! uses the library: per rank, two cudarc allocations
//! (`CudaStream::alloc_zeros`, stream-ordered pool memory from
//! `cuMemAllocAsync`) as large as the rank's two sweep buffers, registered
//! with [`Communicator::register`] so the direct plans apply as they do
//! on `comm.alloc` memory, and a cudarc stream of the rank's device.
//!
//! The sweep's buffers stay where inputs are written and results read
//! (`comm.alloc` memory, so the check is the same code for both kinds): a
//! [`Mirror`] copies them into the external memory before the calls
//! ([`Mirror::push`]) and back after the checked call ([`Mirror::pull`]),
//! device to device on the caller's stream. The calls themselves touch
//! only the external memory: a view of the sweep's buffer is translated
//! to the same offset in its mirror ([`Mirror::at`]).

use std::sync::Arc;

use anyhow::Context;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use oxccl::{Communicator, RawStream, Registration};

/// Which memory a row's calls run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Memory {
    /// `comm.alloc` buffers, the typed entry points on the rank's stream.
    Alloc,
    /// Caller-allocated CUDA memory (cudarc pool memory), registered, the
    /// raw entry points on a caller's stream.
    External,
}

impl Memory {
    pub fn name(self) -> &'static str {
        match self {
            Memory::Alloc => "alloc",
            Memory::External => "external",
        }
    }
}

/// One rank's external copies of its two sweep buffers.
#[derive(Debug)]
pub(crate) struct Mirror {
    stream: Arc<CudaStream>,
    /// The external allocations, for the sweep's `main` and `other`:
    /// held (never read) so they live as long as the mirror.
    _ext: [CudaSlice<u8>; 2],
    /// Their device addresses.
    ext_at: [u64; 2],
    /// Where the sweep's `main` and `other` start.
    alloc_at: [u64; 2],
    bytes: usize,
}

impl Mirror {
    /// Allocates and registers rank `c`'s mirror of two sweep buffers of
    /// `bytes` bytes starting at `alloc_at`; returns it and the
    /// registrations, which the caller ends before dropping it.
    pub fn new(
        c: &Communicator,
        alloc_at: [u64; 2],
        bytes: usize,
    ) -> anyhow::Result<(Mirror, Vec<Registration>)> {
        if c.backend() != oxccl::BackendKind::Cuda {
            anyhow::bail!(
                "--memory external needs the CUDA backend (this sweep runs on {})",
                c.backend()
            );
        }
        let ndev = CudaContext::device_count()
            .context("CUDA device count")?
            .max(1) as u32;
        // init_all places rank r on device r % devices.
        let ctx = CudaContext::new((c.rank() % ndev) as usize).context("CUDA context")?;
        let stream = ctx.new_stream().context("caller stream")?;
        let ext = [
            stream.alloc_zeros::<u8>(bytes).context("external memory")?,
            stream.alloc_zeros::<u8>(bytes).context("external memory")?,
        ];
        let ext_at = [addr(&ext[0], &stream), addr(&ext[1], &stream)];
        stream.synchronize().context("caller stream")?;
        let mut regs = Vec::new();
        for &a in &ext_at {
            // SAFETY: each range is one live allocation of `bytes` bytes,
            // kept (in `ext`) until the mirror drops, which the sweep does
            // only after ending the registration, with every call on it
            // complete (each row synchronizes its calls).
            regs.push(unsafe { c.register(a as *const std::ffi::c_void, bytes) }?);
        }
        let m = Mirror {
            stream,
            _ext: ext,
            ext_at,
            alloc_at,
            bytes,
        };
        Ok((m, regs))
    }

    /// The caller's stream, as the raw entry points take it.
    pub fn stream(&self) -> RawStream {
        RawStream::from_ptr(self.stream.cu_stream().cast())
    }

    /// The external address that mirrors sweep address `a`: the same
    /// offset into the mirror of the buffer `a` lies in.
    pub fn at(&self, a: u64) -> anyhow::Result<u64> {
        for (&base, &ext) in self.alloc_at.iter().zip(&self.ext_at) {
            if a >= base && a <= base + self.bytes as u64 {
                return Ok(ext + (a - base));
            }
        }
        anyhow::bail!("address {a:#x} is in neither sweep buffer")
    }

    /// Copies both sweep buffers into the external memory (after `c`'s
    /// earlier work on them), and waits for the copies.
    pub fn push(&self, c: &Communicator) -> oxccl::Result<()> {
        c.synchronize()?;
        self.copy(true)
    }

    /// Copies the external memory back into both sweep buffers after the
    /// caller stream's earlier work (the calls), and waits for the copies.
    pub fn pull(&self) -> oxccl::Result<()> {
        self.copy(false)
    }

    fn copy(&self, to_ext: bool) -> oxccl::Result<()> {
        for (&a, &e) in self.alloc_at.iter().zip(&self.ext_at) {
            let (dst, src) = if to_ext { (e, a) } else { (a, e) };
            // SAFETY: both ranges are `bytes` bytes of live device memory
            // of this device (the sweep's buffers and `ext`), and nothing
            // else uses them until the synchronize below returns.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst,
                    src,
                    self.bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(driver)?;
        }
        self.stream.synchronize().map_err(driver)
    }

    /// Waits for the caller's stream.
    pub fn synchronize(&self) -> oxccl::Result<()> {
        self.stream.synchronize().map_err(driver)
    }
}

fn addr(s: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> u64 {
    // The guard records a read event on `stream` when dropped; the
    // address itself stays valid as long as `s` lives.
    let (p, _guard) = s.device_ptr(stream);
    p
}

fn driver(e: cudarc::driver::DriverError) -> oxccl::Error {
    oxccl::Error::Internal(format!("sweep's external memory: {e}"))
}

/// The worst ratio of an external row's time to the same row's time on
/// `comm.alloc` memory, described, when the sweep ran both.
pub(crate) fn worst_ratio(rows: &[super::Row]) -> Option<String> {
    let same = |a: &super::Row, b: &super::Row| {
        (&a.coll, &a.dtype, &a.op, a.bytes, a.in_place)
            == (&b.coll, &b.dtype, &b.op, b.bytes, b.in_place)
    };
    rows.iter()
        .filter(|r| r.memory == Memory::External.name())
        .filter_map(|e| {
            let a = rows
                .iter()
                .find(|a| a.memory == Memory::Alloc.name() && same(a, e))?;
            Some((e.time_us / a.time_us, e, a))
        })
        .max_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(w, e, a)| {
            format!(
                "{:.3} ({} {} B {}: {:.2} us external, {:.2} us alloc)",
                w,
                e.coll,
                e.bytes,
                if e.in_place {
                    "in place"
                } else {
                    "out of place"
                },
                e.time_us,
                a.time_us
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(memory: Memory, bytes: usize, in_place: bool, time_us: f64) -> super::super::Row {
        super::super::Row {
            coll: "allreduce".into(),
            dtype: "float".into(),
            op: "sum".into(),
            bytes,
            count: bytes / 4,
            algo: "ring".into(),
            proto: "simple".into(),
            channels: 1,
            predicted_us: None,
            time_us,
            algbw_gbps: 1.0,
            busbw_gbps: 1.0,
            in_place,
            memory: memory.name().into(),
            wrong: 0,
            floor_ratio: None,
            sm_free: None,
            nccl: Default::default(),
        }
    }

    #[test]
    fn the_worst_ratio_pairs_each_external_row_with_its_alloc_row() {
        let rows = [
            row(Memory::Alloc, 8, false, 10.0),
            row(Memory::External, 8, false, 10.5),
            row(Memory::Alloc, 8, true, 4.0),
            row(Memory::External, 8, true, 6.0),
            row(Memory::Alloc, 16, false, 1.0),
            row(Memory::External, 16, false, 1.0),
        ];
        let w = worst_ratio(&rows).expect("pairs");
        assert!(w.starts_with("1.500 ("), "{w}");
        assert!(w.contains("8 B in place"), "{w}");
        assert_eq!(worst_ratio(&rows[..1]), None);
    }

    #[test]
    fn external_memory_is_refused_on_the_host_backend() {
        let config = oxccl::Config {
            backend: oxccl::BackendKind::Host,
            ..oxccl::Config::default()
        };
        let comms = oxccl::init_all_with(1, config).unwrap();
        let e = Mirror::new(&comms[0], [0, 0], 8).unwrap_err().to_string();
        assert!(e.contains("needs the CUDA backend"), "{e}");
    }
}
