//! The network transport's error type.

use std::time::Duration;

use oxccl_bootstrap::env::BadVar;
use thiserror::Error;

/// What can be wrong with bytes read from a network connection: the
/// bootstrap's type, whose `WrongMagic`, `Truncated` and `Malformed` the
/// transport uses. Every malformed input maps to one of these; none
/// panics.
pub use oxccl_bootstrap::WireError;

/// Everything that can go wrong in oxccl-net. `conn` names the connection
/// (local and remote address, socket index); the layer above adds the
/// rank, peer, channel and step it was serving.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NetError {
    /// A bad argument: a device out of range, a buffer outside its
    /// registration, a receive too small for the message that came.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The transport cannot do this (CUDA memory over TCP, say).
    #[error("the {net} transport does not support {what}")]
    Unsupported { net: &'static str, what: String },
    /// A bad environment variable.
    #[error(transparent)]
    Config(#[from] BadVar),
    /// No network interface to listen on.
    #[error("no usable network interface: {0}")]
    NoInterface(String),
    /// A handle that is not (or no longer) one of this transport's.
    #[error("unknown {kind} handle {id}")]
    BadHandle { kind: &'static str, id: u64 },
    /// A system call failed.
    #[error("{conn}: {what}: {detail}")]
    Io {
        conn: String,
        what: &'static str,
        detail: String,
    },
    /// The peer sent bytes that are not this protocol.
    #[error("{conn}: {err}")]
    Wire { conn: String, err: WireError },
    /// The peer closed the connection (its process exited, was killed, or
    /// its communicator failed or was aborted).
    #[error("{conn}: closed by the peer ({detail})")]
    Closed { conn: String, detail: String },
    /// A network plugin could not be used, or one of its calls failed
    /// (`what` names the call and NCCL's result code).
    #[error("net plugin {plugin}: {what}")]
    Plugin { plugin: String, what: String },
    /// A wait ran past the deadline.
    #[error("{conn}: deadline of {limit:?} expired waiting for {what}")]
    Timeout {
        conn: String,
        what: &'static str,
        limit: Duration,
    },
}
