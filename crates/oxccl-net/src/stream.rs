//! The network's ceiling for one connection: the throughput of a single
//! plain TCP stream (std's blocking socket, default buffers) between two
//! threads over an interface, measured now. `xtask sweep --baseline`
//! compares the network transport's bus bandwidth with it; and two
//! streams at once ([`streams_throughput`]), which it prints beside.
//!
//! The listener is open to anyone who can reach the interface, so the
//! connecting side first sends a fresh random nonce, and the accepting
//! side takes only the connection that sends it back (compared in
//! constant time): others are dropped and it keeps waiting, within the
//! probe's deadline. A stranger who connects first is never measured.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_bootstrap::accept::{accept, fill, Accepted, Fill};

use crate::error::NetError;

/// Bytes of the nonce that proves a probe's connection is its own.
const NONCE_BYTES: usize = 32;
/// Most connections waiting for their nonce at once; the oldest is
/// dropped for a newer one.
const MAX_WAITING: usize = 64;

fn io(what: &'static str, e: std::io::Error) -> NetError {
    NetError::Io {
        conn: "the baseline stream".into(),
        what,
        detail: e.to_string(),
    }
}

/// GB/s of one TCP stream to `ip` (this host's address) carrying `bytes`
/// bytes, the best of `rounds` transfers (each ends with the receiver's
/// one-byte acknowledgement). Every wait is bounded by `deadline`.
pub fn stream_throughput(
    ip: IpAddr,
    bytes: usize,
    rounds: u32,
    deadline: Duration,
) -> Result<f64, NetError> {
    streams_throughput(ip, bytes, 1, rounds, deadline)
}

/// GB/s of each of `count` such streams run at once, each with its own
/// sending and receiving thread (the slowest stream of the best of
/// `rounds`). With 2: what two ranks exchanging over one host's loopback
/// can move each way at once, where both directions' system calls share
/// its cores. A 2-rank ring AllReduce sends and receives its whole size
/// on every rank, so that, not [`stream_throughput`], bounds its busbw
/// there.
pub fn streams_throughput(
    ip: IpAddr,
    bytes: usize,
    count: usize,
    rounds: u32,
    deadline: Duration,
) -> Result<f64, NetError> {
    measure(ip, bytes, count, rounds, deadline, &|_| {})
}

/// A connected pair over `ip`: the connecting end and the accepted one,
/// proven the same by the nonce. `listening` runs once the listener is
/// bound, before the connecting end connects (tests put strangers there).
fn pair(
    ip: IpAddr,
    deadline: Duration,
    listening: &dyn Fn(SocketAddr),
) -> Result<(TcpStream, TcpStream), NetError> {
    let until = Instant::now() + deadline.min(oxccl_bootstrap::MAX_LIMIT);
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| io("bind", e))?;
    l.set_nonblocking(true)
        .map_err(|e| io("set_nonblocking", e))?;
    let addr = l.local_addr().map_err(|e| io("local_addr", e))?;
    listening(addr);
    let nonce: [u8; NONCE_BYTES] = oxccl_bootstrap::auth::random().map_err(|e| NetError::Io {
        conn: "the baseline stream".into(),
        what: "random nonce",
        detail: e.to_string(),
    })?;
    let mut tx = TcpStream::connect_timeout(&addr, deadline).map_err(|e| io("connect", e))?;
    tx.set_write_timeout(Some(deadline))
        .map_err(|e| io("timeout", e))?;
    tx.write_all(&nonce)
        .map_err(|e| io("sending the nonce", e))?;
    let rx = take_own(&l, &nonce, until)?;
    for s in [&tx, &rx] {
        s.set_read_timeout(Some(deadline))
            .map_err(|e| io("timeout", e))?;
        s.set_write_timeout(Some(deadline))
            .map_err(|e| io("timeout", e))?;
    }
    Ok((tx, rx))
}

/// An accepted connection, and the bytes of its nonce read so far.
type Waiting = (TcpStream, [u8; NONCE_BYTES], usize);

/// Whether a waiting connection is the probe's own: `Some(true)` once its
/// nonce came whole and matches `want` (compared in constant time:
/// `blake3::Hash`'s equality), `Some(false)` for one to drop, `None`
/// while its nonce is still short.
fn own(w: &mut Waiting, want: &blake3::Hash) -> Option<bool> {
    let (s, buf, got) = w;
    match fill(s, buf, got) {
        Fill::More => None,
        Fill::Full if blake3::Hash::from(*buf) == *want => Some(true),
        Fill::Full => {
            tracing::debug!("oxccl-net: baseline stream: dropped a stranger's connection");
            Some(false)
        }
        Fill::Drop(why) => {
            tracing::debug!("oxccl-net: baseline stream: dropped a connection: {why}");
            Some(false)
        }
    }
}

