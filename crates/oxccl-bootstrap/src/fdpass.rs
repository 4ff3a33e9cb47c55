//! Passing file descriptors between ranks of one machine.
//!
//! Ranks that are threads of one process share their descriptor table:
//! a send duplicates the descriptors into a process-wide inbox
//! ([`crate::fdlocal`]), which nothing outside the process reaches.
//!
//! Ranks in other processes talk over one datagram Unix socket per pair
//! of ranks, in the abstract namespace (nothing is left in the file
//! system, even by a crashed process), carrying descriptors with
//! `SCM_RIGHTS` (shared-memory segments, CUDA VMM handles exported as
//! POSIX fds). Each rank binds its end of every pair at once, when the
//! rank table is known, and connects it to the peer's end as soon as the
//! peer has bound it. A connected datagram socket takes datagrams only
//! from the socket it is connected to: the kernel refuses everyone else
//! with `EPERM`. That is what keeps another local user out: socket names
//! are listed in `/proc/net/unix` for every user to see, and a socket
//! open to anyone's datagrams can be kept full by a stranger (its queue
//! holds `net.unix.max_dgram_qlen` datagrams, 10 by default), stalling
//! the job's setup. Between a rank binding its end and connecting it
//! (the peer has not bound yet), a stranger can queue at most that many
//! datagrams; they are read and dropped.
//!
//! Every datagram is still checked:
//!
//! - its first bytes are a stamp derived from the communicator's key, and
//!   socket names are a keyed hash of the scope and the two ranks, so
//!   nobody without the unique id can compute one ahead of time, nor tell
//!   which communicator it serves;
//! - the kernel-reported sender (`SO_PASSCRED` / `SCM_CREDENTIALS`) must
//!   have our uid and, where the peer shares our pid namespace, the pid
//!   the rank table gives it. A sender in another pid namespace (ranks in
//!   different containers of one host) is reported under a pid of ours,
//!   not its own, so there only the uid, the secret names and the
//!   connection are checked.
//!
//! A message that fails is dropped with its descriptors (the first few
//! drops are warned of, naming the sender's pid and uid) and the wait
//! goes on.
//!
//! A datagram carries the stamp, the sender's rank, a tag chosen by the
//! caller and up to [`MAX_FDS`] descriptors. Receivers match on (sender,
//! tag) and keep early arrivals, so peers may send in any order; a send
//! that has to wait (descriptors in flight count against the sender's
//! `RLIMIT_NOFILE`) drains its own links into the early arrivals
//! meanwhile, so ranks that all send before they receive never wait on
//! each other.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::sockopt::set_socket_passcred;
use rustix::net::{
    bind, connect, recvmsg, sendmsg, socket_with, AddressFamily, RecvAncillaryBuffer,
    RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketAddrUnix, SocketFlags, SocketType,
};

use crate::auth::Key;
use crate::desc::RankDesc;
use crate::error::BootstrapError;
use crate::fdlocal::{self, Parcel};

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 16;

const MSG: usize = 20;

/// Datagrams one link gives per look before the wait checks its deadline
/// again (a link a stranger keeps feeding cannot hold a rank).
const DRAIN_BATCH: usize = 64;

/// Drops warned of in full; later ones at powers of two.
const LOUD_DROPS: u64 = 4;

/// How this rank reaches another.
#[derive(Debug)]
enum Link {
    /// This rank itself.
    Me,
    /// A rank on another machine: descriptors do not travel there.
    Elsewhere,
    /// A thread of this process.
    InProcess,
    /// A rank in another process of this machine.
    Socket(PairSocket),
}

/// This rank's end of a pair of datagram sockets.
#[derive(Debug)]
struct PairSocket {
    fd: OwnedFd,
    /// Connected to the peer's end: from then on the kernel refuses
    /// datagrams from any other socket.
    connected: AtomicBool,
    /// The pid the kernel must report for the peer, where comparable.
    pid: Option<u32>,
}

