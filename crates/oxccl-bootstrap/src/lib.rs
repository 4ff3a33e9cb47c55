//! oxccl-bootstrap: how the ranks of a communicator, living in different
//! processes, find each other.
//!
//! - [`UniqueId`]: 128 bytes (NCCL's `ncclUniqueId`): a random magic and
//!   the address of a root that [`UniqueId::new`] starts in the calling
//!   process; with `NCCL_COMM_ID=host:port`, a fixed magic and that
//!   address, where rank 0 starts the root during its init.
//! - [`Bootstrap::init`]: each rank connects to the root under a deadline
//!   and sends its [`RankDesc`] (host identity, pid, device and bus id,
//!   listening address); the root checks the hellos (one per rank, one
//!   rank count) and answers everyone with the full table; the ranks then
//!   connect in a ring. A 1-rank communicator contacts no root.
//! - [`Bootstrap::all_gather`], [`Bootstrap::broadcast`],
//!   [`Bootstrap::barrier`]: small collective calls over that ring, for
//!   the layers above (shared-memory setup, `split`, the C ABI).
//! - [`Bootstrap::mesh`]: a connection between every pair of ranks, for a
//!   layer that keeps talking to each peer (the call check across hosts).
//! - [`PeerWatch`]: a thread that notices a peer process's exit.
//! - [`FdMailbox`]: file descriptors between processes of one machine
//!   (`SCM_RIGHTS` over abstract Unix sockets).
//!
//! Every connection starts with the magic and speaks [`wire`]'s frames;
//! garbage, a wrong magic, truncated or oversized frames, a duplicate rank
//! or a wrong rank count become a typed [`BootstrapError`], never a panic
//! or a hang: every wait has the caller's deadline. The listening address
//! comes from `NCCL_SOCKET_IFNAME` (prefixes, `^` to exclude, `=` for exact
//! names) and `NCCL_SOCKET_FAMILY` (`AF_INET`/`AF_INET6`); see [`iface`].

mod desc;
pub mod env;
mod error;
mod fdpass;
mod id;
pub mod iface;
mod mesh;
mod ring;
mod root;
mod scalable;
mod settings;
mod sock;
mod watch;
pub mod wire;

pub use desc::{host_identity, DeviceInfo, RankDesc, MAX_RANKS};
pub use error::{BootstrapError, WireError};
pub use fdpass::{FdMailbox, MAX_FDS};
pub use id::{IdInfo, UniqueId, COMM_ID_MAGIC};
pub use ring::{Bootstrap, MAX_RECORD};
pub use scalable::{root_block, root_of};
pub use settings::BootstrapSettings;
pub use watch::PeerWatch;

/// The wait deadline every layer takes unless configured otherwise (the
/// facade's `Config`, the host fabric, the TCP transport): generous,
/// because a slow peer is not a hung one.
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// The longest wait the bootstrap takes: a caller's "no deadline"
/// (`Duration::MAX`) becomes a year, which instants can represent.
pub const MAX_LIMIT: std::time::Duration = std::time::Duration::from_secs(365 * 86_400);

pub(crate) fn clamp(limit: std::time::Duration) -> std::time::Duration {
    limit.min(MAX_LIMIT)
}

/// Rank numbers, as in the plan IR.
pub type Rank = oxccl_core::plan::Rank;
