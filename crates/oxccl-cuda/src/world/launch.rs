//! The executor kernel of a rank's device and one launch of a prepared
//! plan: the `OxDesc` parameter filled and the kernel enqueued.

use oxccl_core::{Awaited, BaseOp, DataType, FaultCause, LoweredOp, Proto, WaitFault};

use crate::driver::{Function, Module};
use crate::error::{CudaError, Result};
use crate::kernels::{self, Origin, THREADS};
use crate::layout::{OxDesc, D_LL, D_LL1, D_PRE, D_PRE_AT, D_RESUME, D_SYS, MAX_BUFS};

use super::failure::{W_ABORT, W_FAIL};
use super::gate::Party;
use super::{lock, Prepared, World};

/// The pre-scale as the element type's bits, converted exactly as
/// `Element::from_f64` does on the CPU.
pub fn scale_bits(dtype: DataType, s: f64) -> u64 {
    use oxccl_core::float8::{F8E4M3, F8E5M2};
    use oxccl_core::half::{bf16, f16};
    use oxccl_core::Element;
    match dtype {
        DataType::I8 => u64::from(i8::from_f64(s) as u8),
        DataType::U8 => u64::from(u8::from_f64(s)),
        DataType::I32 => u64::from(i32::from_f64(s) as u32),
        DataType::U32 => u64::from(u32::from_f64(s)),
        DataType::I64 => i64::from_f64(s) as u64,
        DataType::U64 => u64::from_f64(s),
        DataType::F16 => u64::from(f16::from_f64(s).to_bits()),
        DataType::Bf16 => u64::from(bf16::from_f64(s).to_bits()),
        DataType::F32 => u64::from((s as f32).to_bits()),
        DataType::F64 => s.to_bits(),
        DataType::F8E4M3 => u64::from(F8E4M3::from_f64(s).to_bits()),
        DataType::F8E5M2 => u64::from(F8E5M2::from_f64(s).to_bits()),
    }
}

impl World {
    /// The kernel for `(dtype, op)` on `rank`'s device, compiling or
    /// loading its module on first use.
    pub fn kernel(
        &self,
        rank: u32,
        dtype: DataType,
        op: BaseOp,
    ) -> Result<(Function, Option<Origin>)> {
        let dev = self.dev(rank)?;
        let slot = kernels::OPS.iter().position(|o| o.0 == op).unwrap_or(0);
        let cell = kernels::DTYPES
            .iter()
            .position(|d| d.0 == dtype)
            .and_then(|i| dev.modules.get(i))
            .ok_or_else(|| CudaError::Invalid(format!("no kernel for {dtype}")))?;
        if let Some((_, fs)) = cell.get() {
            return Ok((fs[slot], None));
        }
        let _loading = lock(&dev.loading);
        if let Some((_, fs)) = cell.get() {
            return Ok((fs[slot], None));
        }
        let (cubin, origin) = kernels::cubin(
            dtype,
            dev.arch,
            &kernels::cache_dir(self.cfg.cache_dir.as_deref()),
        )?;
        let m = Module::load(&dev.ctx, &cubin)?;
        let fs = kernels::OPS
            .iter()
            .map(|o| m.function(&kernels::kernel_name(dtype, o.0)))
            .collect::<Result<Vec<_>>>()?;
        // Every function now, so no launch loads code (which would wait for
        // peers' spinning kernels: see `Function::load`). Loading the module
        // itself waits for running kernels too, but every rank asks for it
        // here, under the lock, before launching its first kernel of this
        // type, so the kernels it waits for are earlier calls' (which need
        // nothing more from this rank's thread).
        for f in &fs {
            f.load()?;
            if self.cfg.block_smem > 48 * 1024 {
                f.allow_dynamic_smem(self.cfg.block_smem)?;
            }
        }
        let f = fs[slot];
        // Only this thread sets the cell (the loading lock is held).
        let _ = cell.set((m, fs));
        Ok((f, Some(origin)))
    }

