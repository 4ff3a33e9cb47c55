//! The network's ceiling for one connection: the throughput of a single
//! plain TCP stream (std's blocking socket, default buffers) between two
//! threads over an interface, measured now. `xtask sweep --baseline`
//! compares the network transport's bus bandwidth with it; and two
//! streams at once ([`streams_throughput`]), which it prints beside.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::error::NetError;

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
    let count = count.max(1);
    let bytes = bytes.max(1);
    let pair = || -> Result<(TcpStream, TcpStream), NetError> {
        let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| io("bind", e))?;
        let addr = l.local_addr().map_err(|e| io("local_addr", e))?;
        let tx = TcpStream::connect_timeout(&addr, deadline).map_err(|e| io("connect", e))?;
        let (rx, _) = l.accept().map_err(|e| io("accept", e))?;
        for s in [&tx, &rx] {
            s.set_read_timeout(Some(deadline))
                .map_err(|e| io("timeout", e))?;
            s.set_write_timeout(Some(deadline))
                .map_err(|e| io("timeout", e))?;
        }
        Ok((tx, rx))
    };
    let pairs = (0..count).map(|_| pair()).collect::<Result<Vec<_>, _>>()?;
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
}
