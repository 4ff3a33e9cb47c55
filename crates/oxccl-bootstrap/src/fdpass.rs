//! Passing file descriptors between processes of one machine: each rank
//! binds a datagram Unix socket in the abstract namespace (named after the
//! communicator's magic and root port and the rank, so nothing is left in
//! the file system, even by a crashed process), and peers send it
//! descriptors with `SCM_RIGHTS` (shared-memory segments now, CUDA VMM
//! handles exported as POSIX fds later).
//!
//! A datagram carries the magic, the sender's rank, a tag chosen by the
//! caller and up to [`MAX_FDS`] descriptors. Receivers match on (sender,
//! tag) and keep early arrivals, so peers may send in any order.
//!
//! A socket's queue holds only `net.unix.max_dgram_qlen` datagrams (10 by
//! default), and descriptors in flight count against the sender's
//! `RLIMIT_NOFILE`: when every rank sends to every peer before receiving
//! (the host fabric's segment exchange), more than 11 ranks would all wait
//! on full queues that nobody drains. So a send that has to wait drains
//! its own mailbox into the early arrivals meanwhile.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{
    bind, recvmsg, sendmsg_addr, socket_with, AddressFamily, RecvAncillaryBuffer,
    RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::BootstrapError;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 16;

const MSG: usize = 20;

type Parcel = (u32, u64, Vec<OwnedFd>);

/// One rank's descriptor mailbox.
#[derive(Debug)]
pub struct FdMailbox {
    sock: OwnedFd,
    magic: u64,
    scope: u16,
    rank: u32,
    early: Mutex<Vec<Parcel>>,
    /// The bootstrap's deadline, for messages (unset: the wait's own length).
    limit: Option<Duration>,
}

fn name(magic: u64, scope: u16, rank: u32) -> Result<SocketAddrUnix, BootstrapError> {
    SocketAddrUnix::new_abstract_name(format!("oxccl-{magic:016x}-{scope}-{rank}").as_bytes())
        .map_err(|e| BootstrapError::io(rank, "naming a Unix socket", &e.into()))
}

impl FdMailbox {
    /// Binds rank `rank`'s mailbox of the communicator (`magic`, `scope`).
    pub fn bind(magic: u64, scope: u16, rank: u32) -> Result<FdMailbox, BootstrapError> {
        let io = |what: &str, e: rustix::io::Errno| {
            BootstrapError::io(rank, what.to_string(), &e.into())
        };
        let sock = socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| io("creating a Unix socket", e))?;
        bind(&sock, &name(magic, scope, rank)?).map_err(|e| {
            io(
                "binding the fd mailbox (is a communicator with this id already here?)",
                e,
            )
        })?;
        Ok(FdMailbox {
            sock,
            magic,
            scope,
            rank,
            early: Mutex::new(Vec::new()),
            limit: None,
        })
    }

    /// This mailbox, naming `limit` as the deadline in its timeouts.
    pub(crate) fn with_limit(mut self, limit: Duration) -> FdMailbox {
        self.limit = Some(limit);
        self
    }

    fn timeout(&self, started: Instant, waiting_for: String) -> BootstrapError {
        BootstrapError::Timeout {
            rank: self.rank,
            waiting_for,
            limit: self.limit.unwrap_or_else(|| started.elapsed()),
        }
    }

    /// Waits up to `t` for a datagram, then keeps every one queued as an
    /// early arrival (frees the senders waiting on this queue).
    fn drain(&self, t: Duration) -> Result<(), BootstrapError> {
        let mut t = t;
        loop {
            let ts = Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            };
            let mut pfd = [PollFd::new(&self.sock, PollFlags::IN)];
            if poll(&mut pfd, Some(&ts)).unwrap_or(0) == 0 {
                return Ok(());
            }
            if let Some(p) = self.recv_one()? {
                self.early.lock().unwrap_or_else(|p| p.into_inner()).push(p);
            }
            t = Duration::ZERO;
        }
    }

    /// Sends `fds` with `tag` to rank `to`'s mailbox (on this machine).
    pub fn send(
        &self,
        to: u32,
        tag: u64,
        fds: &[BorrowedFd<'_>],
        deadline: Instant,
    ) -> Result<(), BootstrapError> {
        if fds.len() > MAX_FDS {
            return Err(BootstrapError::InvalidArgument(format!(
                "{} descriptors in one message, at most {MAX_FDS}",
                fds.len()
            )));
        }
        let mut msg = [0u8; MSG];
        msg[..8].copy_from_slice(&self.magic.to_le_bytes());
        msg[8..12].copy_from_slice(&self.rank.to_le_bytes());
        msg[12..].copy_from_slice(&tag.to_le_bytes());
        let addr = name(self.magic, self.scope, to)?;
        let started = Instant::now();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        loop {
            let mut anc = SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() {
                anc.push(SendAncillaryMessage::ScmRights(fds));
            }
            match sendmsg_addr(
                &self.sock,
                &addr,
                &[IoSlice::new(&msg)],
                &mut anc,
                SendFlags::DONTWAIT,
            ) {
                Ok(_) => return Ok(()),
                // The peer's queue is full, it has not bound yet, or too
                // many descriptors are in flight: the peer may be sending to
                // us meanwhile, so take its messages while waiting.
                Err(e)
                    if e == rustix::io::Errno::AGAIN
                        || e == rustix::io::Errno::CONNREFUSED
                        || e == rustix::io::Errno::NOENT
                        || e == rustix::io::Errno::TOOMANYREFS =>
                {
                    if Instant::now() >= deadline {
                        return Err(self.timeout(
                            started,
                            format!("rank {to}'s fd mailbox to take a message ({e})"),
                        ));
                    }
                    self.drain(Duration::from_millis(2))?;
                }
                Err(e) => {
                    return Err(BootstrapError::PeerLost {
                        rank: self.rank,
                        peer: to,
                        detail: format!("sending descriptors: {e}"),
                    })
                }
            }
        }
    }

    /// Receives the descriptors rank `from` sent with `tag`.
    pub fn recv(
        &self,
        from: u32,
        tag: u64,
        deadline: Instant,
    ) -> Result<Vec<OwnedFd>, BootstrapError> {
        let started = Instant::now();
        loop {
            {
                let mut early = self.early.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = early.iter().position(|p| p.0 == from && p.1 == tag) {
                    return Ok(early.swap_remove(i).2);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(
                    self.timeout(started, format!("descriptors from rank {from} (tag {tag})"))
                );
            }
            self.drain(left.min(Duration::from_millis(100)))?;
        }
    }

    /// One datagram, if it is ours (anything else is dropped with its fds).
    fn recv_one(&self) -> Result<Option<Parcel>, BootstrapError> {
        let mut msg = [0u8; MSG + 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let r = match recvmsg(
            &self.sock,
            &mut [IoSliceMut::new(&mut msg)],
            &mut anc,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r,
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => {
                return Ok(None)
            }
            Err(e) => {
                return Err(BootstrapError::io(
                    self.rank,
                    "receiving descriptors",
                    &e.into(),
                ))
            }
        };
        let mut fds = Vec::new();
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        if r.bytes != MSG || u64::from_le_bytes(msg[..8].try_into().expect("8 bytes")) != self.magic
        {
            tracing::debug!(
                bytes = r.bytes,
                "oxccl fd mailbox dropped a stranger's datagram"
            );
            return Ok(None);
        }
        let from = u32::from_le_bytes(msg[8..12].try_into().expect("4 bytes"));
        let tag = u64::from_le_bytes(msg[12..20].try_into().expect("8 bytes"));
        Ok(Some((from, tag, fds)))
    }
}
