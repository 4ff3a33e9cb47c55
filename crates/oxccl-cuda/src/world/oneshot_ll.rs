//! The one-step LL AllReduce's memory (`kernels/oxccl_ll1.cuh`): each
//! rank's LL slots and epoch word in its device's memory, and per rank a
//! table of every rank's slot base, made once for the clique.
//!
//! A rank's slots are 2 parities × n senders × `lines` LL lines of 16
//! bytes (8 data bytes and two flags, the FIFO LL line of
//! `oxccl_ll.cuh`), where `lines` carries [`WorldConfig::ll1_bytes`]. The
//! epoch counts the rank's finished one-shot calls and is advanced by the
//! kernel itself, so a call captured in a graph gets a fresh flag each
//! replay. Nothing here is freed while the clique lives (peers' kernels
//! store into every rank's slots).
//!
//! Ranks as processes keep their slots and epoch in their link arena
//! (`procs`), which every peer process maps at creation: a slot base is
//! then a peer's arena as mapped here plus a fixed offset, with no
//! exchange. The caller's buffers are only ever read and written by their
//! own rank, so the path needs no sharing of them (a framework's tensors
//! run it as they are).
//!
//! The slots are sized once for the clique: `lines` is the payload limit
//! in LL lines, capped so a rank's slots take at most `ll1_slots::SLOT_BUDGET`.

use std::sync::Arc;

use oxccl_core::plan::{BufRole, RankPlan};

use crate::driver::DevMem;
use crate::error::{CudaError, Result};
use crate::layout::MAX_OPERANDS;

use super::ll1_slots::{slot_bytes, slot_lines};
use super::{lock, World};

/// Every rank's slots, epoch and slot table, by rank (0 where a rank is
/// not driven by this process).
#[derive(Debug)]
pub(super) struct Ll1Mem {
    /// LL lines per sender and parity.
    lines: u64,
    /// Held, never read here: the kernels address the slots through
    /// `tables`, the epochs through `epochs`.
    _held: Vec<DevMem>,
    epochs: Vec<u64>,
    tables: Vec<u64>,
}

/// What a launch of the path needs, fixed when its plan is prepared.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ll1Launch {
    /// Elements per rank.
    pub count: u64,
    /// This rank's table of every rank's slot base.
    pub table: u64,
    /// This rank's epoch word.
    pub epoch: u64,
    /// LL lines per sender and parity.
    pub lines: u64,
}

impl World {
    /// Largest AllReduce payload per rank, bytes, the one-step LL path
    /// serves here (0: none): not in relaunch mode (whose kernels never
    /// wait for a peer, which the path must), at most [`MAX_OPERANDS`]
    /// ranks (its reduction's sources), `WorldConfig::ll1_bytes` rounded
    /// down to what the slots hold (`ll1_slots::SLOT_BUDGET`).
    pub fn oneshot_ll_bytes(&self) -> usize {
        if self.cfg.relaunch || self.ranks.len() > MAX_OPERANDS {
            return 0;
        }
        let lines = slot_lines(self.cfg.ll1_bytes, self.ranks.len());
        self.cfg.ll1_bytes.min((lines * 8) as usize)
    }

