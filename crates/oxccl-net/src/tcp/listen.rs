//! Listening: a socket bound to the device's address, and the sockets of
//! the connection being accepted, gathered by their hello's index.
//!
//! Accepting never waits on one socket: accepted sockets are non-blocking
//! and their hellos are read as bytes arrive, each within [`HELLO_WAIT`];
//! at most [`MAX_WAITING`] wait at once (the oldest is dropped for a new
//! one, unless its hello has come whole: it is read first, so a storm
//! behind a peer's sockets does not push them out). A socket whose hello is garbage, of another communicator or
//! listener, does not prove the transport's key, repeats an index already
//! taken, or never comes, is dropped, and the listener goes on waiting for
//! the real peer. When `accept` runs out of descriptors (`EMFILE`/`ENFILE`)
//! the listener sheds its oldest waiting sockets, backs off and tries
//! again; only if that persists (half the deadline, at most 10 s) is it an
//! error, and the error says so.
//!
//! Each listener warns of the first dropped connection in full (its
//! address and why), then at most once per [`WARN_EVERY`], counting the
//! drops since and naming the latest, and once more when it closes if
//! drops went untold; every drop is logged at debug level. A storm of
//! strangers thus gives a few lines, not one per connection. Failing
//! `accept`s are told the same way.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_bootstrap::accept::{accept, fill, out_of_fds, Accepted, Fill};
use oxccl_bootstrap::Key;
use socket2::{Domain, Socket, Type};

use crate::error::NetError;
use crate::wire::{Handle, Hello, NONCE_BYTES};

/// How long an accepted socket may take to send its whole hello.
const HELLO_WAIT: Duration = Duration::from_secs(4);
/// Most sockets that may wait for their hello at one listener.
const MAX_WAITING: usize = 64;
/// Wait between `accept`s once it failed for a reason of the system's.
const BACKOFF: Duration = Duration::from_millis(10);
/// Shortest time between two warnings of one kind at one listener.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// One kind of a listener's warnings: the first in full, then at most
/// one line per [`WARN_EVERY`] counting those held back meanwhile (each
/// still logged at debug level), and a last count when the listener
/// closes.
#[derive(Debug)]
struct Quiet {
    /// What is counted, plural ("dropped connections").
    what: &'static str,
    /// When the last warning was written.
    warned: Option<Instant>,
    /// Events since, not yet in a warning.
    held: u64,
    /// The latest of those.
    latest: String,
}

impl Quiet {
    const fn new(what: &'static str) -> Quiet {
        Quiet {
            what,
            warned: None,
            held: 0,
            latest: String::new(),
        }
    }

    /// One event at listener `at`, told by `line`.
    fn note(&mut self, at: SocketAddr, line: String) {
        let now = Instant::now();
        if self.warned.is_none() {
            tracing::warn!(
                "oxccl-net: listener {at} {line} (further {} are logged at debug level and counted in one warning at most every {WARN_EVERY:?})",
                self.what
            );
            self.warned = Some(now);
            return;
        }
        tracing::debug!("oxccl-net: listener {at} {line}");
        self.held += 1;
        self.latest = line;
        self.tick(at, now);
    }

    /// Warns of the events held back once [`WARN_EVERY`] has passed.
    fn tick(&mut self, at: SocketAddr, now: Instant) {
        if self.warned.is_some_and(|t| now >= t + WARN_EVERY) {
            self.tell(at, now);
        }
    }

    /// Warns of the events held back, if any.
    fn tell(&mut self, at: SocketAddr, now: Instant) {
        let Some(since) = self.warned.filter(|_| self.held > 0) else {
            return;
        };
        tracing::warn!(
            "oxccl-net: listener {at}: {} more {} in the last {:.1?}; the latest: {}",
            self.held,
            self.what,
            now.duration_since(since),
            self.latest
        );
        self.warned = Some(now);
        self.held = 0;
    }
}

/// A socket that has not finished its hello.
#[derive(Debug)]
struct Waiting {
    s: TcpStream,
    from: SocketAddr,
    since: Instant,
    buf: [u8; Hello::BYTES],
    got: usize,
}

#[derive(Debug)]
pub(crate) struct Listener {
    pub handle: Handle,
    sock: TcpListener,
    key: Key,
    /// Sockets of the connection being accepted, by index (hellos proven).
    pending: Vec<Option<TcpStream>>,
    waiting: VecDeque<Waiting>,
    /// Fewer than [`MAX_WAITING`] once descriptors ran out.
    cap: usize,
    /// `accept` has been failing since, with this error.
    starved: Option<(Instant, String)>,
    /// No `accept` before this (backing off).
    resume: Option<Instant>,
    /// Warnings of dropped connections.
    drops: Quiet,
    /// Warnings of `accept` failing.
    stalls: Quiet,
}

