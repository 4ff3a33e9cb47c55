//! A TCP connection between every pair of ranks, for a layer above that
//! keeps talking to each peer after setup (the call check mirrored across
//! hosts). Made over the bootstrap: each rank listens on a fresh port of
//! its bootstrap address, the ring gathers the ports, lower ranks connect
//! to higher ones and greet them like a ring successor does.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::desc::{decode_peer, encode_peer};
use crate::error::BootstrapError;
use crate::ring::Bootstrap;
use crate::sock::{self, Conn};
use crate::wire::Kind;

impl Bootstrap {
    /// One connection to every other rank (`None` at this rank's own
    /// index), for `purpose` (named in errors). Every rank must call it,
    /// in the same order as the bootstrap's other collective calls. A
    /// connection that does not greet as a rank of this communicator (a
    /// port scan, a stale rank) is dropped, not an error; a rank that
    /// never connects is named at the bootstrap's deadline.
    pub fn mesh(&self, purpose: &str) -> Result<Vec<Option<TcpStream>>, BootstrapError> {
        let (me, n, magic, limit) = (self.rank(), self.nranks(), self.magic(), self.limit());
        let deadline = Instant::now() + limit;
        let ip = self.descs()[me as usize].listen.ip();
        let listener = sock::listen(SocketAddr::new(ip, 0), me)?;
        let mine = listener
            .local_addr()
            .map_err(|e| BootstrapError::io(me, format!("listening for the {purpose}"), &e))?;
        let addrs = self.all_gather(mine.to_string().as_bytes())?;
        let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        // Lower ranks connect to higher ones; every listener exists before
        // the all-gather above, so connects complete from its backlog.
        for peer in me + 1..n {
            let addr: SocketAddr = std::str::from_utf8(&addrs[peer as usize])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    BootstrapError::InvalidArgument(format!(
                        "rank {peer} sent an unreadable address for the {purpose}"
                    ))
                })?;
            let what = format!("rank {peer} for the {purpose}");
            let s = sock::connect(addr, deadline, me, &what, limit)?;
            let mut c = Conn::new(s, magic, me, what, limit);
            c.send(Kind::Peer, &encode_peer(me, n), deadline)?;
            socks[peer as usize] = Some(c.stream);
        }
        let mut waiting = me;
        while waiting > 0 {
            let Some((s, a)) = sock::accept(&listener, deadline, me)? else {
                if Instant::now() >= deadline {
                    let missing: Vec<u32> =
                        (0..me).filter(|&r| socks[r as usize].is_none()).collect();
                    return Err(BootstrapError::Timeout {
                        rank: me,
                        waiting_for: format!(
                            "{} to connect for the {purpose}",
                            oxccl_core::ranks_named(&missing)
                        ),
                        limit,
                    });
                }
                continue;
            };
            let mut c = Conn::new(s, magic, me, format!("connection from {a}"), limit);
            let hello_deadline = deadline.min(Instant::now() + Duration::from_secs(10));
            let hello = c
                .recv_kind(Kind::Peer, hello_deadline)
                .and_then(|b| decode_peer(&b).map_err(|e| c.wire(e)));
            match hello {
                Ok((r, m)) if r < me && m == n && socks[r as usize].is_none() => {
                    socks[r as usize] = Some(c.stream);
                    waiting -= 1;
                }
                Ok((r, m)) => tracing::warn!(
                    "oxccl bootstrap dropped a {purpose} connection from {a}: rank {r} of {m}"
                ),
                Err(e) => tracing::debug!(%e, "oxccl bootstrap dropped a connection"),
            }
        }
        Ok(socks)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::desc::DeviceInfo;
    use crate::id::UniqueId;

    /// Four ranks as threads: every pair gets one connection, and bytes
    /// written at one end arrive at the other, so the pairs are right.
    #[test]
    fn every_pair_of_ranks_is_connected_once() {
        const N: u32 = 4;
        let limit = Duration::from_secs(20);
        let id = UniqueId::new(limit).expect("id");
        let got: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..N)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || {
                        let boot = Bootstrap::init(id, N, r, &DeviceInfo::default(), limit)
                            .expect("bootstrap");
                        let mut socks = boot.mesh("test").expect("mesh");
                        assert!(socks[r as usize].is_none());
                        for (p, s) in socks.iter_mut().enumerate() {
                            if let Some(s) = s {
                                s.write_all(&[r as u8, p as u8]).expect("write");
                            }
                        }
                        let mut seen = Vec::new();
                        for s in socks.iter_mut().flatten() {
                            let mut b = [0u8; 2];
                            s.read_exact(&mut b).expect("read");
                            assert_eq!(b[1], r as u8, "a peer's bytes for another rank");
                            seen.push(b[0]);
                        }
                        seen
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        for (r, seen) in got.iter().enumerate() {
            let want: Vec<u8> = (0..N as u8).filter(|&p| p != r as u8).collect();
            assert_eq!(seen, &want, "rank {r}");
        }
    }
}
