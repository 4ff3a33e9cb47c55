//! Non-blocking socket reads and writes that never raise SIGPIPE.

use std::io::IoSlice;
use std::os::fd::AsFd;

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};

/// What one attempt moved.
pub(crate) enum Moved {
    Bytes(usize),
    /// The socket would block: wait for readiness.
    Blocked,
    /// The peer closed its end (a read of zero bytes).
    Closed,
}

/// Writes what the socket takes of `buf`.
pub(crate) fn send(fd: impl AsFd, buf: &[u8]) -> Result<Moved, Errno> {
    loop {
        match rustix::net::send(&fd, buf, SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
            Ok(n) => return Ok(Moved::Bytes(n)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(Moved::Blocked),
            Err(e) => return Err(e),
        }
    }
}

/// Writes what the socket takes of `head` then `body` in one system call
/// (a part's header and its body: a small message leaves in one segment
/// and one syscall instead of two).
pub(crate) fn send2(fd: impl AsFd, head: &[u8], body: &[u8]) -> Result<Moved, Errno> {
    if head.is_empty() {
        return send(fd, body);
    }
    let iov = [IoSlice::new(head), IoSlice::new(body)];
    loop {
        let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
        match rustix::net::sendmsg(&fd, &iov, &mut SendAncillaryBuffer::default(), flags) {
            Ok(n) => return Ok(Moved::Bytes(n)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(Moved::Blocked),
            Err(e) => return Err(e),
        }
    }
}

/// Reads what the socket has, up to `buf.len()` bytes.
pub(crate) fn recv(fd: impl AsFd, buf: &mut [u8]) -> Result<Moved, Errno> {
    if buf.is_empty() {
        return Ok(Moved::Bytes(0));
    }
    loop {
        match rustix::net::recv(&fd, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(Moved::Closed),
            Ok((n, _)) => return Ok(Moved::Bytes(n)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(Moved::Blocked),
            Err(e) => return Err(e),
        }
    }
}
