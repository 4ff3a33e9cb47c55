//! A rank's plan encoded into one device blob, its links made, its
//! scratch sized, and the result cached by plan.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use oxccl_core::plan::{BufRole, RankPlan};
use oxccl_core::Proto;

use crate::driver::DevMem;
use crate::encode::{self, Encoded};
use crate::error::{CudaError, Result};
use crate::kernels::THREADS;
use crate::layout::{OxChan, MAX_CHANNELS};

use super::{lock, LinkKind, World, SMALL_STEP_BYTES};

/// A plan uploaded for one rank.
#[derive(Debug)]
pub struct Prepared {
    pub(super) blob: DevMem,
    pub(super) layout: encode::BlobLayout,
    /// The launch parameter's channel records (the first `nchannels` set).
    pub(super) chans: [OxChan; MAX_CHANNELS],
    pub(super) nchannels: u32,
    /// Threads per block.
    pub(super) threads: u32,
    /// Scratch buffers' byte offsets in the rank's scratch area, by buffer id.
    pub(super) scratch_offsets: Vec<Option<usize>>,
    pub(super) scratch_bytes: usize,
    pub(super) elem_size: usize,
    pub(super) proto: Proto,
    /// The ranks the plan exchanges with (`RankPlan::peers`), for the gate.
    pub(super) peers: Vec<u32>,
    /// Whether the copy-engine path was asked for ([`World::prepare_copies`]).
    pub(super) copies_asked: bool,
    /// The plan as copies, where it runs on the copy engines (`copies`):
    /// launches then enqueue these and no kernel.
    pub(super) copies: Option<Vec<super::copies::Copy>>,
    /// The element count the one-step LL path was asked for
    /// ([`World::prepare_oneshot_ll`]).
    pub(super) ll1_asked: Option<usize>,
    /// Where the plan runs on the one-step LL path: its launches run that
    /// kernel, not the plan.
    pub(super) ll1: Option<super::oneshot_ll::Ll1Launch>,
}

impl Prepared {
    /// The wire protocol of the plan's FIFO connections.
    pub fn proto(&self) -> Proto {
        self.proto
    }

    pub fn channels(&self) -> u32 {
        self.nchannels
    }

    /// Per channel, the index of its first step among the plan's steps and
    /// its step count (how a step trace's stamps are laid out).
    pub fn channel_steps(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.chans[..self.nchannels as usize]
            .iter()
            .map(|c| (c.first as usize, c.nsteps as usize))
    }

    /// Bytes of a step trace of this plan: two `u64` stamps per step.
    pub fn trace_bytes(&self) -> usize {
        let steps = self.channel_steps().map(|(f, n)| f + n).max().unwrap_or(0);
        steps * 16
    }

    /// The ranks the plan exchanges with (`RankPlan::peers`).
    pub fn peers(&self) -> &[u32] {
        &self.peers
    }

    /// Whether launches of this plan run as copies on the copy engines,
    /// with no kernel (and so no SM).
    pub fn sm_free(&self) -> bool {
        self.copies.is_some()
    }

    /// Whether launches of this plan run the one-step LL AllReduce, not
    /// the plan (so they write no step stamps).
    pub fn oneshot_ll(&self) -> bool {
        self.ll1.is_some()
    }
}

/// Uploaded plans by hash, with the plan itself to rule out collisions.
pub(super) type PlanCache = HashMap<u64, Vec<(RankPlan, Arc<Prepared>)>>;

fn plan_hash(rp: &RankPlan) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rp.hash(&mut h);
    h.finish()
}

impl World {
    /// Uploads `rp` for its rank with Simple FIFOs; see
    /// [`World::prepare_proto`].
    pub fn prepare(&self, rp: &RankPlan, elem_size: usize) -> Result<Arc<Prepared>> {
        self.prepare_proto(rp, elem_size, Proto::Simple)
    }

    /// Uploads `rp` for its rank, its FIFO connections running `proto`
    /// (Simple or LL), once; later calls with an equal plan and protocol
    /// return the cached upload. Every rank of a call must use the same
    /// protocol: the two have separate buffers and counters.
    pub fn prepare_proto(
        &self,
        rp: &RankPlan,
        elem_size: usize,
        proto: Proto,
    ) -> Result<Arc<Prepared>> {
        self.prepare_with(rp, elem_size, proto, false, None)
    }

    /// As [`World::prepare_proto`], for a plan of the copy-engine
    /// algorithm: where the plan is copy-only and this clique can run
    /// copies (`copies`), its launches enqueue one `cuMemcpyAsync` per
    /// copy and no kernel ([`Prepared::sm_free`]); otherwise they run the
    /// executor as any plan (a debug line says why). Every rank of a call
    /// must prepare the plan the same way.
    pub fn prepare_copies(
        &self,
        rp: &RankPlan,
        elem_size: usize,
        proto: Proto,
    ) -> Result<Arc<Prepared>> {
        self.prepare_with(rp, elem_size, proto, true, None)
    }

    /// As [`World::prepare_proto`], for an AllReduce plan of `count`
    /// elements of the one-step LL algorithm: where the path serves it
    /// ([`World::oneshot_ll_bytes`]) its launches run the one-step LL
    /// kernel ([`Prepared::oneshot_ll`]); otherwise they run the plan,
    /// the FIFO one-shot. Every rank of a call must prepare the plan the
    /// same way.
    pub fn prepare_oneshot_ll(
        &self,
        rp: &RankPlan,
        elem_size: usize,
        proto: Proto,
        count: usize,
    ) -> Result<Arc<Prepared>> {
        self.prepare_with(rp, elem_size, proto, false, Some(count))
    }

