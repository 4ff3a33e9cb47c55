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
//! without it.
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
//!   as a data wait's deadline fails it) and log a warning, naming the
//!   ranks not yet arrived, once a tenth of the deadline has passed.
//!
//! The exchange goes through [`Board`] (in one process: shared memory).
//! Records are plain words, so a multi-process clique can exchange the
//! same records over its bootstrap network.

mod board;
mod calls;
mod fingerprint;

pub(crate) use board::Board;
pub(crate) use calls::{CallSeq, Posted};
pub(crate) use fingerprint::Call;
