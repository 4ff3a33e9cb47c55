//! Passing file descriptors between processes of one machine: each rank
//! binds a datagram Unix socket in the abstract namespace (nothing is
//! left in the file system, even by a crashed process), and peers send it
//! descriptors with `SCM_RIGHTS` (shared-memory segments now, CUDA VMM
//! handles exported as POSIX fds later).
//!
//! Only the job's own processes reach a rank's memory this way:
//!
//! - a mailbox's name is derived from the communicator's key (a keyed hash
//!   of the scope and the rank), so though every user sees the names in
//!   `/proc/net/unix`, nobody without the unique id can compute one ahead
//!   of time, nor tell which communicator it serves;
//! - a mailbox takes a message only when the kernel-reported sender
//!   (`SO_PASSCRED` / `SCM_CREDENTIALS`) has our uid and, when the rank
//!   table is known ([`FdMailbox::with_senders`]), the pid the table gives
//!   the rank the message claims to come from. Ranks that are threads of
//!   one process share a pid, which is fine. A sender in another pid
//!   namespace (ranks in different containers of one host) is reported
//!   under a pid of ours, not its own, so for a rank whose descriptor names
//!   another namespace the check falls back to the uid and the secret name.
//!
//! A message that fails is dropped with its descriptors (a warning names
//! the sender's pid and uid) and the wait goes on.
//!
//! A datagram carries a stamp derived from the key, the sender's rank, a
//! tag chosen by the caller and up to [`MAX_FDS`] descriptors. Receivers
//! match on (sender, tag) and keep early arrivals, so peers may send in
//! any order.
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
use rustix::net::sockopt::set_socket_passcred;
use rustix::net::{
    bind, recvmsg, sendmsg_addr, socket_with, AddressFamily, RecvAncillaryBuffer,
    RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketAddrUnix, SocketFlags, SocketType,
};

use crate::auth::Key;
use crate::desc::RankDesc;
use crate::error::BootstrapError;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 16;

const MSG: usize = 20;

type Parcel = (u32, u64, Vec<OwnedFd>);

/// One rank's descriptor mailbox.
#[derive(Debug)]
pub struct FdMailbox {
    sock: OwnedFd,
    key: Key,
    /// The first bytes of every message of this communicator.
    stamp: u64,
    scope: u16,
    rank: u32,
    early: Mutex<Vec<Parcel>>,
    /// The bootstrap's deadline, for messages (unset: the wait's own length).
    limit: Option<Duration>,
    /// Per rank: the pid that may send as it, where the kernel reports it
    /// alike (same pid namespace); `None` where only the uid is checked.
    senders: Option<Vec<Option<u32>>>,
    uid: u32,
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), 0
/// where it cannot be read.
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

fn name(key: &Key, scope: u16, rank: u32) -> Result<SocketAddrUnix, BootstrapError> {
    let secret = key.tag_hex(
        "oxccl fd mailbox name",
        &[&scope.to_le_bytes(), &rank.to_le_bytes()],
        16,
    );
    SocketAddrUnix::new_abstract_name(format!("oxccl-{secret}").as_bytes())
        .map_err(|e| BootstrapError::io(rank, "naming a Unix socket", &e.into()))
}

fn stamp(key: &Key) -> u64 {
    let m = key.mac("oxccl fd mailbox stamp", &[]);
    u64::from_le_bytes(m[..8].try_into().expect("8 bytes"))
}

impl FdMailbox {
    /// Binds rank `rank`'s mailbox of the communicator (`key`, `scope`).
    /// Until [`FdMailbox::with_senders`], it takes messages from any
    /// process of our uid.
    pub fn bind(key: &Key, scope: u16, rank: u32) -> Result<FdMailbox, BootstrapError> {
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
        // The kernel then attaches every sender's pid and uid.
        set_socket_passcred(&sock, true).map_err(|e| io("setting SO_PASSCRED", e))?;
        bind(&sock, &name(key, scope, rank)?).map_err(|e| {
            io(
                "binding the fd mailbox (is a communicator with this id already here?)",
                e,
            )
        })?;
        Ok(FdMailbox {
            sock,
            key: *key,
            stamp: stamp(key),
            scope,
            rank,
            early: Mutex::new(Vec::new()),
            limit: None,
            senders: None,
            uid: rustix::process::getuid().as_raw(),
        })
    }

