//! Device-side failures: each rank's error record, the host's abort flag
//! and the clique's failure word, read back as [`CudaError`]s.

use crate::error::{CudaError, Result};
use crate::layout::{OxError, E_ABORTED, E_PEER_FAILED, E_TIMEOUT};

use super::World;

pub(super) const ERR_BYTES: usize = std::mem::size_of::<OxError>();
/// Host-mapped words: the host's abort flag and the clique's failure word.
pub(super) const W_ABORT: usize = 0;
pub(super) const W_FAIL: usize = 1;

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

    /// The failure `rank` recorded, if any (reads its error record without
    /// waiting for its kernels).
    pub fn rank_failure(&self, rank: u32) -> Result<Option<CudaError>> {
        Ok(self.rank_record(rank)?.map(|(_, e)| e))
    }

    /// `rank`'s error record: the device error code and its error.
    fn rank_record(&self, rank: u32) -> Result<Option<(u32, CudaError)>> {
        let st = self.rank(rank)?;
        let dev = self.dev(rank)?;
        let mut rec = [0u8; ERR_BYTES];
        // SAFETY: `err` holds ERR_BYTES bytes.
        unsafe { dev.setup.read_sync(st.err.ptr, &mut rec)? };
        let r = OxError::from_le_bytes(&rec);
        let waited_ms = r.waited_ns / 1_000_000;
        let (rank, peer, channel, step) = (r.rank, r.peer, r.channel, r.step);
        let aborted = |why| CudaError::Aborted {
            rank,
            peer,
            channel,
            step,
            why,
        };
        let e = match r.code {
            0 => return Ok(None),
            E_TIMEOUT => CudaError::Timeout {
                rank,
                peer,
                channel,
                step,
                waited_ms,
            },
            E_ABORTED => aborted("the communicator was aborted"),
            E_PEER_FAILED => aborted("another rank failed"),
            other => CudaError::Invalid(format!("unknown device error code {other}")),
        };
        Ok(Some((r.code, e)))
    }

    /// The first failure of any rank: a timeout, else an abort the host
    /// asked for, in preference to the "another rank failed" they cause on
    /// every other rank; among equals, the lowest rank.
    pub fn failure(&self) -> Option<CudaError> {
        if !self.failed() {
            return None;
        }
        let cause = |code: u32| match code {
            E_TIMEOUT => 0,
            E_ABORTED => 1,
            _ => 2,
        };
        (0..self.nranks())
            .filter_map(|r| self.rank_record(r).ok().flatten())
            .min_by_key(|(code, _)| cause(*code))
            .map(|(_, e)| e)
            .or(Some(CudaError::Aborted {
                rank: 0,
                peer: 0,
                channel: 0,
                step: 0,
                why: "the communicator was aborted",
            }))
    }
}
