//! The root: collects one hello per rank, checks them, and answers every
//! rank with the table of all descriptors (NCCL's bootstrap root, as a
//! star). It serves one rendezvous, then exits.
//!
//! Strangers are cheap: each accepted connection's hello is read on its own
//! thread under a short deadline, so garbage or silence from one connection
//! never holds up the others, and a wrong magic is dropped (with a `Fail`
//! frame, so a rank holding a stale id learns why at once). Hellos that
//! cannot belong to one rendezvous (two claims on one rank, rank counts
//! that disagree, a rank out of range) fail every rank that has joined and
//! every one that joins afterwards, until the deadline: never a hang.

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::desc::{encode_table, Hello, RankDesc, MAX_RANKS, PROTOCOL};
use crate::error::{BootstrapError, WireError};
use crate::sock::{self, Conn};
use crate::wire::Kind;

/// The root's own "rank" in errors and logs.
pub(crate) const ROOT: u32 = u32::MAX;

/// How long one connection may take to say hello.
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// Starts the root on `l` on a thread of its own.
pub(crate) fn spawn(
    l: TcpListener,
    magic: u64,
    limit: Duration,
) -> JoinHandle<Result<(), BootstrapError>> {
    let limit = crate::clamp(limit);
    std::thread::Builder::new()
        .name("oxccl-bootstrap-root".into())
        .spawn(move || {
            let r = serve(&l, magic, limit);
            if let Err(e) = &r {
                tracing::warn!(%e, "oxccl bootstrap root gave up");
            }
            r
        })
        .expect("spawning the bootstrap root thread")
}

struct Joined {
    conn: Conn,
    desc: RankDesc,
}

/// Serves one rendezvous on `l`.
pub(crate) fn serve(l: &TcpListener, magic: u64, limit: Duration) -> Result<(), BootstrapError> {
    let deadline = Instant::now() + limit;
    let (tx, rx) = mpsc::channel::<(Conn, Hello)>();
    let mut nranks: Option<u32> = None;
    let mut slots: Vec<Option<Joined>> = Vec::new();
    let mut joined = 0u32;
    let mut failed: Option<String> = None;
    loop {
        if let Some((s, a)) = sock::accept(l, deadline, ROOT)? {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut c = Conn::new(s, magic, ROOT, format!("connection from {a}"), limit);
                let hello_deadline = Instant::now() + HELLO_WAIT.min(limit);
                let hello = c
                    .recv_kind(Kind::Hello, hello_deadline)
                    .and_then(|b| Hello::decode(&b).map_err(|e| c.wire(e)));
                match hello {
                    Ok(h) => {
                        let _ = tx.send((c, h));
                    }
                    Err(e) => {
                        tracing::debug!(%e, "oxccl bootstrap root dropped a connection");
                        if let BootstrapError::Wire {
                            err: WireError::WrongMagic { .. },
                            ..
                        } = e
                        {
                            // Best effort: a rank with another id learns why.
                            let _ = c.send(
                                Kind::Fail,
                                b"wrong magic: this root serves another unique id",
                                Instant::now() + Duration::from_millis(200),
                            );
                        }
                    }
                }
            });
        } else if Instant::now() >= deadline {
            let missing: Vec<u32> = (0..slots.len() as u32)
                .filter(|&r| slots[r as usize].is_none())
                .collect();
            let why = failed.clone().unwrap_or_else(|| {
                format!(
                    "bootstrap deadline of {limit:?}: {} never joined the root",
                    oxccl_core::ranks_named(&missing)
                )
            });
            fail_all(&mut slots, &why, deadline + Duration::from_secs(1));
            return Err(BootstrapError::Timeout {
                rank: ROOT,
                waiting_for: format!("{} at the root", oxccl_core::ranks_named(&missing)),
                limit,
            });
        }
        while let Ok((mut c, h)) = rx.try_recv() {
            if let Some(why) = &failed {
                let _ = c.send(
                    Kind::Fail,
                    why.as_bytes(),
                    Instant::now() + Duration::from_secs(1),
                );
                continue;
            }
            if let Err(why) = check(&h, nranks, &slots) {
                let _ = c.send(
                    Kind::Fail,
                    why.as_bytes(),
                    Instant::now() + Duration::from_secs(1),
                );
                fail_all(&mut slots, &why, Instant::now() + Duration::from_secs(1));
                failed = Some(why);
                continue;
            }
            let n = *nranks.get_or_insert(h.nranks);
            if slots.is_empty() {
                slots.resize_with(n as usize, || None);
            }
            c.peer = format!("rank {}", h.desc.rank);
            c.peer_rank = Some(h.desc.rank);
            let r = h.desc.rank as usize;
            slots[r] = Some(Joined {
                conn: c,
                desc: h.desc,
            });
            joined += 1;
        }
        if failed.is_none() && nranks.is_some_and(|n| joined == n) {
            let descs: Vec<RankDesc> = slots.iter().flatten().map(|j| j.desc.clone()).collect();
            let table = encode_table(&descs);
            for j in slots.iter_mut().flatten() {
                // A rank that died meanwhile finds out through its peers.
                if let Err(e) = j.conn.send(Kind::Table, &table, deadline) {
                    tracing::warn!(%e, "oxccl bootstrap root could not send the table");
                }
            }
            return Ok(());
        }
    }
}

