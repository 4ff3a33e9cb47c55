//! The two steps every non-blocking listener of the library repeats: take
//! the next connection from a listening socket, and read what a waiting
//! connection has sent so far. The bootstrap's gate and the network
//! transport's listener both use them, each with its own policy (how many
//! may wait, how long, what running out of descriptors does).

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};

/// What one [`accept`] found.
#[derive(Debug)]
pub enum Accepted {
    /// A new connection, not yet read.
    Conn(TcpStream, SocketAddr),
    /// None waiting now (the listener is non-blocking).
    Drained,
    /// `accept` failed for a reason of the system's (out of descriptors,
    /// or worse): the caller backs off.
    Failed(std::io::Error),
}

/// The next connection of the non-blocking listener `l`; interrupted
/// calls and connections aborted before they were taken are passed over.
pub fn accept(l: &TcpListener) -> Accepted {
    loop {
        match l.accept() {
            Ok((s, from)) => return Accepted::Conn(s, from),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Accepted::Drained,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return Accepted::Failed(e),
        }
    }
}

/// Whether `e` is the process or the system running out of descriptors
/// (`EMFILE`, `ENFILE`): shedding waiting connections helps then.
pub fn out_of_fds(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// What [`fill`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Fill {
    /// The socket has nothing more now; `buf` is not full yet.
    More,
    /// `buf` is full.
    Full,
    /// The connection is useless (closed early, or a read failed): why.
    Drop(String),
}

/// Reads from the non-blocking `s` into `buf[*got..]` until `buf` is
/// full or nothing more has arrived, advancing `got`.
pub fn fill(mut s: &TcpStream, buf: &mut [u8], got: &mut usize) -> Fill {
    while *got < buf.len() {
        match s.read(&mut buf[*got..]) {
            Ok(0) => return Fill::Drop(format!("closed after {got} bytes of its hello")),
            Ok(n) => *got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Fill::More,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Fill::Drop(format!("reading its hello: {e}")),
        }
    }
    Fill::Full
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (TcpListener, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l, c)
    }

    fn take(l: &TcpListener) -> TcpStream {
        loop {
            match accept(l) {
                Accepted::Conn(s, _) => return s,
                Accepted::Drained => std::thread::yield_now(),
                Accepted::Failed(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn fill_reads_what_came_and_says_when_full_or_closed() {
        let (l, mut c) = pair();
        let s = take(&l);
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4];
        let mut got = 0;
        assert_eq!(fill(&s, &mut buf, &mut got), Fill::More);
        c.write_all(&[1, 2, 3, 4]).unwrap();
        while fill(&s, &mut buf, &mut got) == Fill::More {
            std::thread::yield_now();
        }
        assert_eq!((buf, got), ([1, 2, 3, 4], 4));
        let (mut buf, mut got) = ([0u8; 8], 0);
        c.write_all(&[5]).unwrap();
        drop(c);
        let why = loop {
            match fill(&s, &mut buf, &mut got) {
                Fill::More => std::thread::yield_now(),
                Fill::Full => panic!("8 bytes from 1"),
                Fill::Drop(why) => break why,
            }
        };
        assert_eq!(why, "closed after 1 bytes of its hello");
    }

    #[test]
    fn accept_is_drained_when_none_waits() {
        let (l, _c) = pair();
        let _s = take(&l);
        assert!(matches!(accept(&l), Accepted::Drained));
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(out_of_fds(&emfile));
        assert!(!out_of_fds(&std::io::Error::from_raw_os_error(
            libc::EACCES
        )));
    }
}
