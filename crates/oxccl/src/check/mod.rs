//! Call fingerprints: every rank's call is compared with its peers' before
//! any data moves, so calls that do not match (another collective, count,
//! type, op or root; a Send whose Recv has another count, or none) are an
//! error on every rank involved instead of a hang or wrong results.
//!
//! NCCL has no such check (mismatched calls hang or corrupt memory) and
//! PyTorch has one only in debug mode. Here it is on by default
//! ([`crate::Config::check_calls`]): a collective publishes one small
//! record (four words) and reads its peers' records, which on one process
//! is a few cache-line reads once every rank has arrived; on CUDA the
//! check runs on the host before the launch, so a captured graph replays
//! without it. Across processes it is one more rendezvous per call (see
//! `docs/perf/LOG.md`, "The call check").
//!
//! - Collectives (and groups holding collectives) carry a per-communicator
//!   sequence number; each rank publishes `(seq, fingerprint)` and waits
//!   until every rank published the same `seq`, then compares them all.
//!   Every rank sees the same records, so every rank returns the same
//!   [`crate::Error::Mismatch`], and the call runs nowhere. The
//!   communicator stays usable (the sequence moved on alike everywhere).
//! - Send/Recv are matched per ordered pair: the k-th send from a to b
//!   against the k-th receive on b from a; a count or type difference is
//!   one error on both sides. A rank waiting for the other side of a
//!   Send/Recv while that peer has already entered a collective this rank
//!   has not reached (a deadlock: the peer needs this rank there) gives up
//!   at once and poisons that collective, so the peer's collective fails
//!   too, naming the unmatched operation, and no message ever reaches the
//!   next collective.
//! - Waits are bounded by the configured deadline (then the clique fails,
//!   as a data wait's deadline fails it) and warn on stderr, with or
//!   without logging, naming the ranks not yet arrived and the call, after
//!   `Config::wait_warn`'s first period and then every period. A rank
//!   whose call fails validation publishes a refusal in its place
//!   (`refusal.rs`): the peers fail at once, naming it. In a group, the
//!   refusal of any of its operations takes the place of the group's call
//!   on each of its communicators; a peer waiting on a Send/Recv of that
//!   rank finds it in place of the call after its own last. Among
//!   threads, both say how ranks of one process must call (the usual cause
//!   is one thread calling every rank in turn). A wait for a rank whose
//!   communicator was destroyed or dropped fails at once, naming it, among
//!   threads and across processes (a "gone" word per rank of the board).
//!   A rank whose call fails after every rank agreed on it (its launch, its
//!   plan, joining the caller's streams) posts that in place of its next
//!   call before failing the clique, so peers whose data waits the failure
//!   ends name it ([`crate::Error::PeerFailed`]), in any process.
//!
//! The exchange goes through [`Board`]. Ranks as threads keep it in this
//! process's memory. Ranks as processes of one host (the host backend
//! across processes, CUDA's `cuda_procs` and `cuda_staged`) keep the same
//! records in one shared region rank 0 makes at init (`shared.rs`, an
//! unnamed `memfd`: nothing is left behind): the same collective slots,
//! a fixed ring of 64 open messages per ordered pair for Send/Recv (a
//! group with more waits in its process until earlier ones are compared),
//! futex sleeps, and a pidfd watcher, so a wait for a rank whose process
//! died ends at once naming it (and pid), as does a peer's abort. Ranks
//! check only if every rank asked for it (a rank with
//! `OXCCL_CHECK_CALLS=0` turns it off for all, with a warning).
//!
//! Ranks that talk over the network (on different hosts, as
//! `NCCL_HOSTID` stands in for, or forced by `NCCL_P2P_DISABLE=1
//! NCCL_SHM_DISABLE=1`) check only if every rank sets
//! `OXCCL_CHECK_CALLS=all` ([`crate::Config::check_calls_across_hosts`]):
//! each rank then keeps its own copy of the board, and sends what it
//! publishes, posts, withdraws, or an abort or departure, over one TCP
//! connection per pair of ranks made at init (`mirror.rs`); a closed
//! connection names its peer. It costs n − 1 small messages per rank and
//! collective, so it is off there by default (said once at init), and
//! mismatched calls there fail in the data path or at the deadline.

#[doc(hidden)]
pub mod bench;
mod board;
mod calls;
mod fingerprint;
pub(crate) mod fuzz;
mod mirror;
mod records;
pub(crate) mod refusal;
mod shared;

pub(crate) use board::Board;
pub(crate) use calls::{CallSeq, Posted};
pub(crate) use fingerprint::Call;
pub(crate) use shared::{agree_on_check, CheckMode};
