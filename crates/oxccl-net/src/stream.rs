//! The network's ceiling for one connection: the throughput of a single
//! plain TCP stream (std's blocking socket, default buffers) between two
//! threads over an interface, measured now. `xtask sweep --baseline`
//! compares the network transport's bus bandwidth with it.

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
    let bytes = bytes.max(1);
    let rounds = rounds.max(1);
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| io("bind", e))?;
    let addr = l.local_addr().map_err(|e| io("local_addr", e))?;
    let receiver = std::thread::spawn(move || -> Result<(), NetError> {
        let (mut s, _) = l.accept().map_err(|e| io("accept", e))?;
        s.set_read_timeout(Some(deadline))
            .map_err(|e| io("timeout", e))?;
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..rounds {
            let mut got = 0;
            while got < bytes {
                let want = (bytes - got).min(buf.len());
                match s.read(&mut buf[..want]).map_err(|e| io("read", e))? {
                    0 => return Err(io("read", std::io::ErrorKind::UnexpectedEof.into())),
                    n => got += n,
                }
            }
            s.write_all(&[1]).map_err(|e| io("ack", e))?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect_timeout(&addr, deadline).map_err(|e| io("connect", e))?;
    s.set_read_timeout(Some(deadline))
        .map_err(|e| io("timeout", e))?;
    s.set_write_timeout(Some(deadline))
        .map_err(|e| io("timeout", e))?;
    let data = vec![0x5au8; bytes];
    let mut best = Duration::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        s.write_all(&data).map_err(|e| io("write", e))?;
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).map_err(|e| io("ack", e))?;
        best = best.min(t.elapsed());
    }
    drop(s);
    receiver
        .join()
        .map_err(|_| io("receiver", std::io::Error::other("panicked")))??;
    Ok(bytes as f64 / best.as_secs_f64().max(1e-9) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_over_loopback_moves_bytes() {
        let gbps = stream_throughput(
            "127.0.0.1".parse().unwrap(),
            1 << 20,
            2,
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(gbps > 0.0 && gbps.is_finite(), "{gbps}");
    }
}