    /// This mailbox, taking a message that claims to come from rank `r`
    /// only from the process `senders[r].pid` (checked where that rank
    /// shares our pid namespace; see the module's docs).
    pub fn with_senders(mut self, senders: &[RankDesc]) -> FdMailbox {
        let ns = pid_namespace();
        self.senders = Some(
            senders
                .iter()
                .map(|d| (ns != 0 && d.pidns == ns).then_some(d.pid))
                .collect(),
        );
        self
    }

    /// The mailbox's abstract socket name (what `/proc/net/unix` shows).
    pub fn address(&self) -> String {
        name(&self.key, self.scope, self.rank)
            .ok()
            .and_then(|a| {
                a.abstract_name()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
            })
            .unwrap_or_default()
    }

    /// The bytes of a message from rank `from` with `tag` to a mailbox of
    /// the communicator `key` (what [`FdMailbox::send`] sends; for tests
    /// that check forged messages are refused).
    pub fn datagram(key: &Key, from: u32, tag: u64) -> [u8; MSG] {
        let mut msg = [0u8; MSG];
        msg[..8].copy_from_slice(&stamp(key).to_le_bytes());
        msg[8..12].copy_from_slice(&from.to_le_bytes());
        msg[12..].copy_from_slice(&tag.to_le_bytes());
        msg
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
        let msg = FdMailbox::datagram(&self.key, self.rank, tag);
        let addr = name(&self.key, self.scope, to)?;
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
        let mut space =
            [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS), ScmCredentials(1))];
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
        let mut cred = None;
        for m in anc.drain() {
            match m {
                RecvAncillaryMessage::ScmRights(it) => fds.extend(it),
                RecvAncillaryMessage::ScmCredentials(c) => cred = Some(c),
                _ => {}
            }
        }
        let Some((from, tag)) = parse_datagram(self.stamp, &msg[..r.bytes.min(msg.len())]) else {
            tracing::warn!(
                bytes = r.bytes,
                "oxccl fd mailbox of rank {} dropped a stranger's datagram",
                self.rank
            );
            return Ok(None);
        };
        if let Err(why) = self.sender_ok(from, cred) {
            tracing::warn!(
                "oxccl fd mailbox of rank {} dropped a message claiming to be from rank {from}: {why}",
                self.rank
            );
            return Ok(None);
        }
        Ok(Some((from, tag, fds)))
    }

    /// Whether the kernel's word on the sender fits rank `from`.
    fn sender_ok(&self, from: u32, cred: Option<rustix::net::UCred>) -> Result<(), String> {
        let Some(c) = cred else {
            return Err("no sender credentials came with it".into());
        };
        let (pid, uid) = (
            rustix::process::Pid::as_raw(Some(c.pid)) as u32,
            c.uid.as_raw(),
        );
        if uid != self.uid {
            return Err(format!(
                "sent by pid {pid} of uid {uid}, not our uid {}",
                self.uid
            ));
        }
        match &self.senders {
            None => Ok(()),
            Some(s) => match s.get(from as usize) {
                None => Err(format!("no rank {from} among {} ranks", s.len())),
                Some(Some(want)) if *want != pid => {
                    Err(format!("sent by pid {pid}, but rank {from} is pid {want}"))
                }
                Some(_) => Ok(()),
            },
        }
    }
}

/// The sender's rank and tag of a datagram that is exactly one message
/// carrying `stamp`; `None` for anything else (a stranger's bytes).
pub(crate) fn parse_datagram(stamp: u64, msg: &[u8]) -> Option<(u32, u64)> {
    let msg: &[u8; MSG] = msg.try_into().ok()?;
    let (s, rest) = msg.split_at(8);
    if u64::from_le_bytes(s.try_into().ok()?) != stamp {
        return None;
    }
    let (from, tag) = rest.split_at(4);
    Some((
        u32::from_le_bytes(from.try_into().ok()?),
        u64::from_le_bytes(tag.try_into().ok()?),
    ))
}