    /// AllReduce calls run on the one-step LL path so far (this
    /// process's ranks together).
    pub fn oneshot_ll_calls(&self) -> u64 {
        self.ll1_calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The launch of `rp`, an AllReduce plan of `count` elements of
    /// `elem_size` bytes, on the path, or `None` where the path does not
    /// serve it (the plan then runs as it is). Makes the clique's slots
    /// on first use.
    pub(super) fn oneshot_ll_for(
        &self,
        rp: &RankPlan,
        count: usize,
        elem_size: usize,
    ) -> Result<Option<Ll1Launch>> {
        let fits = count
            .checked_mul(elem_size)
            .is_some_and(|b| b <= self.oneshot_ll_bytes());
        // The kernel takes the input and the output as buffers 0 and 1,
        // as every collective plan declares them.
        let roles = rp.bufs.len() >= 2
            && rp.bufs[0].role == BufRole::Input
            && rp.bufs[1].role == BufRole::Output;
        if !fits || !roles || rp.nranks != self.nranks() {
            return Ok(None);
        }
        let mem = self.ll1_mem()?;
        let r = rp.rank as usize;
        let (table, epoch) = (mem.tables[r], mem.epochs[r]);
        if table == 0 || epoch == 0 {
            return Err(CudaError::Invalid(format!(
                "rank {r} is not driven by this process"
            )));
        }
        Ok(Some(Ll1Launch {
            count: count as u64,
            table,
            epoch,
            lines: mem.lines,
        }))
    }

    /// The clique's slots, made by the first caller (prepare runs before
    /// any rank launches the plan, so no kernel is running on them).
    fn ll1_mem(&self) -> Result<Arc<Ll1Mem>> {
        let mut held = lock(&self.ll1);
        if let Some(m) = held.as_ref() {
            return Ok(m.clone());
        }
        let n = self.nranks() as usize;
        let lines = slot_lines(self.cfg.ll1_bytes, n).max(1);
        let m = match &self.shared {
            Some(s) => self.ll1_in_arenas(s, n)?,
            None => self.ll1_allocated(n, lines)?,
        };
        let m = Arc::new(m);
        *held = Some(m.clone());
        Ok(m)
    }

    /// Ranks as threads: each rank's slots and epoch in its device's
    /// memory, allocated now, zeroed.
    fn ll1_allocated(&self, n: usize, lines: u64) -> Result<Ll1Mem> {
        let slot_bytes = usize::try_from(slot_bytes(n, lines))
            .map_err(|_| CudaError::Invalid("one-step LL slots too large".into()))?;
        let mut slots = Vec::with_capacity(n);
        let mut epochs = Vec::with_capacity(n);
        for r in 0..n as u32 {
            let dev = self.dev(r)?;
            slots.push(DevMem::zeroed(&dev.ctx, slot_bytes)?);
            epochs.push(DevMem::zeroed(&dev.ctx, 8)?);
        }
        let bases: Vec<u64> = slots.iter().map(|m| m.ptr).collect();
        let mut tables = Vec::with_capacity(n);
        for r in 0..n as u32 {
            tables.push(self.ll1_table(r, &bases)?);
        }
        Ok(Ll1Mem {
            lines,
            epochs: epochs.iter().map(|m| m.ptr).collect(),
            tables: tables.iter().map(|m| m.ptr).collect(),
            _held: slots.into_iter().chain(epochs).chain(tables).collect(),
        })
    }

    /// Ranks as processes: every rank's slots lie in its link arena,
    /// mapped here at creation; only this process's rank gets a table.
    fn ll1_in_arenas(&self, s: &super::procs::SharedLinks, n: usize) -> Result<Ll1Mem> {
        let (me, Some(ll1)) = (s.me, s.ll1) else {
            return Err(CudaError::Invalid(
                "the link arenas hold no one-step LL slots".into(),
            ));
        };
        let bases: Vec<u64> = (0..n as u32).map(|r| s.arena(r) + ll1.slots_at).collect();
        let table = self.ll1_table(me, &bases)?;
        let mut epochs = vec![0; n];
        let mut tables = vec![0; n];
        epochs[me as usize] = s.arena(me) + ll1.epoch_at;
        tables[me as usize] = table.ptr;
        Ok(Ll1Mem {
            lines: ll1.lines,
            epochs,
            tables,
            _held: vec![table],
        })
    }

    /// Rank `r`'s table of every rank's slot base, in its device's memory.
    fn ll1_table(&self, r: u32, bases: &[u64]) -> Result<DevMem> {
        let dev = self.dev(r)?;
        let bytes: Vec<u8> = bases.iter().flat_map(|b| b.to_le_bytes()).collect();
        let t = DevMem::zeroed(&dev.ctx, bytes.len())?;
        // SAFETY: `t` holds `bytes.len()` bytes; the setup stream waits
        // for no rank's kernel.
        unsafe { dev.setup.write_sync(t.ptr, &bytes)? };
        Ok(t)
    }
}
