//! A rank's call that fails after its peers agreed on it, and the blame
//! their waits then carry: the clique fails naming that rank, the call
//! and the reason, and every peer's error names it
//! ([`Error::PeerFailed`]), in this process through the clique's note and
//! in others through the call board's record and the abort's reason.

use crate::comm::{own_fault, Blame, Clique, Communicator, AFTER_AGREEMENT};
use crate::error::Error;

impl Clique {
    /// `e`, a wait of rank `me` that a failure ended, as the failure of
    /// the peer to blame ([`Error::PeerFailed`]), where one failed its call
    /// after agreeing on it ([`Communicator::fail_agreed`]): named by its
    /// record on the board (any process) or the clique's note (this
    /// process); any other error as it is.
    pub(crate) fn blamed(&self, me: u32, e: Error) -> Error {
        let stopped = match &e {
            Error::Wait(f) => f.cause != oxccl_core::FaultCause::Deadline,
            Error::Aborted(_) | Error::Failed { .. } => true,
            _ => false,
        };
        if !stopped {
            return e;
        }
        // The board's record reaches ranks of other processes too; the
        // clique's own note serves unchecked calls in this process.
        if let Some(peer) = self.failed_after_agreement(me) {
            let cause = self
                .backend
                .failure()
                .map(|f| f.root_cause())
                .unwrap_or_default();
            let (call, reason) = cause
                .strip_prefix(&format!("rank {peer} failed "))
                .and_then(|rest| rest.split_once(AFTER_AGREEMENT))
                .map_or_else(
                    || {
                        (
                            "its call".to_string(),
                            crate::check::refusal::phrase(crate::check::refusal::AGREED)
                                .to_string(),
                        )
                    },
                    |(c, r)| (c.to_string(), r.to_string()),
                );
            return Error::PeerFailed {
                rank: me,
                peer,
                call,
                reason,
            };
        }
        match self.blame.lock().clone() {
            Some(b) if b.rank != me => Error::PeerFailed {
                rank: me,
                peer: b.rank,
                call: b.call,
                reason: b.reason,
            },
            _ => e,
        }
    }
}

impl Communicator {
    /// Fails this rank's call `call` after its peers agreed on it (its
    /// launch, its plan or its stream join failed here, with `e`; without
    /// the call check, after its peers may have launched it): the peers
    /// are then in the call's data waits, which only the clique's failure
    /// ends, so the clique fails now, naming this rank, the call and the
    /// reason. Ranks of this process then get
    /// [`Error::PeerFailed`] naming this rank (see [`Communicator::blamed`]);
    /// ranks in other processes an abort whose reason names it. Returns
    /// `e` (this rank's own error), or, when the clique had already
    /// failed, what that failure says of it.
    pub(crate) fn fail_agreed(&self, call: &str, e: Error) -> Error {
        if self.clique().backend.failure().is_some() || !own_fault(&e) {
            return self.blamed(e);
        }
        self.clique().blame.lock().get_or_insert_with(|| Blame {
            rank: self.rank(),
            call: call.to_string(),
            reason: e.to_string(),
        });
        tracing::warn!(rank = self.rank(), call, error = %e, "oxccl: a call its peers are committed to failed on this rank; failing the communicator so they stop waiting");
        // On the board first: a peer the abort wakes looks there.
        self.post_failed_after_agreement();
        let why = format!("rank {} failed {call}{AFTER_AGREEMENT}{e}", self.rank());
        self.clique().backend.abort(&why);
        self.clique().board.abort(self.rank());
        e
    }

    /// `e`, a wait of this rank that a failure ended, as the failure of
    /// the peer to blame ([`Error::PeerFailed`]), where one failed its call
    /// after agreeing on it ([`Communicator::fail_agreed`]); any other
    /// error as it is.
    pub(crate) fn blamed(&self, e: Error) -> Error {
        self.clique().blamed(self.rank(), e)
    }

    /// Aborts the clique after `what` failed on this rank, and passes the
    /// error on.
    pub(crate) fn fail(&self, what: &str, e: Error) -> Error {
        tracing::warn!(rank = self.rank(), error = %e, "oxccl: {what} failed; aborting the communicator");
        let why = format!("rank {}: {what} failed: {e}", self.rank());
        self.clique().backend.abort(&why);
        self.clique().board.abort(self.rank());
        e
    }
}
