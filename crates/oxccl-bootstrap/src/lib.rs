//! oxccl-bootstrap: how the ranks of a communicator, living in different
//! processes, find each other.
//!
//! - [`UniqueId`]: 128 bytes (NCCL's `ncclUniqueId`): a random magic, a
//!   random 32-byte [`Key`] and the address of a root that
//!   [`UniqueId::new`] starts in the calling process (one thread serves
//!   every root of a process); with `NCCL_COMM_ID=host:port`, a fixed magic,
//!   that address (rank 0 starts the root during its init) and a key from
//!   `OXCCL_COMM_SECRET`.
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
//! - [`FdMailbox`]: file descriptors between ranks of one machine: for
//!   ranks in other processes, `SCM_RIGHTS` over one connected datagram
//!   socket per pair of ranks (abstract names derived from the key; the
//!   kernel refuses any other sender once connected), checked against the
//!   rank table's pid with our uid; for threads of one process, duplicated
//!   in place.
//!
//! Every connection starts with the magic and speaks [`wire`]'s frames;
//! garbage, a wrong magic, truncated or oversized frames, a duplicate rank
//! or a wrong rank count become a typed [`BootstrapError`], never a panic
//! or a hang: every wait has the caller's deadline.
//!
//! # Trust model
//!
//! The id is the job's key ([`auth`]): whoever holds it may join. Every
//! connection to the root, to a rank's ring listener and to the mesh opens
//! with a proof of the key: the acceptor sends a random nonce (`Challenge`),
//! the connector answers with its hello and `MAC(key, role, magic, both
//! nonces, hello)`, and the acceptor answers `Ack` with a MAC of its own,
//! which the connector checks before it trusts a table or a ring. So a
//! stranger who can reach the ports (but has not seen the id) cannot join,
//! learn the rank table, displace a rank, or pose as the root; a recorded
//! hello is useless (the nonce is fresh). Keys of subset rendezvous, of
//! the scalable ring, of the fd mailboxes and of the network transport
//! ([`Bootstrap::layer_key`]) are derived from the communicator's, never
//! sent. The proof covers the hello only: the frames after it are not
//! encrypted nor authenticated, so the job's network must be trusted not
//! to rewrite TCP streams (as with NCCL).
//!
//! With `NCCL_COMM_ID` and no `OXCCL_COMM_SECRET` the key is a public
//! constant: anyone who can reach the root can join, as with NCCL.
//!
//! Listeners (the `handshake` module's gate) read every hello concurrently, each
//! within a few seconds, keep at most 128 connections waiting for one,
//! and drop a connection that sends garbage, a wrong magic or kind, an
//! absurd length (before allocating), or a failed proof, with a WARN
//! naming its address; setup goes on. `accept` failing with EMFILE/ENFILE
//! sheds waiting connections and backs off; a deadline error says so.
//!
//! The listening address
//! comes from `NCCL_SOCKET_IFNAME` (prefixes, `^` to exclude, `=` for exact
//! names) and `NCCL_SOCKET_FAMILY` (`AF_INET`/`AF_INET6`); see [`iface`].

pub mod accept;
pub mod auth;
mod desc;
pub mod env;
mod error;
mod fdlocal;
mod fdpass;
#[doc(hidden)]
pub mod fuzz;
mod handshake;
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

pub use auth::Key;
pub use desc::{host_identity, DeviceInfo, RankDesc, MAX_RANKS};
pub use error::{BootstrapError, WireError};
pub use fdpass::{FdMailbox, MAX_FDS};
pub use id::{IdInfo, UniqueId, COMM_ID_MAGIC};
pub use ring::{Bootstrap, MAX_RECORD};
pub use root::service_running;
pub use scalable::{root_block, root_of};
pub use settings::{BootstrapSettings, WaitWarn};
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