/// Why hello `h` cannot join the rendezvous so far, if it cannot.
fn check(h: &Hello, nranks: Option<u32>, slots: &[Option<Joined>]) -> Result<(), String> {
    let r = h.desc.rank;
    if h.protocol != PROTOCOL {
        return Err(format!(
            "rank {r} (pid {} on {}) speaks oxccl protocol {} but the root speaks {PROTOCOL}: \
             run one oxccl build on every rank",
            h.desc.pid, h.desc.host, h.protocol
        ));
    }
    if h.nranks == 0 || h.nranks > MAX_RANKS {
        return Err(format!(
            "rank {r} asked for {} ranks (1..={MAX_RANKS})",
            h.nranks
        ));
    }
    if r >= h.nranks {
        return Err(format!("rank {r} is out of range for {} ranks", h.nranks));
    }
    if let Some(n) = nranks {
        if n != h.nranks {
            return Err(format!(
                "wrong rank count: rank {r} (pid {}) says {} ranks, earlier ranks said {n}",
                h.desc.pid, h.nranks
            ));
        }
    }
    if let Some(Some(j)) = slots.get(r as usize) {
        return Err(format!(
            "duplicate rank {r}: claimed by pid {} on {} and by pid {} on {}",
            j.desc.pid, j.desc.host, h.desc.pid, h.desc.host
        ));
    }
    Ok(())
}

fn fail_all(slots: &mut [Option<Joined>], why: &str, deadline: Instant) {
    for j in slots.iter_mut().filter_map(Option::take) {
        let mut c = j.conn;
        let _ = c.send(Kind::Fail, why.as_bytes(), deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(protocol: u32, rank: u32) -> Hello {
        let desc = RankDesc {
            rank,
            host: "h/1".into(),
            pid: 42,
            device: -1,
            bus_id: String::new(),
            listen: "127.0.0.1:1".parse().unwrap(),
        };
        Hello {
            protocol,
            ..Hello::new(2, desc)
        }
    }

    /// A rank of another build is refused by name and version; one of
    /// this build passes, and the version survives the wire.
    #[test]
    fn a_hello_of_another_protocol_is_refused_naming_the_rank() {
        assert_eq!(check(&hello(PROTOCOL, 1), None, &[]), Ok(()));
        let why = check(&hello(PROTOCOL - 1, 1), None, &[]).unwrap_err();
        assert!(why.contains("rank 1 (pid 42 on h/1)"), "{why}");
        assert!(
            why.contains(&format!(
                "protocol {} but the root speaks {PROTOCOL}",
                PROTOCOL - 1
            )),
            "{why}"
        );
        let h = hello(PROTOCOL + 7, 0);
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    }
}
