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
//! Ranks as threads of this process only: ranks as processes would map
//! the slots through the window export of `exports`; their calls run the
//! FIFO one-shot plan instead.

use std::sync::Arc;

use oxccl_core::plan::{BufRole, RankPlan};

use crate::driver::DevMem;
use crate::error::{CudaError, Result};
use crate::layout::MAX_OPERANDS;

use super::{lock, World};

/// Every rank's slots, epoch and slot table, by rank.
#[derive(Debug)]
pub(super) struct Ll1Mem {
    /// LL lines per sender and parity.
    lines: u64,
    /// Held, never read here: the kernels address it through `tables`.
    _slots: Vec<DevMem>,
    epochs: Vec<DevMem>,
    tables: Vec<DevMem>,
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
    /// serves here (0: none): ranks as threads, not in relaunch mode
    /// (whose kernels never wait for a peer, which the path must), at
    /// most [`MAX_OPERANDS`] ranks (its reduction's sources).
    pub fn oneshot_ll_bytes(&self) -> usize {
        let usable =
            self.shared.is_none() && !self.cfg.relaunch && self.ranks.len() <= MAX_OPERANDS;
        if usable {
            self.cfg.ll1_bytes
        } else {
            0
        }
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
        Ok(Some(Ll1Launch {
            count: count as u64,
            table: mem.tables[r].ptr,
            epoch: mem.epochs[r].ptr,
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
        let lines = self.cfg.ll1_bytes.div_ceil(8).max(1) as u64;
        let slot_bytes = usize::try_from(2 * n as u64 * lines * 16)
            .map_err(|_| CudaError::Invalid("one-step LL slots too large".into()))?;
        let mut slots = Vec::with_capacity(n);
        let mut epochs = Vec::with_capacity(n);
        for r in 0..n as u32 {
            let dev = self.dev(r)?;
            slots.push(DevMem::zeroed(&dev.ctx, slot_bytes)?);
            epochs.push(DevMem::zeroed(&dev.ctx, 8)?);
        }
        let bases: Vec<u8> = slots.iter().flat_map(|m| m.ptr.to_le_bytes()).collect();
        let mut tables = Vec::with_capacity(n);
        for r in 0..n as u32 {
            let dev = self.dev(r)?;
            let t = DevMem::zeroed(&dev.ctx, bases.len())?;
            // SAFETY: `t` holds `bases.len()` bytes; the setup stream
            // waits for no rank's kernel.
            unsafe { dev.setup.write_sync(t.ptr, &bases)? };
            tables.push(t);
        }
        let m = Arc::new(Ll1Mem {
            lines,
            _slots: slots,
            epochs,
            tables,
        });
        *held = Some(m.clone());
        Ok(m)
    }
}