/// One rank's descriptor mailbox.
#[derive(Debug)]
pub struct FdMailbox {
    key: Key,
    /// The first bytes of every message of this communicator.
    stamp: u64,
    scope: u16,
    rank: u32,
    /// Per rank of the table.
    links: Vec<Link>,
    early: Mutex<Vec<Parcel>>,
    /// The bootstrap's deadline, for messages (unset: the wait's own length).
    limit: Option<Duration>,
    uid: u32,
    dropped: AtomicU64,
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), 0
/// where it cannot be read.
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The name of the socket `owner` reads `peer`'s messages on.
fn name(key: &Key, scope: u16, owner: u32, peer: u32) -> Result<SocketAddrUnix, BootstrapError> {
    let secret = key.tag_hex(
        "oxccl fd link name",
        &[
            &scope.to_le_bytes(),
            &owner.to_le_bytes(),
            &peer.to_le_bytes(),
        ],
        16,
    );
    SocketAddrUnix::new_abstract_name(format!("oxccl-{secret}").as_bytes())
        .map_err(|e| BootstrapError::io(owner, "naming a Unix socket", &e.into()))
}

fn stamp(key: &Key) -> u64 {
    let m = key.mac("oxccl fd mailbox stamp", &[]);
    u64::from_le_bytes(m[..8].try_into().expect("8 bytes"))
}

/// A datagram Unix socket; where this process is out of descriptors, its
/// soft limit is raised to the hard one once (a rank holds one socket per
/// peer process of its machine).
fn dgram_socket(rank: u32) -> Result<OwnedFd, BootstrapError> {
    let open = || {
        socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            None,
        )
    };
    let first = open();
    let e = match first {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    if e == Errno::MFILE {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let lim = getrlimit(Resource::Nofile);
        if lim.current != lim.maximum {
            let raised = Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                if let Ok(s) = open() {
                    return Ok(s);
                }
            }
        }
        return Err(BootstrapError::io(
            rank,
            format!(
                "creating a Unix socket (out of descriptors at {:?}: a rank needs one per peer process of its machine; raise `ulimit -n`)",
                lim.maximum
            ),
            &e.into(),
        ));
    }
    Err(BootstrapError::io(
        rank,
        "creating a Unix socket",
        &e.into(),
    ))
}

impl PairSocket {
    /// Rank `me`'s end of its pair with `peer`, bound.
    fn bind(
        key: &Key,
        scope: u16,
        me: u32,
        peer: u32,
        pid: Option<u32>,
    ) -> Result<PairSocket, BootstrapError> {
        let io = |what: &str, e: Errno| BootstrapError::io(me, what.to_string(), &e.into());
        let fd = dgram_socket(me)?;
        // The kernel then attaches every sender's pid and uid.
        set_socket_passcred(&fd, true).map_err(|e| io("setting SO_PASSCRED", e))?;
        bind(&fd, &name(key, scope, me, peer)?).map_err(|e| {
            io(
                &format!(
                    "binding the fd link to rank {peer} (is a communicator with this id already here?)"
                ),
                e,
            )
        })?;
        Ok(PairSocket {
            fd,
            connected: AtomicBool::new(false),
            pid,
        })
    }
}

impl FdMailbox {
    /// Rank `rank`'s mailbox of the communicator (`key`, `scope`) whose
    /// ranks `descs` describes: its end of a socket pair with every rank
    /// in another process of this machine, bound now (see the module's
    /// docs), and connected to each peer's end as soon as it is bound.
    pub fn new(
        key: &Key,
        scope: u16,
        rank: u32,
        descs: &[RankDesc],
    ) -> Result<FdMailbox, BootstrapError> {
        let me = descs.get(rank as usize).ok_or_else(|| {
            BootstrapError::InvalidArgument(format!(
                "rank {rank} of a table of {} ranks",
                descs.len()
            ))
        })?;
        let (ns, pid) = (pid_namespace(), std::process::id());
        let mut links = Vec::with_capacity(descs.len());
        for (p, d) in descs.iter().enumerate() {
            let p = p as u32;
            let same_ns = ns != 0 && d.pidns == ns;
            links.push(if p == rank {
                Link::Me
            } else if d.host != me.host {
                Link::Elsewhere
            } else if same_ns && d.pid == pid {
                Link::InProcess
            } else {
                Link::Socket(PairSocket::bind(
                    key,
                    scope,
                    rank,
                    p,
                    same_ns.then_some(d.pid),
                )?)
            });
        }
        let st = stamp(key);
        fdlocal::open((st, scope));
        let mailbox = FdMailbox {
            key: *key,
            stamp: st,
            scope,
            rank,
            links,
            early: Mutex::new(Vec::new()),
            limit: None,
            uid: rustix::process::getuid().as_raw(),
            dropped: AtomicU64::new(0),
        };
        mailbox.connect_all()?;
        Ok(mailbox)
    }