impl Drop for Listener {
    fn drop(&mut self) {
        let now = Instant::now();
        self.drops.tell(self.handle.addr, now);
        self.stalls.tell(self.handle.addr, now);
    }
}

fn io(conn: &str, what: &'static str, e: std::io::Error) -> NetError {
    NetError::Io {
        conn: conn.into(),
        what,
        detail: e.to_string(),
    }
}

impl Listener {
    pub fn bind(
        ip: std::net::IpAddr,
        magic: u64,
        key: Key,
        id: u64,
        nsocks: u16,
    ) -> Result<Listener, NetError> {
        let at = SocketAddr::new(ip, 0);
        let conn = format!("listener on {ip}");
        let s = Socket::new(Domain::for_address(at), Type::STREAM, None)
            .map_err(|e| io(&conn, "socket", e))?;
        s.bind(&at.into()).map_err(|e| io(&conn, "bind", e))?;
        s.listen(128).map_err(|e| io(&conn, "listen", e))?;
        let sock: TcpListener = s.into();
        sock.set_nonblocking(true)
            .map_err(|e| io(&conn, "set_nonblocking", e))?;
        let addr = sock.local_addr().map_err(|e| io(&conn, "local_addr", e))?;
        let nonce: [u8; NONCE_BYTES] =
            oxccl_bootstrap::auth::random().map_err(|e| NetError::Io {
                conn: conn.clone(),
                what: "random nonce",
                detail: e.to_string(),
            })?;
        Ok(Listener {
            handle: Handle {
                magic,
                listen_id: id,
                addr,
                nsocks,
                nonce,
            },
            sock,
            key,
            pending: (0..nsocks).map(|_| None).collect(),
            waiting: VecDeque::new(),
            cap: MAX_WAITING,
            starved: None,
            resume: None,
            drops: Quiet::new("dropped connections"),
            stalls: Quiet::new("failed accepts"),
        })
    }

    fn drop_one(&mut self, w: Waiting, why: &str) {
        self.drops.note(
            self.handle.addr,
            format!("dropped a connection from {}: {why}", w.from),
        );
    }

    /// Takes the sockets that have arrived; all of a connection's, in
    /// index order, once complete (see the module's docs for what is
    /// dropped). An error only when `accept` itself keeps failing.
    pub fn accept(&mut self, deadline: Duration) -> Result<Option<Vec<TcpStream>>, NetError> {
        let now = Instant::now();
        self.drops.tick(self.handle.addr, now);
        self.stalls.tick(self.handle.addr, now);
        let wait = HELLO_WAIT.min(deadline.max(Duration::from_millis(1)));
        while self.waiting.front().is_some_and(|w| now >= w.since + wait) {
            let w = self.waiting.pop_front().expect("a front");
            if let Some(w) = self.read(w) {
                self.drop_one(w, &format!("no whole hello within {wait:?}"));
            }
        }
        if self.resume.is_some_and(|t| now >= t) {
            self.resume = None;
        }
        if self.resume.is_none() {
            self.accept_all(now, deadline)?;
        }
        for w in std::mem::take(&mut self.waiting) {
            if let Some(w) = self.read(w) {
                self.waiting.push_back(w);
            }
        }
        if self.pending.iter().all(Option::is_some) {
            let socks = self
                .pending
                .iter_mut()
                .map(|s| s.take().expect("all some"))
                .collect();
            return Ok(Some(socks));
        }
        Ok(None)
    }

    /// Reads what `w` has sent so far: a whole hello is taken (its socket
    /// joins the connection) or dropped, as is a socket that failed; one
    /// still short of its hello comes back.
    fn read(&mut self, mut w: Waiting) -> Option<Waiting> {
        match fill(&w.s, &mut w.buf, &mut w.got) {
            Fill::More => return Some(w),
            Fill::Drop(why) => self.drop_one(w, &why),
            Fill::Full => match self.take(&w) {
                Err(why) => self.drop_one(w, &why),
                Ok(index) => match w.s.set_nonblocking(false) {
                    Ok(()) => self.pending[index] = Some(w.s),
                    Err(e) => self.drop_one(w, &format!("set_nonblocking: {e}")),
                },
            },
        }
        None
    }

    /// Makes room for one more waiting socket: the oldest goes, unless
    /// its hello has come whole meanwhile (a peer writes it right after
    /// connecting), so strangers arriving behind a peer's sockets never
    /// push them out unread.
    fn shed_oldest(&mut self, why: &str) {
        let w = self.waiting.pop_front().expect("a waiting socket");
        if let Some(w) = self.read(w) {
            self.drop_one(w, why);
        }
    }

