//! The proof every bootstrap connection starts with, and the acceptor's
//! side of it: a [`Gate`] that reads many hellos at once.
//!
//! 1. The acceptor sends a `Challenge` frame: a fresh random nonce.
//! 2. The connector answers with its hello frame (`Hello` to the root,
//!    `Peer` on the ring and the mesh): the body, its own nonce and
//!    `MAC(key, role, magic, acceptor's nonce, connector's nonce, body)`.
//! 3. The acceptor checks the MAC and answers `Ack`:
//!    `MAC(key, role ack, magic, both nonces, body)`; the connector checks
//!    it before it trusts anything the acceptor says (a table, a ring).
//!
//! The nonces make every proof fresh (a recorded hello cannot be
//! replayed), the role string keeps a proof for the root from passing on
//! the ring, and the key never travels.
//!
//! A [`Gate`] serves one listener without a thread of its own: accepted
//! sockets are non-blocking and read as their bytes come, each with
//! [`HELLO_WAIT`] to finish its hello; garbage, a wrong magic, a wrong
//! kind, an absurd length (refused before anything is allocated) or a
//! failed proof drops that one connection with a WARN naming its address.
//! At most [`MAX_PENDING`] connections wait for their hello (the oldest is
//! dropped for a new one). When `accept` fails for want of descriptors
//! (`EMFILE`/`ENFILE`), the gate sheds its oldest waiting connections,
//! keeps fewer from then on, backs off and tries again; the error a rank
//! sees at its deadline says so.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::accept::{self, Accepted, Fill};
use crate::auth::{self, Key, MAC_BYTES, NONCE_BYTES};
use crate::error::{BootstrapError, WireError};
use crate::sock::{self, Conn};
use crate::wire::{self, Kind, HEADER};

/// How long an accepted connection may take to send its whole hello.
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(4);
/// Most connections that may wait for their hello at one listener.
pub(crate) const MAX_PENDING: usize = 128;
/// Largest hello body a gate reads: a descriptor with its longest strings
/// is about 2.1 KiB; anything announcing more is dropped unread.
pub(crate) const MAX_HELLO: usize = 4096;
/// Descriptors a gate leaves to the rest of its process once `accept`
/// ran out of them.
const FD_HEADROOM: usize = 16;
/// Wait between `accept`s once it failed for a reason of the system's.
const BACKOFF: Duration = Duration::from_millis(10);
/// How long a connector waits between attempts that failed before the
/// acceptor answered (the acceptor dropped it, or was not up yet).
const RETRY: Duration = Duration::from_millis(50);

/// A hello's payload as (body, connector's nonce, MAC); `None` when it is
/// too short to carry a proof.
pub(crate) fn split_proof(payload: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let at = payload.len().checked_sub(NONCE_BYTES + MAC_BYTES)?;
    let (body, rest) = payload.split_at(at);
    let (nc, mac) = rest.split_at(NONCE_BYTES);
    Some((body, nc, mac))
}

/// Whether `payload` proves `key` for the acceptor's nonce `na` (what the
/// gate checks, without the socket): for fuzzing.
pub(crate) fn proves(key: &Key, role: &str, magic: u64, na: &[u8], payload: &[u8]) -> bool {
    split_proof(payload).is_some_and(|(body, nc, mac)| {
        key.verify(&hello_ctx(role), &[&magic.to_le_bytes(), na, nc, body], mac)
    })
}

fn hello_ctx(role: &str) -> String {
    format!("oxccl bootstrap hello/{role}")
}

fn ack_ctx(role: &str) -> String {
    format!("oxccl bootstrap ack/{role}")
}

