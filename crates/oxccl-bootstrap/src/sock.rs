//! TCP connections with a deadline on every wait, speaking [`crate::wire`].

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use crate::error::{BootstrapError, WireError};
use crate::wire::{self, Kind, HEADER};

/// Time left until `deadline`, at least a millisecond (a zero socket
/// timeout means "block forever").
pub(crate) fn left(deadline: Instant) -> Option<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    (!d.is_zero()).then(|| d.max(Duration::from_millis(1)))
}

/// A bootstrap connection: a stream plus who is at each end (for errors).
#[derive(Debug)]
pub(crate) struct Conn {
    pub stream: TcpStream,
    pub magic: u64,
    /// This rank (or `u32::MAX` for the root).
    pub me: u32,
    /// The other end, as errors name it ("root", "rank 3", an address).
    pub peer: String,
    /// The peer's rank, when it is one.
    pub peer_rank: Option<u32>,
    /// How long the deadline was, for the timeout error.
    pub limit: Duration,
}

/// What a read found.
enum Got {
    Full,
    /// End of stream after this many bytes.
    Eof(usize),
}

impl Conn {
    pub fn new(stream: TcpStream, magic: u64, me: u32, peer: String, limit: Duration) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn {
            stream,
            magic,
            me,
            peer,
            peer_rank: None,
            limit,
        }
    }

    fn timeout(&self, what: &str) -> BootstrapError {
        BootstrapError::Timeout {
            rank: self.me,
            waiting_for: format!("{what} ({})", self.peer),
            limit: self.limit,
        }
    }

    fn lost(&self, detail: String) -> BootstrapError {
        match self.peer_rank {
            Some(peer) => BootstrapError::PeerLost {
                rank: self.me,
                peer,
                detail,
            },
            None => BootstrapError::Io {
                rank: self.me,
                what: format!("talking to {}", self.peer),
                detail,
            },
        }
    }

    pub fn wire(&self, err: WireError) -> BootstrapError {
        BootstrapError::Wire {
            rank: self.me,
            from: self.peer.clone(),
            err,
        }
    }

    fn read_full(
        &mut self,
        buf: &mut [u8],
        deadline: Instant,
        what: &str,
    ) -> Result<Got, BootstrapError> {
        let mut got = 0;
        while got < buf.len() {
            let Some(t) = left(deadline) else {
                return Err(self.timeout(what));
            };
            let _ = self.stream.set_read_timeout(Some(t));
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return Ok(Got::Eof(got)),
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost(format!("reading {what}: {e}"))),
            }
        }
        Ok(Got::Full)
    }

    /// Whether bytes (or the end of the stream) arrive before `until`;
    /// reads nothing, so a frame is never cut by this wait.
    pub fn wait_readable(&mut self, until: Instant) -> bool {
        let Some(t) = left(until) else {
            return false;
        };
        let _ = self.stream.set_read_timeout(Some(t));
        let mut b = [0u8; 1];
        match self.stream.peek(&mut b) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
            ),
        }
    }

    /// Receives one frame (any kind), bounded by `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Result<(Kind, Vec<u8>), BootstrapError> {
        let mut h = [0u8; HEADER];
        match self.read_full(&mut h, deadline, "a frame")? {
            Got::Full => {}
            Got::Eof(0) => return Err(self.lost("connection closed".into())),
            Got::Eof(n) => {
                return Err(self.wire(WireError::Truncated {
                    what: "frame header",
                    got: n,
                    want: HEADER,
                }))
            }
        }
        let (kind, len) = wire::parse_header(self.magic, &h).map_err(|e| self.wire(e))?;
        let mut body = vec![0u8; len];
        if let Got::Eof(n) = self.read_full(&mut body, deadline, "a frame payload")? {
            return Err(self.wire(WireError::Truncated {
                what: "frame payload",
                got: n,
                want: len,
            }));
        }
        Ok((kind, body))
    }

    /// Receives a frame of kind `want`; a `Fail` frame becomes
    /// [`BootstrapError::Rejected`].
    pub fn recv_kind(&mut self, want: Kind, deadline: Instant) -> Result<Vec<u8>, BootstrapError> {
        match self.recv(deadline)? {
            (k, b) if k == want => Ok(b),
            (Kind::Fail, b) => Err(BootstrapError::Rejected {
                rank: self.me,
                reason: crate::desc::decode_fail(&b),
            }),
            (k, _) => Err(self.wire(WireError::BadKind {
                got: k as u8,
                expected: want.name(),
            })),
        }
    }

    /// Sends one frame, bounded by `deadline`.
    pub fn send(
        &mut self,
        kind: Kind,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), BootstrapError> {
        if payload.len() > wire::MAX_PAYLOAD {
            return Err(BootstrapError::InvalidArgument(format!(
                "a {}-byte message exceeds the bootstrap's {}-byte frames",
                payload.len(),
                wire::MAX_PAYLOAD
            )));
        }
        let bytes = wire::frame(self.magic, kind, payload);
        let mut sent = 0;
        while sent < bytes.len() {
            let Some(t) = left(deadline) else {
                return Err(self.timeout("room to send"));
            };
            let _ = self.stream.set_write_timeout(Some(t));
            match self.stream.write(&bytes[sent..]) {
                Ok(0) => return Err(self.lost("connection closed while sending".into())),
                Ok(n) => sent += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(self.lost(format!("sending: {e}"))),
            }
        }
        Ok(())
    }
}

/// A listening socket on `ip` (port 0: any free one, else that port).
pub(crate) fn listen(addr: SocketAddr, me: u32) -> Result<TcpListener, BootstrapError> {
    let io = |e: std::io::Error| BootstrapError::io(me, format!("listening on {addr}"), &e);
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(io)?;
    s.set_reuse_address(true).map_err(io)?;
    s.bind(&addr.into()).map_err(io)?;
    s.listen(1024).map_err(io)?;
    let l: TcpListener = s.into();
    l.set_nonblocking(true).map_err(io)?;
    Ok(l)
}

/// Connects to `addr`, retrying refused connections (the listener may not
/// be up yet) until `deadline`.
pub(crate) fn connect(
    addr: SocketAddr,
    deadline: Instant,
    me: u32,
    what: &str,
    limit: Duration,
) -> Result<TcpStream, BootstrapError> {
    let mut last = String::from("no attempt");
    loop {
        let Some(t) = left(deadline) else {
            return Err(BootstrapError::Timeout {
                rank: me,
                waiting_for: format!("a connection to {what} at {addr} (last error: {last})"),
                limit,
            });
        };
        let s = match Socket::new(Domain::for_address(addr), Type::STREAM, None) {
            Ok(s) => s,
            // Out of descriptors for now: another thread may free some.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                last = format!("creating a socket: {e}");
                std::thread::sleep(Duration::from_millis(20).min(t));
                continue;
            }
            Err(e) => return Err(BootstrapError::io(me, "creating a socket", &e)),
        };
        match s.connect_timeout(&addr.into(), t.min(Duration::from_secs(2))) {
            Ok(()) => return Ok(s.into()),
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(50).min(t));
            }
        }
    }
}