/// The connection at `l` (non-blocking) whose first bytes are `nonce`,
/// by `until`; every other one is dropped.
fn take_own(
    l: &TcpListener,
    nonce: &[u8; NONCE_BYTES],
    until: Instant,
) -> Result<TcpStream, NetError> {
    let want = blake3::Hash::from(*nonce);
    let found = |s: TcpStream| -> Result<TcpStream, NetError> {
        s.set_nonblocking(false)
            .map_err(|e| io("set_nonblocking", e))?;
        Ok(s)
    };
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    loop {
        loop {
            match accept(l) {
                Accepted::Conn(s, from) => {
                    if let Err(e) = s.set_nonblocking(true) {
                        tracing::debug!("oxccl-net: baseline stream: dropped {from}: {e}");
                        continue;
                    }
                    waiting.push_back((s, [0; NONCE_BYTES], 0));
                    if waiting.len() > MAX_WAITING {
                        // The oldest goes, read first: it may be ours.
                        let mut w = waiting.pop_front().expect("a waiting connection");
                        if own(&mut w, &want) == Some(true) {
                            return found(w.0);
                        }
                    }
                }
                Accepted::Drained => break,
                Accepted::Failed(e) => return Err(io("accept", e)),
            }
        }
        let mut i = 0;
        while i < waiting.len() {
            match own(&mut waiting[i], &want) {
                None => i += 1,
                Some(true) => return found(waiting.remove(i).expect("an index in range").0),
                Some(false) => drop(waiting.remove(i)),
            }
        }
        if Instant::now() >= until {
            return Err(io(
                "accept",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "its own connection never came (only strangers')",
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// [`streams_throughput`], with `listening` run at each pair's listener.
fn measure(
    ip: IpAddr,
    bytes: usize,
    count: usize,
    rounds: u32,
    deadline: Duration,
    listening: &dyn Fn(SocketAddr),
) -> Result<f64, NetError> {
    let count = count.max(1);
    let bytes = bytes.max(1);
    let pairs = (0..count)
        .map(|_| pair(ip, deadline, listening))
        .collect::<Result<Vec<_>, _>>()?;
    let data = vec![0x5au8; bytes];
    let mut best = Duration::MAX;
    for _ in 0..rounds.max(1) {
        let start = std::sync::Barrier::new(2 * count);
        let slowest = std::thread::scope(|sc| -> Result<Duration, NetError> {
            let mut senders = Vec::new();
            for (tx, rx) in &pairs {
                let (start, data) = (&start, &data);
                senders.push(sc.spawn(move || -> Result<Duration, NetError> {
                    start.wait();
                    let t = Instant::now();
                    (&*tx).write_all(data).map_err(|e| io("write", e))?;
                    let mut ack = [0u8; 1];
                    (&*tx).read_exact(&mut ack).map_err(|e| io("ack", e))?;
                    Ok(t.elapsed())
                }));
                sc.spawn(move || -> Result<(), NetError> {
                    let mut buf = vec![0u8; 1 << 20];
                    start.wait();
                    let mut got = 0;
                    while got < bytes {
                        let want = (bytes - got).min(buf.len());
                        match (&*rx).read(&mut buf[..want]).map_err(|e| io("read", e))? {
                            0 => return Err(io("read", std::io::ErrorKind::UnexpectedEof.into())),
                            n => got += n,
                        }
                    }
                    (&*rx).write_all(&[1]).map_err(|e| io("ack", e))
                });
            }
            let mut slowest = Duration::ZERO;
            for h in senders {
                let t = h
                    .join()
                    .map_err(|_| io("sender", std::io::Error::other("panicked")))??;
                slowest = slowest.max(t);
            }
            Ok(slowest)
        })?;
        best = best.min(slowest);
    }
    Ok(bytes as f64 / best.as_secs_f64().max(1e-9) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_and_two_at_once_over_loopback_move_bytes() {
        let lo = "127.0.0.1".parse().unwrap();
        for count in [1, 2] {
            let gbps = streams_throughput(lo, 1 << 20, count, 2, Duration::from_secs(30)).unwrap();
            assert!(gbps > 0.0 && gbps.is_finite(), "{gbps}");
        }
    }

    /// Strangers who connect to a probe's listener before the probe does
    /// (one sending bytes that look like the stream's, one silent) are
    /// dropped unused, never measured, and the probe completes.
    #[test]
    fn strangers_connecting_first_are_dropped_and_the_probe_completes() {
        let lo = "127.0.0.1".parse().unwrap();
        for count in [1, 2] {
            let strangers = std::sync::Mutex::new(Vec::new());
            let listening = |at: SocketAddr| {
                let mut noisy = TcpStream::connect(at).unwrap();
                noisy.write_all(&[0x5a; 40]).unwrap();
                let silent = TcpStream::connect(at).unwrap();
                strangers.lock().unwrap().extend([noisy, silent]);
            };
            let gbps = measure(lo, 1 << 20, count, 2, Duration::from_secs(30), &listening)
                .expect("the probe completes despite the strangers");
            assert!(gbps > 0.0 && gbps.is_finite(), "{gbps}");
            let strangers = strangers.into_inner().unwrap();
            assert_eq!(strangers.len(), 2 * count);
            for (i, mut s) in strangers.into_iter().enumerate() {
                // A hang guard, not a measurement: the probe has returned,
                // so a stranger it dropped reads its end at once.
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut b = [0u8; 8];
                match s.read(&mut b) {
                    Ok(0) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    other => panic!("stranger {i} was not dropped: {other:?}"),
                }
            }
        }
    }
}