    fn prepare_with(
        &self,
        rp: &RankPlan,
        elem_size: usize,
        proto: Proto,
        copies_asked: bool,
        ll1_asked: Option<usize>,
    ) -> Result<Arc<Prepared>> {
        if !matches!(proto, Proto::Simple | Proto::LL) {
            return Err(CudaError::Invalid(format!(
                "protocol {proto}: the CUDA executor runs simple and ll"
            )));
        }
        let r = rp.rank;
        let st = self.rank(r)?;
        if rp.nranks != self.nranks() {
            return Err(CudaError::Invalid(format!(
                "plan for {} ranks on a clique of {}",
                rp.nranks,
                self.nranks()
            )));
        }
        let h = plan_hash(rp);
        if let Some(list) = lock(&st.plans).get(&h) {
            if let Some((_, p)) = list.iter().find(|(q, p)| {
                q == rp
                    && p.elem_size == elem_size
                    && p.proto == proto
                    && p.copies_asked == copies_asked
                    && p.ll1_asked == ll1_asked
            }) {
                return Ok(p.clone());
            }
        }
        if rp.max_message() * elem_size > self.cfg.slot_bytes {
            return Err(CudaError::Plan(format!(
                "a message of {} elements × {elem_size} bytes exceeds the {}-byte FIFO slot",
                rp.max_message(),
                self.cfg.slot_bytes
            )));
        }
        let nch = rp.channels.len() as u32;
        if nch > self.max_channels() {
            return Err(CudaError::Plan(format!(
                "{nch} channels; at most {} fit on the device with every rank resident",
                self.max_channels()
            )));
        }
        let ll1 = match ll1_asked {
            Some(count) => self.oneshot_ll_for(rp, count, elem_size)?,
            None => None,
        };
        // A plan run on the one-step LL path uploads no steps and makes no
        // connections: its launches never run them.
        let stepless;
        let to_encode = if ll1.is_some() {
            stepless = RankPlan {
                channels: Vec::new(),
                ..rp.clone()
            };
            &stepless
        } else {
            rp
        };
        let mut enc: Encoded = encode::encode(to_encode)?;
        // Every rank launches at least one block, even with nothing to do
        // (a launch of zero blocks is an error).
        if enc.chans.is_empty() {
            enc.chans.push(OxChan::default());
        }
        let conn_ptrs = enc
            .conns
            .iter()
            .map(|&k| self.link(LinkKind::Fifo(proto), k))
            .collect::<Result<Vec<_>>>()?;
        let sem_ptrs = enc
            .sems
            .iter()
            .map(|&k| self.link(LinkKind::Sem, k))
            .collect::<Result<Vec<_>>>()?;
        let bytes = enc.blob(&conn_ptrs, &sem_ptrs);
        let dev = self.dev(r)?;
        let blob = DevMem::zeroed(&dev.ctx, bytes.len())?;
        // SAFETY: `blob` holds `bytes.len()` bytes.
        unsafe { dev.setup.write_sync(blob.ptr, &bytes)? };
        let mut scratch_offsets = vec![None; rp.bufs.len()];
        let mut off = 0usize;
        for (i, b) in rp.bufs.iter().enumerate() {
            if b.role == BufRole::Scratch && b.len > 0 {
                scratch_offsets[i] = Some(off);
                off += (b.len * elem_size).div_ceil(256) * 256;
            }
        }
        // Grow the scratch area now, not at launch: a cuMemAlloc while
        // peers' kernels spin waiting for this rank's launch can stall it.
        if off > 0 {
            self.scratch(r, off)?;
        }
        let copies = if copies_asked {
            self.copies_for(rp)
        } else {
            None
        };
        let mut chans = [OxChan::default(); MAX_CHANNELS];
        chans[..enc.chans.len()].copy_from_slice(&enc.chans);
        let p = Arc::new(Prepared {
            blob,
            layout: enc.layout(),
            chans,
            nchannels: enc.chans.len() as u32,
            threads: self.block_threads(&enc, rp.bufs.len(), elem_size),
            scratch_offsets,
            scratch_bytes: off,
            elem_size,
            proto,
            peers: rp.peers(),
            copies_asked,
            copies,
            ll1_asked,
            ll1,
        });
        lock(&st.plans)
            .entry(h)
            .or_default()
            .push((rp.clone(), p.clone()));
        Ok(p)
    }

    /// Threads per block for an encoded plan: [`THREADS`], or for a plan
    /// of small transfers `small_threads` raised to a multiple of 32 that
    /// covers what its steps need (a thread per operand and per signal or
    /// wait of a run) and the buffers it publishes (a thread each).
    fn block_threads(&self, enc: &Encoded, nbufs: usize, elem_size: usize) -> u32 {
        let small = enc.max_len().saturating_mul(elem_size as u64) <= SMALL_STEP_BYTES;
        if !small || self.cfg.small_threads == 0 {
            return THREADS;
        }
        let need = enc
            .min_threads()
            .max(nbufs as u32)
            .max(self.cfg.small_threads);
        need.div_ceil(32).saturating_mul(32).min(THREADS)
    }
}