    /// Blocks of the executor that fit on one SM.
    pub fn blocks_per_sm(&self, rank: u32) -> Result<u32> {
        let (f, _) = self.kernel(rank, DataType::F32, BaseOp::Sum)?;
        f.max_blocks_per_sm(THREADS, self.cfg.block_smem)
    }

    /// Enqueues one rank's plan on its stream (one kernel launch; returns
    /// at once; in relaunch mode, `relaunch`, once the plan has run, after
    /// as many launches as it took). `bufs` has one device address per plan buffer; scratch
    /// entries are ignored (the clique provides scratch).
    ///
    /// Where launches are gated (`gate`) it returns once the launches of
    /// `party` in this process have been made as many times (a rendezvous
    /// of their threads): [`Party::All`], every rank of the clique, for a
    /// collective; [`Party::Peers`] with [`Prepared::peers`] for a plan of
    /// Send/Recv only, which only the ranks it exchanges with launch (it
    /// then returns once they, the ranks they exchange with, and so on,
    /// have launched theirs).
    ///
    /// `trace`, unless 0, is where the kernel writes each step's
    /// `%globaltimer` start and end (the step trace); a plan that runs as
    /// copies ([`Prepared::sm_free`]) writes no stamps.
    ///
    /// A plan prepared with [`World::prepare_copies`] that runs as copies
    /// enqueues them instead of the kernel (`copies`), after exchanging
    /// buffer addresses with the peers' threads: every rank's launch of it
    /// returns once all ranks have launched it.
    ///
    /// # Safety
    /// Each non-scratch address must be device memory of the rank (or
    /// registered memory every rank can reach when the plan has remote
    /// steps) valid for the plan's length until the stream reaches the
    /// kernel. `trace`, when not 0, must be device memory of
    /// [`Prepared::trace_bytes`] bytes of the rank's device, untouched by
    /// anything else until the stream has passed the kernel.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &self,
        p: &Prepared,
        rank: u32,
        bufs: &[u64],
        dtype: DataType,
        op: &LoweredOp,
        party: Party<'_>,
        trace: u64,
    ) -> Result<()> {
        let enqueued = (|| -> Result<()> {
            let st = self.rank(rank)?;
            if bufs.len() != p.scratch_offsets.len() {
                return Err(CudaError::Invalid(format!(
                    "{} buffer addresses for a plan with {} buffers",
                    bufs.len(),
                    p.scratch_offsets.len()
                )));
            }
            if dtype.size() != p.elem_size {
                return Err(CudaError::Invalid(format!(
                    "plan prepared for {}-byte elements, launched with {dtype}",
                    p.elem_size
                )));
            }
            if let Some(copies) = p.copies.as_deref() {
                // SAFETY: the caller's contract covers every buffer of the
                // call (and the peers' through theirs).
                return unsafe { self.run_copies(p, copies, rank, bufs) };
            }
            let scratch_base = if p.scratch_bytes > 0 {
                self.scratch(rank, p.scratch_bytes)?
            } else {
                0
            };
            let (f, _) = self.kernel(rank, dtype, op.base)?;
            let relaunch = self.cfg.relaunch;
            if relaunch {
                // The host waits between launches, which a capture cannot.
                st.stream
                    .refuse_capture("a call in relaunch mode (OXCCL_RELAUNCH=1)")?;
            }
            let mut d = OxDesc {
                steps: p.blob.ptr,
                ops: p.blob.ptr + p.layout.ops as u64,
                ptr_table: self.shared.as_ref().map_or(self.ptr_table.ptr, |s| s.table),
                abort_flag: self.host_words.dev_ptr + (W_ABORT * 4) as u64,
                world_fail: self.host_words.dev_ptr + (W_FAIL * 4) as u64,
                err: st.err.ptr,
                scale_bits: match (op.pre_scale, op.pre_scale_at) {
                    (Some(s), _) => scale_bits(dtype, s),
                    (None, Some(addr)) => addr,
                    (None, None) => 0,
                },
                timeout_ns: u64::try_from(self.cfg.timeout.as_nanos()).unwrap_or(u64::MAX),
                slot_bytes: self.fifo_slot_bytes(p.proto) as u64,
                heap_delta: self.shared.as_ref().map_or(0, |s| s.delta.ptr),
                trace,
                progress: if relaunch { self.restart(rank)? } else { 0 },
                ll1_slots: p.ll1.map_or(0, |l| l.table),
                ll1_epoch: p.ll1.map_or(0, |l| l.epoch),
                ll1_count: p.ll1.map_or(0, |l| l.count),
                ll1_lines: p.ll1.map_or(0, |l| l.lines),
                rank,
                nranks: self.nranks(),
                nbufs: bufs.len() as u32,
                flags: if op.pre_scale.is_some() { D_PRE } else { 0 }
                    | if op.pre_scale_at.is_some() {
                        D_PRE | D_PRE_AT
                    } else {
                        0
                    }
                    | if self.devices.len() > 1 { D_SYS } else { 0 }
                    | if p.proto == Proto::LL { D_LL } else { 0 }
                    | if relaunch { D_RESUME } else { 0 }
                    | if p.ll1.is_some() { D_LL1 } else { 0 },
                post_div: op.post_div.unwrap_or(0),
                nslots: self.cfg.nslots as u32,
                bufs: [0; MAX_BUFS],
                chans: p.chans,
            };
            for (i, (&a, o)) in bufs.iter().zip(&p.scratch_offsets).enumerate() {
                d.bufs[i] = match o {
                    Some(off) => scratch_base + *off as u64,
                    None => self.tagged(a),
                };
            }
            // The one-step LL AllReduce is one block of every thread,
            // whatever the plan's channels (`oneshot_ll`).
            let (blocks, threads) = if p.ll1.is_some() {
                (1, THREADS)
            } else {
                (p.nchannels, p.threads)
            };
            // SAFETY: `OxDesc` is the kernel's parameter type (crate::layout);
            // the plan blob, links, tables and one-step LL slots live as long
            // as the clique; the caller guarantees the buffers.
            unsafe { f.launch_smem(blocks, threads, self.cfg.block_smem, &st.stream, &d)? };
            self.kernel_launches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if p.ll1.is_some() {
                self.ll1_calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if relaunch {
                // SAFETY: as the launch above.
                unsafe { self.relaunch_until_done(rank, &f, &d, p.nchannels, p.threads)? };
            }
            Ok(())
        })();
        self.in_step(rank, party, enqueued)
    }

    /// After `rank`'s launch (`r`), where gated (`gate`): wait until the
    /// launches of `party` (followed from peer to peer) were made.
    fn in_step(&self, rank: u32, party: Party<'_>, r: Result<()>) -> Result<()> {
        let Some(gate) = self.gate.as_ref() else {
            return r;
        };
        let caller = self
            .rank(rank)?
            .on_caller_stream
            .load(std::sync::atomic::Ordering::Relaxed);
        let Some(slot) = gate.slot(rank) else {
            return r;
        };
        if r.is_err() || !(self.gate_always || caller) {
            // Counted without waiting: nothing reached the stream (the
            // peers must not wait for it), or this launch needs no wait
            // (a peer's gated launch matches it all the same).
            gate.count(slot, party);
            return r;
        }
        let deadline = (self.cfg.timeout != std::time::Duration::MAX).then_some(self.cfg.timeout);
        gate.pass(slot, party, deadline, || self.failed())
            .map_err(|f| {
                if f.aborted {
                    return self.failure().unwrap_or(CudaError::Aborted);
                }
                tracing::warn!(
                    rank,
                    absent = ?f.absent,
                    "oxccl: a launch returns once the ranks it exchanges with have launched the \
                     call (on a caller's stream, or with more ranks on one GPU than it has \
                     hardware queues): call from one thread per rank, or issue several ranks' \
                     calls in one group"
                );
                CudaError::Wait(WaitFault {
                    cause: FaultCause::Deadline,
                    rank,
                    peer: f.absent.first().copied().unwrap_or(rank),
                    channel: 0,
                    step: 0,
                    awaited: Awaited::Unknown,
                    waited: f.waited,
                    absent: f.absent,
                })
            })
    }
}
