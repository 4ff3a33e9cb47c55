//! Listening: a socket bound to the device's address, and the sockets of
//! the connection being accepted, gathered by their hello's index.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use crate::error::NetError;
use crate::wire::{Handle, Hello};

#[derive(Debug)]
pub(crate) struct Listener {
    pub handle: Handle,
    sock: TcpListener,
    /// Sockets of the connection being accepted, by index.
    pending: Vec<Option<TcpStream>>,
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
        Ok(Listener {
            handle: Handle {
                magic,
                listen_id: id,
                addr,
                nsocks,
            },
            sock,
            pending: (0..nsocks).map(|_| None).collect(),
        })
    }

    /// Takes the sockets that have arrived; all of a connection's, in
    /// index order, once complete. A socket whose hello is not for this
    /// listener (another magic, id or socket count, a repeated index) is
    /// an error: nothing of it is trusted.
    pub fn accept(&mut self, deadline: Duration) -> Result<Option<Vec<TcpStream>>, NetError> {
        loop {
            let (mut s, from) = match self.sock.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(&format!("listener {}", self.handle.addr), "accept", e)),
            };
            let conn = format!("connection from {from} to {}", self.handle.addr);
            s.set_nonblocking(false)
                .map_err(|e| io(&conn, "set_blocking", e))?;
            s.set_read_timeout(Some(deadline.max(Duration::from_millis(1))))
                .map_err(|e| io(&conn, "set_read_timeout", e))?;
            let mut b = [0u8; Hello::BYTES];
            s.read_exact(&mut b).map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    NetError::Timeout {
                        conn: conn.clone(),
                        what: "the connection's hello",
                        limit: deadline,
                    }
                }
                _ => io(&conn, "reading the hello", e),
            })?;
            let h = Hello::decode(&b, self.handle.magic).map_err(|err| NetError::Wire {
                conn: conn.clone(),
                err,
            })?;
            let refuse = |detail: String| NetError::Wire {
                conn: conn.clone(),
                err: crate::error::WireError::Malformed {
                    what: "hello",
                    detail,
                },
            };
            if h.listen_id != self.handle.listen_id || h.nsocks != self.handle.nsocks {
                return Err(refuse(format!(
                    "for listener {} with {} sockets, this is listener {} with {}",
                    h.listen_id, h.nsocks, self.handle.listen_id, self.handle.nsocks
                )));
            }
            let slot = &mut self.pending[h.index as usize];
            if slot.is_some() {
                return Err(refuse(format!("socket {} arrived twice", h.index)));
            }
            s.set_read_timeout(None)
                .map_err(|e| io(&conn, "set_read_timeout", e))?;
            *slot = Some(s);
            if self.pending.iter().all(Option::is_some) {
                let socks = self
                    .pending
                    .iter_mut()
                    .map(|s| s.take().expect("all some"))
                    .collect();
                return Ok(Some(socks));
            }
        }
    }
}

/// Opens the `handle.nsocks` sockets of a connection to `handle`, each
/// starting with its hello, every wait bounded by `deadline`.
pub(crate) fn connect(handle: &Handle, deadline: Duration) -> Result<Vec<TcpStream>, NetError> {
    let until = Instant::now() + deadline;
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
        let hello = Hello {
            magic: handle.magic,
            listen_id: handle.listen_id,
            index,
            nsocks: handle.nsocks,
        };
        s.write_all(&hello.encode())
            .map_err(|e| io(&conn, "sending the hello", e))?;
        s.set_write_timeout(None)
            .map_err(|e| io(&conn, "set_write_timeout", e))?;
        socks.push(s);
    }
    Ok(socks)
}
