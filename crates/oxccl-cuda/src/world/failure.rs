//! Device-side failures: each rank's error record, the host's abort flag
//! and the clique's failure word, read back as [`CudaError`]s.

use std::time::Duration;

use oxccl_core::{Awaited, FaultCause, WaitFault};

use crate::error::{CudaError, Result};
use crate::layout::{OxError, E_ABORTED, E_PEER_FAILED, E_TIMEOUT, E_UNMAPPED};

use super::World;

pub(super) const ERR_BYTES: usize = std::mem::size_of::<OxError>();
/// Host-mapped words: the host's abort flag and the clique's failure word.
pub(super) const W_ABORT: usize = 0;
pub(super) const W_FAIL: usize = 1;

/// The error record's code for a wait that ended for `cause` (the codes
/// the kernels write, `kernels/oxccl_exec.cuh`).
fn cause_code(cause: FaultCause) -> u32 {
    match cause {
        FaultCause::Deadline => E_TIMEOUT,
        FaultCause::Aborted => E_ABORTED,
        FaultCause::PeerFailed => E_PEER_FAILED,
    }
}

/// The cause an error record's `code` names, if it names a wait's end.
fn code_cause(code: u32) -> Option<FaultCause> {
    match code {
        E_TIMEOUT => Some(FaultCause::Deadline),
        E_ABORTED => Some(FaultCause::Aborted),
        E_PEER_FAILED => Some(FaultCause::PeerFailed),
        _ => None,
    }
}

impl World {
    /// Waits for the rank's stream and reports a device-side failure.
    pub fn synchronize(&self, rank: u32) -> Result<()> {
        let st = self.rank(rank)?;
        st.stream.synchronize()?;
        match self.rank_failure(rank)? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes every pending and future device-side wait fail promptly.
    pub fn abort(&self) {
        self.host_words.store_u32(W_ABORT, 1);
    }

    /// Whether any rank recorded a failure (cheap: one host-memory read).
    pub fn failed(&self) -> bool {
        self.host_words.load_u32(W_FAIL) != 0 || self.host_words.load_u32(W_ABORT) != 0
    }

    /// Records `fault` as `rank`'s failure, as its kernel would have (its
    /// error record, with the code of the fault's cause, then the world's
    /// failure word), so peers stop and name it: relaunch mode's host-side
    /// deadline.
    pub(super) fn record_failure(&self, rank: u32, fault: &WaitFault) -> Result<()> {
        let st = self.rank(rank)?;
        let dev = self.dev(rank)?;
        let rec = OxError {
            code: cause_code(fault.cause),
            rank,
            peer: fault.peer,
            channel: fault.channel,
            step: fault.step,
            awaited: fault.awaited.code(),
            waited_ns: u64::try_from(fault.waited.as_nanos()).unwrap_or(u64::MAX),
        };
        // SAFETY: `err` holds ERR_BYTES bytes, the size of the record.
        unsafe { dev.setup.write_sync(st.err.ptr, &rec.to_le_bytes())? };
        self.host_words.store_u32(W_FAIL, 1);
        Ok(())
    }

    /// The failure `rank` recorded, if any (reads its error record without
    /// waiting for its kernels).
    pub fn rank_failure(&self, rank: u32) -> Result<Option<CudaError>> {
        Ok(self.rank_record(rank)?.map(CudaError::Wait))
    }

    /// `rank`'s error record, as the fault it describes.
    fn rank_record(&self, rank: u32) -> Result<Option<WaitFault>> {
        let st = self.rank(rank)?;
        let dev = self.dev(rank)?;
        let mut rec = [0u8; ERR_BYTES];
        // SAFETY: `err` holds ERR_BYTES bytes.
        unsafe { dev.setup.read_sync(st.err.ptr, &mut rec)? };
        let r = OxError::from_le_bytes(&rec);
        let cause = match (r.code, code_cause(r.code)) {
            (0, _) => return Ok(None),
            (_, Some(cause)) => cause,
            (E_UNMAPPED, None) => {
                return Err(CudaError::Invalid(format!(
                    "rank {} (channel {}, step {}) could not reach a buffer of rank {}: its \
                     allocation was not mapped into this process (see the earlier warning \
                     on opening it)",
                    r.rank, r.channel, r.step, r.peer
                )))
            }
            (other, None) => {
                return Err(CudaError::Invalid(format!(
                    "unknown device error code {other}"
                )))
            }
        };
        Ok(Some(WaitFault {
            cause,
            rank: r.rank,
            peer: r.peer,
            channel: r.channel,
            step: r.step,
            awaited: Awaited::from_code(r.awaited),
            waited: Duration::from_nanos(r.waited_ns),
            absent: Vec::new(),
        }))
    }

    /// The first failure of any rank: a timeout, else an abort the host
    /// asked for, in preference to the "another rank failed" they cause on
    /// every other rank; among equals, the lowest rank.
    pub fn failure(&self) -> Option<CudaError> {
        if !self.failed() {
            return None;
        }
        Some(
            (0..self.nranks())
                .filter_map(|r| self.rank_record(r).ok().flatten())
                .min_by_key(WaitFault::severity)
                .map_or(CudaError::Aborted, CudaError::Wait),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_cause_reads_back_as_itself() {
        for cause in [
            FaultCause::Deadline,
            FaultCause::Aborted,
            FaultCause::PeerFailed,
        ] {
            assert_eq!(code_cause(cause_code(cause)), Some(cause));
        }
        assert_eq!(code_cause(0), None);
        assert_eq!(code_cause(E_UNMAPPED), None);
    }
}
