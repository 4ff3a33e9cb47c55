//! The facade's error type: one variant per validation rule, so callers
//! (and the C ABI) can tell what went wrong and how to fix it.

use oxccl_core::{CollKind, CoreError, DataType, FaultCause, WaitFault};
use thiserror::Error;

/// `ncclResult_t` values, for the C ABI.
pub mod nccl_code {
    pub const SUCCESS: i32 = 0;
    pub const UNHANDLED_CUDA_ERROR: i32 = 1;
    pub const SYSTEM_ERROR: i32 = 2;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const INVALID_ARGUMENT: i32 = 4;
    pub const INVALID_USAGE: i32 = 5;
    pub const REMOTE_ERROR: i32 = 6;
}

/// Everything the `oxccl` API can report. Validation errors are returned
/// before anything is written.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A buffer's length does not fit the call.
    #[error("{what} has {got} elements but this call needs exactly {expected}; pass a buffer or a .slice() of {expected} elements")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A source longer than the memory it is copied into (shorter is fine).
    #[error(
        "{what} has {got} elements but the destination holds at most {max}; pass at most {max}"
    )]
    TooLong {
        what: &'static str,
        max: usize,
        got: usize,
    },
    /// A buffer whose length must be a multiple of the rank count.
    #[error(
        "{what} has {len} elements, which is not a multiple of the {nranks} ranks; pass a multiple"
    )]
    NotMultiple {
        what: &'static str,
        len: usize,
        nranks: u32,
    },
    /// Counts, displacements or blocks that do not fit their buffer
    /// (`all_to_all_v`).
    #[error("{what} layout: {detail}")]
    InvalidLayout { what: &'static str, detail: String },
    /// A root rank outside `0..nranks`.
    #[error("root {root} is out of range: the communicator has ranks 0..{nranks}")]
    RootOutOfRange { root: u32, nranks: u32 },
    /// A Send/Recv peer outside `0..nranks`.
    #[error("peer {peer} is out of range: the communicator has ranks 0..{nranks}")]
    PeerOutOfRange { peer: u32, nranks: u32 },
    /// Send and receive buffers overlap without being NCCL's in-place
    /// layout for this collective.
    #[error("{coll}: send and receive buffers overlap but are not the in-place layout ({detail}); use disjoint buffers or the exact in-place layout")]
    InvalidInPlace { coll: CollKind, detail: String },
    /// An operator that is not defined for the data type.
    #[error("reduction op {op} is not defined for {dtype}: {reason}")]
    OpNotDefined {
        op: String,
        dtype: DataType,
        reason: String,
    },
    /// A null (or, on the raw API, misaligned) pointer.
    #[error("{what}: {detail}")]
    BadPointer { what: &'static str, detail: String },
    /// A buffer that belongs to another backend or rank, or a host slice
    /// given to a device backend.
    #[error("{what}: {detail}")]
    ForeignBuffer { what: &'static str, detail: String },
    /// A call on a communicator after `destroy`.
    #[error("rank {rank}: the communicator was destroyed; create a new one")]
    Destroyed { rank: u32 },
    /// A call on a communicator whose clique failed or was aborted earlier.
    #[error(
        "rank {rank}: the communicator failed earlier ({cause}); destroy it and create a new one"
    )]
    Failed { rank: u32, cause: String },
    /// Ranks made calls that do not match (another collective, count,
    /// type, op or root; a Send/Recv whose other side differs or never
    /// came). Every rank involved gets it, before any data moved.
    #[error("rank {rank}: calls do not match across ranks: {detail}. Every rank must make the same collective calls (same count, type, op, root) in the same order, and each send needs a recv of the same count and type")]
    Mismatch { rank: u32, detail: String },
    /// A peer's call failed before any data moved (its validation refused
    /// it): this rank's matching call fails at once instead of waiting,
    /// naming the peer and its reason. [`Error::blamed_rank`] says `peer`.
    #[error("rank {rank}: peer rank {peer} failed {call}: {reason}; the peer returned the error, fix the call there")]
    PeerFailed {
        rank: u32,
        peer: u32,
        call: String,
        reason: String,
    },
    /// Waiting for the peers' matching calls (before any data moved) ran
    /// past the deadline; says which calls were missing.
    #[error("timeout: {0}")]
    Timeout(String),
    /// A rank gave up waiting for a peer inside a plan, as data: who, on which channel
    /// and step, for what, for how long, and why (its deadline passed, the
    /// communicator was aborted, another rank failed). Both backends report
    /// their waits this way; [`Error::nccl_result`] maps the cause.
    #[error("{word}: {0}", word = wait_word(.0))]
    Wait(WaitFault),
    /// The operation was aborted (by `abort` or by a peer's failure) with
    /// no wait of this rank to describe.
    #[error("aborted: {0}")]
    Aborted(String),
    /// A bad configuration value (an environment variable or a `Config` field).
    #[error("{var}={value:?}: {reason}")]
    Config {
        var: String,
        value: String,
        reason: String,
    },
    /// No algorithm allowed by the configuration serves this call.
    #[error("no algorithm allowed by the configuration implements {coll} (allowed: {allowed}); widen NCCL_ALGO/OXCCL_ALGO")]
    NoAlgorithm { coll: CollKind, allowed: String },
    /// Calls in the wrong order: group end without start, a communicator
    /// used by a group on another thread, ...
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// The requested backend cannot be used here.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// A backend failure (driver error, allocation failure, ...).
    #[error("backend error: {0}")]
    Backend(String),
    /// A device driver error (CUDA).
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// Ranks in several processes could not meet or set up (rendezvous,
    /// sockets, shared memory).
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A bug in oxccl (a plan the generators should not have produced).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The `ncclResult_t` code NCCL would return for this error.
    pub fn nccl_result(&self) -> i32 {
        use nccl_code::*;
        match self {
            Error::LengthMismatch { .. }
            | Error::TooLong { .. }
            | Error::NotMultiple { .. }
            | Error::RootOutOfRange { .. }
            | Error::PeerOutOfRange { .. }
            | Error::InvalidInPlace { .. }
            | Error::InvalidLayout { .. }
            | Error::OpNotDefined { .. }
            | Error::BadPointer { .. }
            | Error::ForeignBuffer { .. }
            | Error::Config { .. }
            | Error::NoAlgorithm { .. } => INVALID_ARGUMENT,
            Error::Destroyed { .. }
            | Error::InvalidUsage(_)
            | Error::BackendUnavailable(_)
            | Error::Mismatch { .. } => INVALID_USAGE,
            Error::Failed { .. } | Error::Aborted(_) | Error::PeerFailed { .. } => REMOTE_ERROR,
            // NCCL reports a peer that stopped answering as a system error
            // (its sockets' timeouts) and a failure elsewhere as remote.
            Error::Wait(f) => match f.cause {
                FaultCause::Deadline => SYSTEM_ERROR,
                FaultCause::Aborted | FaultCause::PeerFailed => REMOTE_ERROR,
            },
            Error::Timeout(_) | Error::Backend(_) | Error::Bootstrap(_) => SYSTEM_ERROR,
            Error::Cuda(_) => UNHANDLED_CUDA_ERROR,
            Error::Internal(_) => INTERNAL_ERROR,
        }
    }
}