/// The connector's side, after `stream` connected: answers the challenge
/// with `body` and checks the acceptor's proof. Waits for the challenge
/// and the ack until `ack_deadline`.
pub(crate) fn greet(
    c: &mut Conn,
    key: &Key,
    role: &str,
    kind: Kind,
    body: &[u8],
    ack_deadline: Instant,
) -> Result<(), BootstrapError> {
    let chal = c.recv_kind(Kind::Challenge, ack_deadline)?;
    if chal.len() != NONCE_BYTES {
        return Err(c.wire(WireError::Malformed {
            what: "challenge",
            detail: format!("{} bytes, a nonce has {NONCE_BYTES}", chal.len()),
        }));
    }
    let nc = auth::nonce()?;
    let magic = c.magic.to_le_bytes();
    let parts: [&[u8]; 4] = [&magic, &chal, &nc, body];
    let mac = key.mac(&hello_ctx(role), &parts);
    let mut payload = Vec::with_capacity(body.len() + NONCE_BYTES + MAC_BYTES);
    payload.extend_from_slice(body);
    payload.extend_from_slice(&nc);
    payload.extend_from_slice(&mac);
    c.send(kind, &payload, ack_deadline)?;
    let ack = c.recv_kind(Kind::Ack, ack_deadline)?;
    if !key.verify(&ack_ctx(role), &parts, &ack) {
        return Err(c.wire(WireError::BadProof {
            what: "the listener's answer",
        }));
    }
    Ok(())
}