    /// Whether a whole hello is for this listener, proves the key and
    /// takes a free index: that index.
    fn take(&self, w: &Waiting) -> Result<usize, String> {
        let h = Hello::decode(&w.buf, self.handle.magic).map_err(|e| e.to_string())?;
        if h.listen_id != self.handle.listen_id || h.nsocks != self.handle.nsocks {
            return Err(format!(
                "for listener {} with {} sockets, this is listener {} with {}",
                h.listen_id, h.nsocks, self.handle.listen_id, self.handle.nsocks
            ));
        }
        if !h.verify(&self.handle, &self.key) {
            return Err(
                "its hello does not prove the communicator's key (a stranger, or another unique id)"
                    .into(),
            );
        }
        if self.pending[h.index as usize].is_some() {
            return Err(format!("socket {} arrived twice", h.index));
        }
        Ok(h.index as usize)
    }

    fn accept_all(&mut self, now: Instant, deadline: Duration) -> Result<(), NetError> {
        loop {
            match accept(&self.sock) {
                Accepted::Conn(s, from) => {
                    self.starved = None;
                    if let Err(e) = s.set_nonblocking(true) {
                        self.drops.note(
                            self.handle.addr,
                            format!("dropped a connection from {from}: set_nonblocking: {e}"),
                        );
                        continue;
                    }
                    if self.waiting.len() >= self.cap {
                        self.shed_oldest(&format!("{} connections wait for their hello", self.cap));
                    }
                    self.waiting.push_back(Waiting {
                        s,
                        from,
                        since: now,
                        buf: [0; Hello::BYTES],
                        got: 0,
                    });
                }
                Accepted::Drained => return Ok(()),
                Accepted::Failed(e) => {
                    let out_of_fds = out_of_fds(&e);
                    let since = match &self.starved {
                        Some((t, _)) => *t,
                        None => {
                            self.stalls.note(
                                self.handle.addr,
                                format!("accept failed ({e}); backing off"),
                            );
                            self.starved = Some((now, e.to_string()));
                            now
                        }
                    };
                    let give_up = (deadline / 2).min(Duration::from_secs(10));
                    if now.duration_since(since) >= give_up {
                        return Err(NetError::Io {
                            conn: format!("listener {}", self.handle.addr),
                            what: "accept",
                            detail: format!(
                                "{e}, for {:.1?} without a break{}",
                                now.duration_since(since),
                                if out_of_fds {
                                    ": the process is out of file descriptors (raise `ulimit -n`)"
                                } else {
                                    ""
                                }
                            ),
                        });
                    }
                    if out_of_fds {
                        // Keep fewer waiting from now on and free some now.
                        self.cap = (self.waiting.len() / 2).clamp(2, MAX_WAITING);
                        while self.waiting.len() > self.cap {
                            self.shed_oldest("descriptors ran out; shedding the oldest");
                        }
                    }
                    self.resume = Some(now + BACKOFF);
                    return Ok(());
                }
            }
        }
    }
}

/// Opens the `handle.nsocks` sockets of a connection to `handle`, each
/// starting with its hello signed with `key`, every wait bounded by
/// `deadline`.
pub(crate) fn connect(
    handle: &Handle,
    key: &Key,
    deadline: Duration,
) -> Result<Vec<TcpStream>, NetError> {
    let until = Instant::now() + deadline.min(oxccl_bootstrap::MAX_LIMIT);
    let conn = format!("connection to {}", handle.addr);
    let mut socks = Vec::with_capacity(handle.nsocks as usize);
    for index in 0..handle.nsocks {
        let s = Socket::new(Domain::for_address(handle.addr), Type::STREAM, None)
            .map_err(|e| io(&conn, "socket", e))?;
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        s.connect_timeout(&handle.addr.into(), left)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                    NetError::Timeout {
                        conn: conn.clone(),
                        what: "the listener to answer",
                        limit: deadline,
                    }
                }
                _ => io(&conn, "connect", e),
            })?;
        let mut s: TcpStream = s.into();
        s.set_write_timeout(Some(left))
            .map_err(|e| io(&conn, "set_write_timeout", e))?;
        s.write_all(&Hello::sign(handle, index, key).encode())
            .map_err(|e| io(&conn, "sending the hello", e))?;
        s.set_write_timeout(None)
            .map_err(|e| io(&conn, "set_write_timeout", e))?;
        socks.push(s);
    }
    Ok(socks)
}