impl Error {
    /// The first failure in its own words, without the wrappers it gathers
    /// as it is passed on (`aborted: communicator failed earlier: ...`), so
    /// [`Error::Failed`] names it once.
    pub(crate) fn root_cause(&self) -> String {
        let s = match self {
            Error::Aborted(m) | Error::Timeout(m) | Error::Backend(m) | Error::Cuda(m) => m.clone(),
            Error::Wait(f) => f.to_string(),
            Error::Failed { cause, .. } => cause.clone(),
            e => e.to_string(),
        };
        let mut rest = s.as_str();
        while let Some(r) = ["communicator failed earlier: ", "aborted: "]
            .iter()
            .find_map(|p| rest.strip_prefix(p))
        {
            rest = r;
        }
        rest.to_string()
    }

    /// The rank to blame when this error is a peer's fault: the peer whose
    /// call failed ([`Error::PeerFailed`]). `None` for errors of this
    /// rank's own making and for deadlines and aborts, where the rank
    /// waited on may be innocent (a third rank's failure stops it too).
    pub fn blamed_rank(&self) -> Option<u32> {
        match self {
            Error::PeerFailed { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// Whether this error reports a peer's failure rather than this
    /// rank's (see [`Error::blamed_rank`]).
    pub fn peer_failed(&self) -> bool {
        self.blamed_rank().is_some()
    }

    /// The wait that failed, when this error is one.
    pub fn wait_fault(&self) -> Option<&WaitFault> {
        match self {
            Error::Wait(f) => Some(f),
            _ => None,
        }
    }
}

fn wait_word(f: &WaitFault) -> &'static str {
    match f.cause {
        FaultCause::Deadline => "timeout",
        FaultCause::Aborted | FaultCause::PeerFailed => "aborted",
    }
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::Parse {
                what,
                value,
                expected,
            } => Error::Config {
                var: what.into(),
                value,
                reason: format!("expected one of: {expected}"),
            },
            other => Error::Internal(other.to_string()),
        }
    }
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The facade's error for a bootstrap failure.
pub(crate) fn map_bootstrap(e: oxccl_bootstrap::BootstrapError) -> Error {
    use oxccl_bootstrap::env::BadVar;
    use oxccl_bootstrap::BootstrapError;
    match e {
        BootstrapError::InvalidArgument(m) | BootstrapError::InvalidId(m) => Error::InvalidUsage(m),
        BootstrapError::Config(BadVar { var, value, reason }) => Error::Config {
            var: var.into(),
            value,
            reason,
        },
        e @ BootstrapError::Timeout { .. } => Error::Timeout(e.to_string()),
        e => Error::Bootstrap(e.to_string()),
    }
}