/// Connects to `addr` and [`greet`]s it, trying again while the attempt
/// fails before the acceptor answered (refused, dropped, reset), until
/// `deadline`; the challenge and the ack may take until `ack_deadline`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_greet(
    addr: SocketAddr,
    deadline: Instant,
    ack_deadline: Instant,
    me: u32,
    who: &str,
    peer_rank: Option<u32>,
    limit: Duration,
    magic: u64,
    key: &Key,
    role: &str,
    kind: Kind,
    body: &[u8],
) -> Result<Conn, BootstrapError> {
    loop {
        let s = sock::connect(addr, deadline, me, who, limit)?;
        let mut c = Conn::new(s, magic, me, who.to_string(), limit);
        c.peer_rank = peer_rank;
        match greet(&mut c, key, role, kind, body, ack_deadline) {
            Ok(()) => return Ok(c),
            Err(e @ (BootstrapError::Io { .. } | BootstrapError::PeerLost { .. }))
                if Instant::now() + RETRY < deadline =>
            {
                tracing::debug!(%e, "oxccl bootstrap: {who} dropped the connection before answering; trying again");
                std::thread::sleep(RETRY);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A hello whose proof held: the connection (blocking again) and the body.
#[derive(Debug)]
pub(crate) struct Verified {
    pub conn: Conn,
    pub body: Vec<u8>,
    pub from: SocketAddr,
    na: [u8; NONCE_BYTES],
    nc: [u8; NONCE_BYTES],
}

impl Verified {
    /// Answers the hello with the acceptor's proof.
    pub fn ack(&mut self, key: &Key, role: &str, deadline: Instant) -> Result<(), BootstrapError> {
        let magic = self.conn.magic.to_le_bytes();
        let mac = key.mac(&ack_ctx(role), &[&magic, &self.na, &self.nc, &self.body]);
        self.conn.send(Kind::Ack, &mac, deadline)
    }
}

/// A connection that has not finished its hello.
#[derive(Debug)]
struct Pending {
    s: TcpStream,
    from: SocketAddr,
    since: Instant,
    nonce: [u8; NONCE_BYTES],
    /// Header, then payload once its length is known.
    buf: Vec<u8>,
    got: usize,
}

enum Step {
    /// Still reading.
    More,
    /// The whole frame is in `buf`.
    Done,
    /// Dropped: why.
    Drop(String),
}

impl Pending {
    /// Reads what has arrived.
    fn read(&mut self, magic: u64, want: Kind) -> Step {
        loop {
            if self.got == self.buf.len() {
                if self.buf.len() > HEADER {
                    return Step::Done;
                }
                let h: &[u8; HEADER] = self.buf[..HEADER].try_into().expect("a header");
                let (kind, len) = match wire::parse_header(magic, h) {
                    Ok(x) => x,
                    Err(e) => return Step::Drop(e.to_string()),
                };
                if kind != want {
                    return Step::Drop(
                        WireError::BadKind {
                            got: kind as u8,
                            expected: want.name(),
                        }
                        .to_string(),
                    );
                }
                if len > MAX_HELLO + NONCE_BYTES + MAC_BYTES {
                    return Step::Drop(
                        WireError::Oversized {
                            len,
                            max: MAX_HELLO + NONCE_BYTES + MAC_BYTES,
                        }
                        .to_string(),
                    );
                }
                if len < NONCE_BYTES + MAC_BYTES {
                    return Step::Drop(format!("a {len}-byte hello cannot carry a proof"));
                }
                self.buf.resize(HEADER + len, 0);
            }
            match accept::fill(&self.s, &mut self.buf, &mut self.got) {
                Fill::Full => {}
                Fill::More => return Step::More,
                Fill::Drop(why) => return Step::Drop(why),
            }
        }
    }
}

/// The acceptor's side of one listener (see the module's docs).
#[derive(Debug)]
pub(crate) struct Gate {
    magic: u64,
    key: Key,
    role: String,
    want: Kind,
    me: u32,
    limit: Duration,
    pending: VecDeque<Pending>,
    /// Fewer than [`MAX_PENDING`] once descriptors ran out.
    cap: usize,
    /// `accept` has been failing since, with this error.
    starved: Option<(Instant, String)>,
    /// No `accept` before this (backing off).
    resume: Option<Instant>,
}

impl Gate {
    pub fn new(magic: u64, key: Key, role: &str, want: Kind, me: u32, limit: Duration) -> Gate {
        Gate {
            magic,
            key,
            role: role.to_string(),
            want,
            me,
            limit,
            pending: VecDeque::new(),
            cap: MAX_PENDING,
            starved: None,
            resume: None,
        }
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// What a deadline error should add: `accept` failing for want of
    /// descriptors, if it still is.
    pub fn starved_note(&self) -> String {
        match &self.starved {
            Some((since, e)) => format!(
                " (accepting connections has failed for {:.1?} with \"{e}\": raise the \
                 descriptor limit, `ulimit -n`)",
                since.elapsed()
            ),
            None => String::new(),
        }
    }

    fn drop_one(&self, p: Pending, why: &str) {
        tracing::warn!(
            "oxccl bootstrap {} listener dropped a connection from {}: {why}",
            self.role,
            p.from
        );
    }

    /// The descriptors to poll: `l` (unless backing off) and every waiting
    /// connection.
    pub fn poll_fds<'a>(&'a self, l: &'a TcpListener, out: &mut Vec<PollFd<'a>>) {
        if self.resume.is_none() {
            out.push(PollFd::new(l, PollFlags::IN));
        }
        out.extend(
            self.pending
                .iter()
                .map(|p| PollFd::new(&p.s, PollFlags::IN)),
        );
    }

    /// When this gate next has something to do without being polled: a
    /// hello's time running out, or the end of a back-off.
    pub fn next_wake(&self) -> Option<Instant> {
        let first = self.pending.front().map(|p| p.since + HELLO_WAIT);
        match (first, self.resume) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Accepts what `l` has, reads what the waiting connections sent, and
    /// returns the hellos whose proof held (the caller acks or drops them).
    pub fn advance(&mut self, l: &TcpListener) -> Vec<Verified> {
        let now = Instant::now();
        while self
            .pending
            .front()
            .is_some_and(|p| now >= p.since + HELLO_WAIT)
        {
            let p = self.pending.pop_front().expect("a front");
            self.drop_one(p, &format!("no whole hello within {HELLO_WAIT:?}"));
        }
        if self.resume.is_some_and(|t| now >= t) {
            self.resume = None;
        }
        if self.resume.is_none() {
            self.accept_all(l, now);
        }
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            match self.pending[i].read(self.magic, self.want) {
                Step::More => i += 1,
                Step::Drop(why) => {
                    let p = self.pending.remove(i).expect("in range");
                    if why.contains("wrong magic") {
                        // Best effort: a rank holding another id learns why.
                        let f = wire::frame(
                            self.magic,
                            Kind::Fail,
                            b"wrong magic: this listener serves another unique id",
                        );
                        let _ = (&p.s).write(&f);
                    }
                    self.drop_one(p, &why);
                }
                Step::Done => {
                    let p = self.pending.remove(i).expect("in range");
                    match self.check(p) {
                        Ok(v) => out.push(v),
                        Err(bad) => {
                            let (p, why) = *bad;
                            // Best effort: a rank given another key (a
                            // different `OXCCL_COMM_SECRET`) learns why at
                            // once; a stranger learns nothing it did not know.
                            let f = wire::frame(
                                self.magic,
                                Kind::Fail,
                                format!(
                                    "{why}: check that every rank has the same unique id (or \
                                     OXCCL_COMM_SECRET) and runs the same oxccl build"
                                )
                                .as_bytes(),
                            );
                            let _ = (&p.s).write(&f);
                            self.drop_one(p, &why);
                        }
                    }
                }
            }
        }
        out
    }

    fn accept_all(&mut self, l: &TcpListener, now: Instant) {
        loop {
            match accept::accept(l) {
                Accepted::Conn(s, from) => {
                    self.starved = None;
                    if let Err(e) = self.admit(s, from, now) {
                        tracing::warn!(
                            "oxccl bootstrap {} listener dropped a connection from {from}: {e}",
                            self.role
                        );
                    }
                }
                Accepted::Drained => return,
                Accepted::Failed(e) => {
                    let out_of_fds = accept::out_of_fds(&e);
                    if self.starved.is_none() {
                        tracing::warn!(
                            "oxccl bootstrap {} listener: accept failed ({e}); backing off",
                            self.role
                        );
                        self.starved = Some((now, e.to_string()));
                    }
                    if out_of_fds {
                        // Keep fewer waiting from now on, leaving descriptors
                        // to the rest of the process, and free some now.
                        self.cap = self
                            .pending
                            .len()
                            .saturating_sub(FD_HEADROOM)
                            .clamp(4, MAX_PENDING);
                        while self.pending.len() > self.cap {
                            let p = self.pending.pop_front().expect("over the cap");
                            self.drop_one(p, "descriptors ran out; shedding the oldest");
                        }
                    }
                    self.resume = Some(now + BACKOFF);
                    return;
                }
            }
        }
    }

    /// Takes an accepted socket: non-blocking, challenged, waiting.
    fn admit(&mut self, s: TcpStream, from: SocketAddr, now: Instant) -> std::io::Result<()> {
        s.set_nonblocking(true)?;
        let _ = s.set_nodelay(true);
        let nonce = auth::nonce().map_err(|e| std::io::Error::other(e.to_string()))?;
        let f = wire::frame(self.magic, Kind::Challenge, &nonce);
        // A fresh socket's buffer takes 48 bytes at once.
        if (&s).write(&f)? != f.len() {
            return Err(std::io::Error::other("the challenge did not fit"));
        }
        if self.pending.len() >= self.cap {
            let p = self.pending.pop_front().expect("at the cap");
            self.drop_one(p, &format!("{} connections wait for their hello", self.cap));
        }
        self.pending.push_back(Pending {
            s,
            from,
            since: now,
            nonce,
            buf: vec![0u8; HEADER],
            got: 0,
        });
        Ok(())
    }

    /// A whole hello: its proof, checked.
    fn check(&self, p: Pending) -> Result<Verified, Box<(Pending, String)>> {
        let magic = self.magic.to_le_bytes();
        let Some((body, nc, mac)) = split_proof(&p.buf[HEADER..]) else {
            let why = WireError::BadProof { what: "its hello" }.to_string();
            return Err(Box::new((p, why)));
        };
        if !self
            .key
            .verify(&hello_ctx(&self.role), &[&magic, &p.nonce, nc, body], mac)
        {
            let why = WireError::BadProof { what: "its hello" }.to_string();
            return Err(Box::new((p, why)));
        }
        if let Err(e) = p.s.set_nonblocking(false) {
            return Err(Box::new((p, format!("set_nonblocking: {e}"))));
        }
        let nc: [u8; NONCE_BYTES] = nc.try_into().expect("a nonce");
        let body = body.to_vec();
        let mut conn = Conn::new(
            p.s,
            self.magic,
            self.me,
            format!("connection from {}", p.from),
            self.limit,
        );
        conn.peer = format!("connection from {}", p.from);
        Ok(Verified {
            conn,
            body,
            from: p.from,
            na: p.nonce,
            nc,
        })
    }

    /// Waits (up to 100 ms, or until `deadline`) for something to do on
    /// `l`, then [`Gate::advance`]s: for a caller that serves one listener
    /// from its own thread.
    pub fn wait(&mut self, l: &TcpListener, deadline: Instant) -> Vec<Verified> {
        let now = Instant::now();
        let mut until = deadline.min(now + Duration::from_millis(100));
        if let Some(w) = self.next_wake() {
            until = until.min(w);
        }
        let t = until.saturating_duration_since(now);
        {
            let mut fds = Vec::with_capacity(1 + self.pending.len());
            self.poll_fds(l, &mut fds);
            let ts = Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            };
            if fds.is_empty() {
                std::thread::sleep(t);
            } else {
                let _ = poll(&mut fds, Some(&ts));
            }
        }
        self.advance(l)
    }
}
