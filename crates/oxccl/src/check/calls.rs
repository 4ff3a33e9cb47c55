//! A communicator's side of the check: publish its call, read its peers',
//! and turn what differs into one error every rank agrees on.

use oxccl_core::DataType;

use super::board::{P2pOutcome, P2pRecord, WaitCtx};
use super::fingerprint::Call;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use oxccl_core::ranks_named;

/// The collective calls a communicator has published (its next call is
/// `seq + 1`). Held locked for the whole of a call, which is what orders
/// concurrent calls on one communicator.
#[derive(Debug, Default)]
pub(crate) struct CallSeq {
    pub seq: u64,
}

/// What every rank agreed on for a collective call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Agreed {
    /// Every rank's buffers are backend memory, so registered plans may be
    /// used (ranks passing a mix would otherwise run different plans).
    pub registered: bool,
}

/// A Send/Recv this rank posted in a group, waiting to be compared.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Posted {
    pub rec: P2pRecord,
    pub k: u64,
}

impl Communicator {
    /// Whether calls are compared at all (one rank has no peer).
    pub(crate) fn checking(&self) -> bool {
        self.nranks() > 1 && self.config().check_calls
    }

    fn wait_ctx<'a>(&self, failure: &'a dyn Fn() -> Option<Error>) -> WaitCtx<'a> {
        WaitCtx {
            rank: self.rank(),
            deadline: self.config().deadline_opt(),
            warn: self.config().wait_warn,
            failure,
        }
    }

    /// The clique's failure as this rank reports it.
    fn failure(&self) -> Option<Error> {
        self.clique().backend.failure().map(|e| Error::Failed {
            rank: self.rank(),
            cause: e.root_cause(),
        })
    }

    /// Publishes this rank's next collective call (without waiting), with
    /// whether its buffers are backend memory and its PreMulSum scalar
    /// (bits, or a digest of a group's; 0 without).
    pub(crate) fn publish_call(
        &self,
        seq: &mut CallSeq,
        call: Call,
        registered: bool,
        scalar: u64,
    ) {
        seq.seq += 1;
        let [a, b, c] = call.encode(registered);
        self.clique()
            .board
            .publish(self.rank(), seq.seq, [a, b, c, scalar]);
    }

    /// Waits for every rank's record of the call just published and
    /// compares them: the same call everywhere, or [`Error::Mismatch`]
    /// (the same on every rank). A wait past the deadline fails the clique.
    pub(crate) fn compare_call(&self, seq: &CallSeq, mine: Call) -> Result<Agreed> {
        let failure = || self.failure();
        let ctx = self.wait_ctx(&failure);
        let what = || format!("call #{} ({mine})", seq.seq);
        let words = self
            .clique()
            .board
            .gather(&ctx, seq.seq, &what)
            .map_err(|e| self.fail_on_wait(e))?;
        let mut registered = true;
        let scalar = words[0][3];
        // Every rank's call, compared with rank 0's; the groups of a
        // mismatch are only built when there is one (no allocation on
        // the path every agreeing call takes).
        let mut first = None;
        let mut agree = true;
        for (r, &w) in words.iter().enumerate() {
            // Registered direct plans scale a peer's input with the
            // reading rank's scalar: ranks with different PreMulSum
            // scalars (NCCL allows it) take FIFO plans, where each input
            // is scaled by its owner.
            registered &= w[3] == scalar;
            let (call, reg) = Call::decode([w[0], w[1], w[2]]).ok_or_else(|| {
                Error::Internal(format!(
                    "rank {r}'s record of call #{} is unreadable",
                    seq.seq
                ))
            })?;
            registered &= reg;
            if let Call::Refused { reason } = call {
                return Err(Error::PeerFailed {
                    rank: self.rank(),
                    peer: r as u32,
                    call: format!("call #{} ({mine})", seq.seq),
                    reason: super::refusal::phrase(reason).to_string(),
                });
            }
            agree &= *first.get_or_insert(call) == call;
        }
        if agree {
            tracing::trace!(
                rank = self.rank(),
                "oxccl: call #{} agreed on every rank: {mine}",
                seq.seq
            );
            return Ok(Agreed { registered });
        }
        let mut groups: Vec<(Call, Vec<u32>)> = Vec::new();
        for (r, w) in words.iter().enumerate() {
            // Every record decoded above.
            let Some((call, _)) = Call::decode([w[0], w[1], w[2]]) else {
                continue;
            };
            match groups.iter_mut().find(|(c, _)| *c == call) {
                Some((_, ranks)) => ranks.push(r as u32),
                None => groups.push((call, vec![r as u32])),
            }
        }
        let detail = groups
            .iter()
            .map(|(c, ranks)| format!("{}: {c}", ranks_named(ranks)))
            .collect::<Vec<_>>()
            .join("; ");
        Err(Error::Mismatch {
            rank: self.rank(),
            detail: format!("call #{}: {detail}", seq.seq),
        })
    }

    /// Passes on `e`, this rank's refusal of its next collective call,
    /// after posting it in the call's place so the peers' matching calls
    /// fail at once naming this rank (when calls are checked and `e` is a
    /// refusal of the arguments).
    pub(crate) fn refuse_call(&self, e: Error) -> Error {
        if super::refusal::is_refusal(&e) {
            self.post_refusal(super::refusal::code(&e));
        }
        e
    }

    /// Tells the peers that this rank's next collective call was refused
    /// for its arguments by a layer above this crate (the C ABI's own
    /// checks), so their matching calls fail at once naming this rank
    /// ([`Error::PeerFailed`]) instead of waiting for it: a call made
    /// alone, or every communicator of a group that holds a refused call
    /// (see [`crate::Group::end`]). Does nothing when calls are not checked.
    pub fn refused_call(&self) {
        self.post_refusal(super::refusal::ARGUMENTS);
    }

    /// The reason `peer` posted a refusal as its call `seq`, if it did.
    fn refusal_of(&self, peer: u32, seq: u64) -> Option<String> {
        let w = self.clique().board.record(peer, seq)?;
        match Call::decode([w[0], w[1], w[2]])?.0 {
            Call::Refused { reason } => Some(super::refusal::phrase(reason).to_string()),
            _ => None,
        }
    }

    /// Posts a refusal, with the code of its reason, as this rank's next
    /// collective call (when calls are checked).
    pub(crate) fn post_refusal(&self, reason: u8) {
        if self.checking() {
            let mut seq = self.call_lock();
            self.publish_call(&mut seq, Call::Refused { reason }, false, 0);
        }
    }

    /// Posts, in place of this rank's next collective call, that its call
    /// failed after every rank agreed on it ([`Communicator::fail_agreed`]):
    /// peers that reach their next call fail naming this rank, and peers
    /// whose waits the failure ended find whom to blame
    /// ([`crate::comm::Clique::failed_after_agreement`]), in this process or
    /// another. Does nothing when calls are not checked.
    pub(crate) fn post_failed_after_agreement(&self) {
        if !self.checking() {
            return;
        }
        let board = &self.clique().board;
        let seq = board.published(self.rank()) + 1;
        let [a, b, c] = Call::Refused {
            reason: super::refusal::AGREED,
        }
        .encode(false);
        board.publish(self.rank(), seq, [a, b, c, 0]);
    }

    /// Publishes and compares a single collective (or barrier) call.
    pub(crate) fn agree(
        &self,
        seq: &mut CallSeq,
        call: Call,
        registered: bool,
        scalar: u64,
    ) -> Result<Agreed> {
        self.publish_call(seq, call, registered, scalar);
        self.compare_call(seq, call)
    }

    /// Posts one Send/Recv of a group (before any of them is compared, so
    /// ranks exchanging both ways never wait on each other's posting);
    /// `direct`: a send's buffer id where its receiver is to read it
    /// directly.
    pub(crate) fn post_p2p(
        &self,
        peer: u32,
        send: bool,
        count: usize,
        dtype: DataType,
        direct: Option<u16>,
    ) -> Posted {
        let rec = P2pRecord {
            peer,
            send,
            count,
            dtype,
            direct,
        };
        let k = self.clique().board.post(self.rank(), rec);
        Posted { rec, k }
    }

    /// Compares every posted Send/Recv with its other side. On any
    /// difference this rank's unmatched records are withdrawn and the
    /// group fails; a peer that entered a collective instead of posting
    /// the other side gets that collective poisoned, so it fails too.
    /// Where the group also has a peer none of whose pairs failed, that
    /// peer would wait for data that never comes, so the communicator
    /// fails (aborted, naming this rank) rather than leave it to its
    /// deadline; a group whose every peer sees a failing pair keeps the
    /// communicator usable.
    /// Returns, per posted record, the other side's direct buffer id.
    pub(crate) fn compare_p2p(
        &self,
        seq: &mut CallSeq,
        posted: &[Posted],
    ) -> Result<Vec<Option<u16>>> {
        let mut theirs = Vec::with_capacity(posted.len());
        let failure = || self.failure();
        let ctx = self.wait_ctx(&failure);
        let board = &self.clique().board;
        let mut problem: Option<(Error, Option<Call>)> = None;
        // Peers that see this group fail on their own side of a pair.
        let mut failing = Vec::new();
        for p in posted {
            let r = p.rec;
            let outcome = board
                .await_p2p(&ctx, r, p.k, seq.seq)
                .map_err(|e| self.fail_on_wait(e))?;
            let (verb, dir, other) = if r.send {
                ("sends", "to", "receives")
            } else {
                ("receives", "from", "sends")
            };
            let me = self.rank();
            match outcome {
                P2pOutcome::Matched { direct } => theirs.push(direct),
                P2pOutcome::Differs { count, dtype } => {
                    failing.push(r.peer);
                    problem.get_or_insert((
                        Error::Mismatch {
                            rank: me,
                            detail: format!(
                                "rank {me} {verb} {} x {} {dir} rank {} (its message #{} on that pair) but rank {} {other} {count} x {dtype}; nothing was sent",
                                r.count, r.dtype, r.peer, p.k, r.peer
                            ),
                        },
                        None,
                    ));
                }
                P2pOutcome::PeerMovedOn { seq: at } => {
                    failing.push(r.peer);
                    let blocked = Call::Blocked {
                        peer: r.peer,
                        send: r.send,
                        count: r.count as u64,
                        dtype: r.dtype,
                    };
                    // A peer whose group was refused posted that in place
                    // of the call after this rank's last: name it and the
                    // reason (it may have gone on to later calls since).
                    let err = match self.refusal_of(r.peer, seq.seq + 1) {
                        Some(reason) => Error::PeerFailed {
                            rank: me,
                            peer: r.peer,
                            call: format!(
                                "its group with the {} matching this rank's {} x {}",
                                if r.send { "recv" } else { "send" },
                                r.count,
                                r.dtype
                            ),
                            reason,
                        },
                        None => Error::Mismatch {
                            rank: me,
                            detail: format!(
                                "rank {me} {verb} {} x {} {dir} rank {}, but rank {} entered collective call #{at} without the matching {}; nothing was sent",
                                r.count, r.dtype, r.peer, r.peer,
                                if r.send { "recv" } else { "send" }
                            ),
                        },
                    };
                    problem = Some((err, Some(blocked)));
                    break;
                }
            }
        }
        let Some((err, poison)) = problem else {
            return Ok(theirs);
        };
        self.withdraw_p2p(posted);
        if let Some(call) = poison {
            self.publish_call(seq, call, false, 0);
        }
        if posted.iter().any(|p| !failing.contains(&p.rec.peer)) {
            // A peer with no failing pair in this group passed its check
            // (or will post and wait for a side now withdrawn) and would
            // wait for data this rank never moves: only the communicator's
            // failure reaches it before its deadline.
            return Err(self.fail("a Send/Recv group whose other pairs matched", err));
        }
        Err(err)
    }

    /// Withdraws this rank's records that no peer matched yet (its group
    /// failed before any data moved), last first.
    pub(crate) fn withdraw_p2p(&self, posted: &[Posted]) {
        for p in posted.iter().rev() {
            self.clique().board.withdraw(self.rank(), p.rec, p.k);
        }
    }

    /// A wait that ended without an answer: past its deadline the clique
    /// fails (peers may be mid-call); the clique's own failure passes on.
    fn fail_on_wait(&self, e: Error) -> Error {
        match e {
            e @ Error::Timeout(_) => self.fail("waiting for peers' calls", e),
            e => e,
        }
    }
}

impl crate::comm::Clique {
    /// The peer of `me` whose latest record on the board says its call
    /// failed after every rank agreed on it, if one's does.
    pub(crate) fn failed_after_agreement(&self, me: u32) -> Option<u32> {
        if !(self.nranks > 1 && self.config.check_calls) {
            return None;
        }
        let board = &self.board;
        let failed = Call::Refused {
            reason: super::refusal::AGREED,
        };
        (0..self.nranks).filter(|&r| r != me).find(|&r| {
            let seq = board.published(r);
            seq > 0
                && board
                    .record(r, seq)
                    .and_then(|w| Call::decode([w[0], w[1], w[2]]))
                    .is_some_and(|(c, _)| c == failed)
        })
    }
}
