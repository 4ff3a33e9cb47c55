//! The host backend's error type.

use oxccl_core::plan::Rank;
use oxccl_core::WaitFault;
use thiserror::Error;

/// Everything that can go wrong in oxccl-host.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum HostError {
    /// A wait outlived [`crate::HostConfig::deadline`] (the fault's cause
    /// is [`oxccl_core::FaultCause::Deadline`]). The fabric is failed from
    /// then on. The fault's `absent` lists the ranks that had not even
    /// started this call when the deadline expired: usually the real
    /// culprits, several hops up the chain of waits.
    #[error("{0}; the communicator is unusable: rebuild it")]
    Deadline(WaitFault),
    /// [`crate::HostFabric::abort`] was called; `why` says by whom and
    /// why.
    #[error("rank {rank}: the communicator was aborted ({why}); rebuild it")]
    Aborted { rank: Rank, why: String },
    /// The fabric failed earlier (or a peer's failure stopped this call).
    #[error("{0}")]
    Failed(String),
    /// The plan or the buffers do not fit this fabric; nothing was run.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// A peer's process exited or was killed (ranks in several processes):
    /// the fabric is failed from then on.
    #[error("rank {rank}: peer rank {peer} (pid {pid}) exited or was killed; the communicator is unusable: rebuild it")]
    PeerLost { rank: Rank, peer: Rank, pid: u32 },
    /// The network connection to peer `peer` failed (ranks over the
    /// network): its process exited or was killed, its communicator failed,
    /// or the connection broke. `channel` and `step` are where this rank
    /// was waiting. The fabric is failed from then on.
    #[error("rank {rank}: channel {channel} step {step}: peer rank {peer} is lost: {detail}; the communicator is unusable: rebuild it")]
    NetLost {
        rank: Rank,
        peer: Rank,
        channel: usize,
        step: usize,
        detail: String,
    },
    /// Setting up the network transport failed.
    #[error("network: {0}")]
    Net(String),
    /// Setting up or using shared memory between processes failed.
    #[error("shared memory: {0}")]
    Shm(String),
    /// The bootstrap failed while the fabric was being set up.
    #[error(transparent)]
    Bootstrap(#[from] oxccl_bootstrap::BootstrapError),
    /// A peer's shared memory (ranks as processes of one host) holds
    /// what no honest peer writes: an offset, length, index or counter out
    /// of range, or a segment of the wrong size or kind. The peer's
    /// process is corrupt or hostile; nothing was read or written through
    /// the bad value. The fabric is failed from then on.
    #[error("rank {rank}: peer rank {peer}'s shared memory is corrupt: {detail}; the communicator is unusable: rebuild it")]
    Corrupt {
        rank: Rank,
        peer: Rank,
        detail: String,
    },
    /// Ranks disagree at run time (a message of the wrong length, a remote
    /// access to a peer that is in another call): the calls or plans of the
    /// ranks do not match. The fabric is failed from then on.
    #[error("rank {rank}: channel {channel} step {step}: {detail} (peer {peer}); the communicator is unusable: rebuild it")]
    Mismatch {
        rank: Rank,
        peer: Rank,
        channel: usize,
        step: usize,
        detail: String,
    },
}
