//! Relaunch mode (`OXCCL_RELAUNCH=1`): no kernel ever waits for another.
//!
//! The executor's blocks spin on their peers' signals and messages, so
//! every kernel of a call must run at once. Tools that run kernels one at
//! a time (compute-sanitizer's memcheck, racecheck and synccheck serialise
//! them) then leave the first kernel spinning for a peer that cannot start
//! until it ends, and the call ends at the deadline.
//!
//! In this mode a block never waits. Where a step needs what a peer has
//! not yet done (a signal, a message, a free slot, an LL line), the block
//! checks before the step has any effect, writes the step and the peer it
//! needs into its channel's progress record (host-mapped) and returns;
//! signals already sent stay sent, and a run of waits is consumed only
//! when all of them are ready. The host waits for the launch, reads the
//! records, and launches the same plan again, each block resuming at its
//! step, until every channel is done: every kernel ends on its own, in any
//! order the tool runs them, and peers' relaunches make the progress a
//! spinning kernel would have waited for. The results are the same bits:
//! the same steps run, in the same order per channel.
//!
//! What it costs: a call is synchronous (its launch returns once the plan
//! has run on this rank) and takes as many launches as its longest chain
//! of waits, so it is for checking, not for speed. A launch inside CUDA
//! graph capture is refused (the host must wait between launches), and
//! copy-engine calls run on the executor (their streams wait on each
//! other). The host's wait is bounded by the configured deadline, which
//! names the channel, step and peer still awaited, and ends on abort or a
//! peer's failure.

use std::time::{Duration, Instant};

use oxccl_core::{Awaited, FaultCause, WaitFault};

use crate::driver::Function;
use crate::error::{CudaError, Result};
use crate::layout::{OxChan, OxDesc, MAX_CHANNELS, PROGRESS_WORDS};

use super::failure::W_ABORT;
use super::World;

/// Bytes of a rank's progress records: one per channel.
pub(super) const PROGRESS_BYTES: usize = MAX_CHANNELS * PROGRESS_WORDS * 4;

/// Longest pause between launches that made no progress (a peer's thread
/// has yet to launch its part).
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// Where one channel stopped: its next step, and whom it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stop {
    step: u32,
    peer: u32,
    awaited: u32,
}

impl World {
    /// Relaunch mode: resets `rank`'s progress records, so the next launch
    /// starts every channel at its first step. The rank's earlier launches
    /// have all ended (each call waits for its own).
    pub(super) fn restart(&self, rank: u32) -> Result<u64> {
        let prog = self.progress(rank)?;
        for b in 0..MAX_CHANNELS {
            prog.store_u32(b * PROGRESS_WORDS, 0);
        }
        Ok(prog.dev_ptr)
    }

    fn progress(&self, rank: u32) -> Result<&crate::driver::HostMapped> {
        self.rank(rank)?
            .progress
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("relaunch mode is off".into()))
    }

    /// Relaunch mode: after the first launch of `d` (`f`, `nch` blocks of
    /// `threads` threads, one per channel) on `rank`'s stream, waits for it
    /// and launches it again until every channel has run its last step.
    ///
    /// # Safety
    /// As [`World::launch`]: `d` must describe a plan and buffers that stay
    /// valid until this returns.
    pub(super) unsafe fn relaunch_until_done(
        &self,
        rank: u32,
        f: &Function,
        d: &OxDesc,
        nch: u32,
        threads: u32,
    ) -> Result<()> {
        let st = self.rank(rank)?;
        let chans: &[OxChan] = &d.chans[..(nch as usize).min(MAX_CHANNELS)];
        let start = Instant::now();
        let mut before: Vec<Stop> = Vec::new();
        let mut pause = Duration::from_micros(1);
        loop {
            st.stream.synchronize()?;
            let now = self.stops(rank, chans.len())?;
            let left = now
                .iter()
                .zip(chans)
                .enumerate()
                .find(|(_, (s, c))| s.step < c.nsteps);
            let Some((channel, (stop, _))) = left else {
                return Ok(());
            };
            let waited = start.elapsed();
            // What a kernel's wait would have recorded, where it stopped.
            let fault = |cause| WaitFault {
                cause,
                rank,
                peer: stop.peer,
                channel: channel as u32,
                step: stop.step,
                awaited: Awaited::from_code(stop.awaited),
                waited,
                absent: Vec::new(),
            };
            if self.host_words.load_u32(W_ABORT) != 0 {
                return Err(CudaError::Wait(fault(FaultCause::Aborted)));
            }
            if self.failed() {
                return Err(self.failure().unwrap_or(CudaError::Aborted));
            }
            if waited > self.cfg.timeout {
                let fault = fault(FaultCause::Deadline);
                self.record_failure(rank, &fault)?;
                return Err(CudaError::Wait(fault));
            }
            if now == before {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            } else {
                pause = Duration::from_micros(1);
            }
            before = now;
            // SAFETY: the caller's contract, as for the first launch.
            unsafe { f.launch_smem(nch, threads, self.cfg.block_smem, &st.stream, d)? };
            self.kernel_launches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Where each of `rank`'s first `nch` channels stopped.
    fn stops(&self, rank: u32, nch: usize) -> Result<Vec<Stop>> {
        let prog = self.progress(rank)?;
        Ok((0..nch)
            .map(|b| Stop {
                step: prog.load_u32(b * PROGRESS_WORDS),
                peer: prog.load_u32(b * PROGRESS_WORDS + 1),
                awaited: prog.load_u32(b * PROGRESS_WORDS + 2),
            })
            .collect())
    }
}
