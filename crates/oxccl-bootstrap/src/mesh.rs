//! A TCP connection between every pair of ranks, for a layer above that
//! keeps talking to each peer after setup (the call check mirrored across
//! hosts). Made over the bootstrap: each rank listens on a fresh port of
//! its bootstrap address, the ring gathers the ports, lower ranks connect
//! to higher ones and greet them like a ring successor does.

use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use crate::desc::{decode_peer, encode_peer};
use crate::error::BootstrapError;
use crate::handshake::{connect_greet, Gate};
use crate::ring::Bootstrap;
use crate::sock;
use crate::wire::Kind;

impl Bootstrap {
    /// One connection to every other rank (`None` at this rank's own
    /// index), for `purpose` (named in errors). Every rank must call it,
    /// in the same order as the bootstrap's other collective calls. Every
    /// connection proves the communicator's key both ways (as the ring's
    /// do); one that does not greet as a rank of this communicator (a
    /// port scan, a stranger, a stale rank) is dropped with a warning, not
    /// an error; a rank that never connects is named at the bootstrap's
    /// deadline.
    pub fn mesh(&self, purpose: &str) -> Result<Vec<Option<TcpStream>>, BootstrapError> {
        let (me, n, magic, limit) = (self.rank(), self.nranks(), self.magic(), self.limit());
        let key = *self.key();
        let role = format!("mesh/{purpose}");
        let deadline = Instant::now() + limit;
        let ip = self.descs()[me as usize].listen.ip();
        let listener = sock::listen(SocketAddr::new(ip, 0), me)?;
        let mine = listener
            .local_addr()
            .map_err(|e| BootstrapError::io(me, format!("listening for the {purpose}"), &e))?;
        let addrs = self.all_gather(mine.to_string().as_bytes())?;
        let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut targets = Vec::new();
        for peer in me + 1..n {
            let addr: SocketAddr = std::str::from_utf8(&addrs[peer as usize])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    BootstrapError::InvalidArgument(format!(
                        "rank {peer} sent an unreadable address for the {purpose}"
                    ))
                })?;
            targets.push((peer, addr));
        }
        // Lower ranks connect to higher ones, on a thread of their own: a
        // greeting waits for the peer's challenge, sent from its accepting
        // loop, while this rank must accept the lower ranks meanwhile.
        let (outgoing, accepted) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut out = Vec::new();
                for &(peer, addr) in &targets {
                    let what = format!("rank {peer} for the {purpose}");
                    let c = connect_greet(
                        addr,
                        deadline,
                        deadline,
                        me,
                        &what,
                        Some(peer),
                        limit,
                        magic,
                        &key,
                        &role,
                        Kind::Peer,
                        &encode_peer(me, n),
                    )?;
                    out.push((peer, c.stream));
                }
                Ok::<_, BootstrapError>(out)
            });
            let accepted = self.accept_lower(&listener, &key, &role, purpose, deadline);
            let out = h.join().unwrap_or_else(|_| {
                Err(BootstrapError::Mismatch {
                    rank: me,
                    detail: format!("the {purpose} connect thread panicked"),
                })
            });
            (out, accepted)
        });
        for (peer, s) in outgoing?.into_iter().chain(accepted?) {
            socks[peer as usize] = Some(s);
        }
        Ok(socks)
    }

    /// Accepts one proven connection from every lower rank.
    fn accept_lower(
        &self,
        listener: &std::net::TcpListener,
        key: &crate::auth::Key,
        role: &str,
        purpose: &str,
        deadline: Instant,
    ) -> Result<Vec<(u32, TcpStream)>, BootstrapError> {
        let (me, n, limit) = (self.rank(), self.nranks(), self.limit());
        let mut gate = Gate::new(self.magic(), *key, role, Kind::Peer, me, limit);
        let mut got: Vec<Option<TcpStream>> = (0..me).map(|_| None).collect();
        let mut waiting = me;
        while waiting > 0 {
            for mut v in gate.wait(listener, deadline) {
                match decode_peer(&v.body) {
                    Ok((r, m)) if r < me && m == n && got[r as usize].is_none() => {
                        match v.ack(key, role, deadline) {
                            Ok(()) => {
                                got[r as usize] = Some(v.conn.stream);
                                waiting -= 1;
                            }
                            Err(e) => {
                                tracing::warn!(%e, "oxccl bootstrap could not answer rank {r}")
                            }
                        }
                    }
                    Ok((r, m)) => {
                        let why = format!(
                            "rank {me}'s {purpose} listener does not expect rank {r} of {m}"
                        );
                        tracing::warn!(
                            "oxccl bootstrap dropped a connection from {}: {why}",
                            v.from
                        );
                        let _ = v.conn.send(
                            Kind::Fail,
                            why.as_bytes(),
                            Instant::now() + std::time::Duration::from_secs(1),
                        );
                    }
                    Err(e) => tracing::warn!(
                        "oxccl bootstrap dropped a {purpose} connection from {}: {e}",
                        v.from
                    ),
                }
            }
            if waiting > 0 && Instant::now() >= deadline {
                let missing: Vec<u32> = (0..me).filter(|&r| got[r as usize].is_none()).collect();
                return Err(BootstrapError::Timeout {
                    rank: me,
                    waiting_for: format!(
                        "{} to connect for the {purpose}{}",
                        oxccl_core::ranks_named(&missing),
                        gate.starved_note()
                    ),
                    limit,
                });
            }
        }
        Ok(got
            .into_iter()
            .enumerate()
            .filter_map(|(r, s)| s.map(|s| (r as u32, s)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

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

    /// The mesh's listener (the call check's connections) drops strangers:
    /// garbage, silence, and a hello signed with another key, claiming
    /// rank 0, come first; the rank holding the key is still accepted, and
    /// the stranger is told its hello proves no key.
    #[test]
    fn strangers_at_the_mesh_listener_are_dropped() {
        let limit = Duration::from_secs(20);
        let id = UniqueId::new(limit).expect("id");
        let boots: Vec<Bootstrap> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || Bootstrap::init(id, 2, r, &DeviceInfo::default(), limit))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        let b = &boots[1];
        let l = sock::listen("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let at = l.local_addr().unwrap();
        let deadline = Instant::now() + limit;
        let role = "mesh/test";
        let greet = |key: &crate::auth::Key| {
            connect_greet(
                at,
                deadline,
                deadline,
                0,
                "rank 1 for the test",
                Some(1),
                limit,
                b.magic(),
                key,
                role,
                Kind::Peer,
                &encode_peer(0, 2),
            )
        };
        std::thread::scope(|s| {
            let strangers = s.spawn(|| {
                let mut garbage = TcpStream::connect(at).unwrap();
                garbage.write_all(&[0xee; 64]).unwrap();
                let silent = TcpStream::connect(at).unwrap();
                let forged = greet(&crate::auth::Key::random().unwrap());
                assert!(
                    matches!(&forged, Err(BootstrapError::Rejected { reason, .. }) if reason.contains("key")),
                    "{forged:?}"
                );
                let mut real = greet(b.key()).expect("rank 0 is accepted");
                real.stream.write_all(b"r0").unwrap();
                (garbage, silent)
            });
            let got = b
                .accept_lower(&l, b.key(), role, "test", deadline)
                .expect("rank 0's connection");
            assert_eq!(got.len(), 1);
            let (r, mut sock) = got.into_iter().next().unwrap();
            assert_eq!(r, 0);
            let mut buf = [0u8; 2];
            sock.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"r0");
            drop(strangers.join().unwrap());
        });
    }
}