    /// The abstract socket name (what `/proc/net/unix` shows) on which
    /// this rank reads rank `peer`'s messages; empty where `peer` is not
    /// reached by a socket.
    pub fn address(&self, peer: u32) -> String {
        match self.links.get(peer as usize) {
            Some(Link::Socket(_)) => name(&self.key, self.scope, self.rank, peer)
                .ok()
                .and_then(|a| {
                    a.abstract_name()
                        .map(|n| String::from_utf8_lossy(n).into_owned())
                })
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// Whether this rank's end of its pair with `peer` is connected (from
    /// then on nobody else can send on it); `false` where no socket joins
    /// them.
    pub fn is_connected(&self, peer: u32) -> bool {
        matches!(self.links.get(peer as usize), Some(Link::Socket(s)) if s.connected.load(Ordering::Acquire))
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

    /// The link to rank `p`, refusing this rank and ranks of other
    /// machines.
    fn link(&self, p: u32) -> Result<&Link, BootstrapError> {
        let bad = |why: String| Err(BootstrapError::InvalidArgument(why));
        match self.links.get(p as usize) {
            None => bad(format!(
                "no rank {p} among {} ranks",
                self.links.len()
            )),
            Some(Link::Me) => bad(format!("rank {p} passing descriptors to itself")),
            Some(Link::Elsewhere) => bad(format!(
                "rank {p} is on another machine: descriptors travel between ranks of one machine only"
            )),
            Some(l) => Ok(l),
        }
    }

    /// Connects this rank's end of its pair with `p` if the peer's end is
    /// bound; whether it is connected.
    fn try_connect(&self, p: u32, s: &PairSocket) -> Result<bool, BootstrapError> {
        if s.connected.load(Ordering::Acquire) {
            return Ok(true);
        }
        match connect(&s.fd, &name(&self.key, self.scope, p, self.rank)?) {
            Ok(()) => {
                s.connected.store(true, Ordering::Release);
                Ok(true)
            }
            // Not bound yet.
            Err(e) if e == Errno::CONNREFUSED || e == Errno::NOENT || e == Errno::AGAIN => {
                Ok(false)
            }
            // The name is bound by a socket connected to another: not the
            // peer's end as this protocol makes it.
            Err(e) => Err(BootstrapError::PeerLost {
                rank: self.rank,
                peer: p,
                detail: format!("connecting the fd link: {e}"),
            }),
        }
    }

    fn connect_all(&self) -> Result<(), BootstrapError> {
        for (p, l) in self.links.iter().enumerate() {
            if let Link::Socket(s) = l {
                self.try_connect(p as u32, s)?;
            }
        }
        Ok(())
    }

    /// Connects what it can, waits up to `t` for a datagram on any link,
    /// then keeps what arrived as early arrivals (frees the senders
    /// waiting on this rank).
    fn drain(&self, t: Duration) -> Result<(), BootstrapError> {
        self.connect_all()?;
        let socks: Vec<(u32, &PairSocket)> = self
            .links
            .iter()
            .enumerate()
            .filter_map(|(p, l)| match l {
                Link::Socket(s) => Some((p as u32, s)),
                _ => None,
            })
            .collect();
        if socks.is_empty() {
            return Ok(());
        }
        let ts = Timespec {
            tv_sec: t.as_secs() as _,
            tv_nsec: t.subsec_nanos() as _,
        };
        let mut pfds: Vec<PollFd<'_>> = socks
            .iter()
            .map(|(_, s)| PollFd::new(&s.fd, PollFlags::IN))
            .collect();
        if poll(&mut pfds, Some(&ts)).unwrap_or(0) == 0 {
            return Ok(());
        }
        let ready: Vec<bool> = pfds.iter().map(|f| !f.revents().is_empty()).collect();
        for ((p, s), ready) in socks.into_iter().zip(ready) {
            if !ready {
                continue;
            }
            for _ in 0..DRAIN_BATCH {
                match self.recv_one(p, s)? {
                    Some(Some(parcel)) => self
                        .early
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(parcel),
                    Some(None) => {}
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// Sends `fds` with `tag` to rank `to` (of this machine).
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
        let s = match self.link(to)? {
            Link::Socket(s) => s,
            _ => {
                return fdlocal::send((self.stamp, self.scope), self.rank, to, tag, fds)
                    .map_err(|e| BootstrapError::io(self.rank, "duplicating descriptors", &e))
            }
        };
        let msg = FdMailbox::datagram(&self.key, self.rank, tag);
        let started = Instant::now();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        loop {
            let why = if !self.try_connect(to, s)? {
                Errno::CONNREFUSED
            } else {
                let mut anc = SendAncillaryBuffer::new(&mut space);
                if !fds.is_empty() {
                    anc.push(SendAncillaryMessage::ScmRights(fds));
                }
                match sendmsg(&s.fd, &[IoSlice::new(&msg)], &mut anc, SendFlags::DONTWAIT) {
                    Ok(_) => return Ok(()),
                    // Too many descriptors in flight, or the buffer is
                    // full: the peer may be sending to us meanwhile.
                    Err(e) if e == Errno::AGAIN || e == Errno::TOOMANYREFS => e,
                    Err(e) => {
                        return Err(BootstrapError::PeerLost {
                            rank: self.rank,
                            peer: to,
                            detail: format!("sending descriptors: {e}"),
                        })
                    }
                }
            };
            if Instant::now() >= deadline {
                let what = if why == Errno::CONNREFUSED {
                    format!("rank {to} to open its fd link to rank {}", self.rank)
                } else {
                    format!("rank {to}'s fd link to take a message ({why})")
                };
                return Err(self.timeout(started, what));
            }
            self.drain(Duration::from_millis(2))?;
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
        let in_process = matches!(self.link(from)?, Link::InProcess);
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
            if in_process {
                let wait = left.min(Duration::from_millis(20));
                if let Some(fds) =
                    fdlocal::take((self.stamp, self.scope), self.rank, from, tag, wait)
                {
                    return Ok(fds);
                }
                // Peers in other processes may wait on this rank meanwhile.
                self.drain(Duration::ZERO)?;
            } else {
                self.drain(left.min(Duration::from_millis(100)))?;
            }
        }
    }

    /// One datagram from `p`'s link: `None` if none is queued, `Some(None)`
    /// if it was not ours (dropped with its descriptors).
    fn recv_one(&self, p: u32, s: &PairSocket) -> Result<Option<Option<Parcel>>, BootstrapError> {
        let mut msg = [0u8; MSG + 1];
        let mut space =
            [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS), ScmCredentials(1))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let r = match recvmsg(
            &s.fd,
            &mut [IoSliceMut::new(&mut msg)],
            &mut anc,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r,
            Err(e) if e == Errno::AGAIN || e == Errno::INTR => return Ok(None),
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
        let verdict = match parse_datagram(self.stamp, &msg[..r.bytes.min(msg.len())]) {
            None => Err(format!("a stranger's datagram ({} bytes)", r.bytes)),
            Some((from, _)) if from != p => {
                Err(format!("a message claiming rank {from} on rank {p}'s link"))
            }
            Some((from, tag)) => self.sender_ok(s, cred).map(|()| (from, tag)),
        };
        match verdict {
            Ok((from, tag)) => Ok(Some(Some((from, tag, fds)))),
            Err(why) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n <= LOUD_DROPS || n.is_power_of_two() {
                    tracing::warn!(
                        "oxccl fd mailbox of rank {} dropped {why} ({n} dropped so far)",
                        self.rank
                    );
                }
                Ok(Some(None))
            }
        }
    }

    /// Whether the kernel's word on the sender fits the link's peer.
    fn sender_ok(&self, s: &PairSocket, cred: Option<rustix::net::UCred>) -> Result<(), String> {
        let Some(c) = cred else {
            return Err("a message without sender credentials".into());
        };
        let (pid, uid) = (
            rustix::process::Pid::as_raw(Some(c.pid)) as u32,
            c.uid.as_raw(),
        );
        if uid != self.uid {
            return Err(format!(
                "a message sent by pid {pid} of uid {uid}, not our uid {}",
                self.uid
            ));
        }
        match s.pid {
            Some(want) if want != pid => Err(format!(
                "a message sent by pid {pid}, not the peer's pid {want}"
            )),
            _ => Ok(()),
        }
    }
}

impl Drop for FdMailbox {
    fn drop(&mut self) {
        fdlocal::close((self.stamp, self.scope), self.rank);
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
