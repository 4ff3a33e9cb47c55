//! The bootstrap's error type.

use std::time::Duration;

use thiserror::Error;

use crate::env::BadVar;

/// What can be wrong with bytes read from a connection (the bootstrap's,
/// or the network transport's). Every malformed input maps to one of
/// these; none panics.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The bytes do not start with this communicator's magic: a stranger,
    /// garbage, or a rank of another communicator (another unique id).
    #[error("wrong magic {got:#018x} (expected {expected:#018x}): the peer belongs to another communicator, or is not oxccl")]
    WrongMagic { expected: u64, got: u64 },
    /// The connection ended, or the bytes ran out, inside `what`.
    #[error("truncated {what}: {got} of {want} bytes")]
    Truncated {
        what: &'static str,
        got: usize,
        want: usize,
    },
    /// A frame announces more payload than the bootstrap ever sends.
    #[error("oversized frame: {len} bytes announced, at most {max} allowed")]
    Oversized { len: usize, max: usize },
    /// A frame kind this version does not know, or not the one expected here.
    #[error("unexpected frame kind {got} (expected {expected})")]
    BadKind { got: u8, expected: &'static str },
    /// A hello or an answer that does not prove knowledge of the
    /// communicator's key: a stranger, or a peer holding another id.
    #[error("{what} does not prove knowledge of the communicator's key (a stranger, or another unique id)")]
    BadProof { what: &'static str },
    /// A payload whose fields do not parse.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

/// Everything that can go wrong in oxccl-bootstrap.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BootstrapError {
    /// A bad argument: rank out of range, zero ranks, a record too large.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// 128 bytes that are not a unique id (unknown family, reserved bytes set).
    #[error("invalid unique id: {0}")]
    InvalidId(String),
    /// A bad environment variable.
    #[error(transparent)]
    Config(#[from] BadVar),
    /// No network interface matches `NCCL_SOCKET_IFNAME`/`NCCL_SOCKET_FAMILY`.
    #[error("no usable network interface: {0}")]
    NoInterface(String),
    /// A system call failed.
    #[error("rank {rank}: {what}: {detail}")]
    Io {
        rank: u32,
        what: String,
        detail: String,
    },
    /// A wait ran past the bootstrap deadline.
    #[error("rank {rank}: bootstrap deadline of {limit:?} expired waiting for {waiting_for}")]
    Timeout {
        rank: u32,
        waiting_for: String,
        limit: Duration,
    },
    /// A peer sent bytes that do not parse.
    #[error("rank {rank}: bad message from {from}: {err}")]
    Wire {
        rank: u32,
        from: String,
        err: WireError,
    },
    /// The root refused the rendezvous (duplicate rank, rank counts that
    /// disagree, a rank out of range, a wrong magic).
    #[error("rank {rank}: the root refused the rendezvous: {reason}")]
    Rejected { rank: u32, reason: String },
    /// A peer's connection closed or failed: its process exited or was killed.
    #[error("rank {rank}: lost peer rank {peer}: {detail}")]
    PeerLost {
        rank: u32,
        peer: u32,
        detail: String,
    },
    /// Ranks disagree (e.g. different record counts in a collective call).
    #[error("rank {rank}: {detail}")]
    Mismatch { rank: u32, detail: String },
}

impl BootstrapError {
    pub(crate) fn io(rank: u32, what: impl Into<String>, e: &std::io::Error) -> Self {
        BootstrapError::Io {
            rank,
            what: what.into(),
            detail: e.to_string(),
        }
    }
}
