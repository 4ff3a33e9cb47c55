//! An established bootstrap: every rank's descriptor, and a ring of TCP
//! connections (each rank to its successor) for small collective calls
//! that later layers make at setup time (shared-memory handles, `split`'s
//! colors, the C ABI's checks).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::auth::{Key, KEY_BYTES};
use crate::desc::{
    decode_peer, decode_table, encode_peer, host_identity, DeviceInfo, Hello, RankDesc, MAX_RANKS,
};
use crate::error::BootstrapError;
use crate::fdpass::FdMailbox;
use crate::handshake::{connect_greet, Gate};
use crate::id::UniqueId;
use crate::root;
use crate::sock::{self, Conn};
use crate::wire::{Kind, Reader, Writer};
use crate::WaitWarn;

/// The role string of ring hellos' proofs.
const RING: &str = "ring";

/// Largest record one rank may contribute to a collective call.
pub const MAX_RECORD: usize = 1 << 20;

/// One rank's bootstrap.
#[derive(Debug)]
pub struct Bootstrap {
    rank: u32,
    nranks: u32,
    magic: u64,
    /// The communicator's key (from its id, or derived from its parent's).
    key: Key,
    limit: Duration,
    descs: Vec<RankDesc>,
    ring: Mutex<Option<Ring>>,
    mailbox: FdMailbox,
    /// The ring listener, kept open: a later rendezvous among a subset of
    /// the ranks ([`Bootstrap::subset_id`]) is served on it.
    listener: Option<TcpListener>,
    /// Subset rendezvous started so far, per member list (part of their
    /// magics).
    subsets: Mutex<HashMap<Vec<u32>, u64>>,
    /// When a subset rendezvous this rank serves warns of absent ranks.
    warn: crate::WaitWarn,
}

/// How long a rank waits for the root's table past its own deadline, to
/// hear the root's reason when the rendezvous fails.
const ROOT_REASON_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Ring {
    next: Conn,
    prev: Conn,
    /// Collective calls made so far (checked against the peers').
    seq: u64,
}

impl Bootstrap {
    /// Joins the rendezvous of `id` as `rank` of `nranks`, waiting at most
    /// `limit` in all. One rank contacts no root and never reads `id`.
    pub fn init(
        id: &UniqueId,
        nranks: u32,
        rank: u32,
        dev: &DeviceInfo,
        limit: Duration,
    ) -> Result<Bootstrap, BootstrapError> {
        check_ranks(nranks, rank)?;
        let limit = crate::clamp(limit);
        let deadline = Instant::now() + limit;
        if nranks == 1 {
            let magic = crate::id::random_magic();
            let key = Key::random()?;
            let descs = vec![my_desc(rank, dev)];
            return Ok(Bootstrap {
                rank,
                nranks,
                magic,
                key,
                limit,
                mailbox: FdMailbox::new(&key, 0, rank, &descs)?.with_limit(limit),
                descs,
                ring: Mutex::new(None),
                listener: None,
                subsets: Mutex::new(HashMap::new()),
                warn: dev.wait_warn,
            });
        }
        let info = id.info()?;
        let (magic, key) = (info.magic, info.key);
        if info.root_in_rank0 && rank == 0 {
            let l = sock::listen(info.root, rank)?;
            root::spawn(l, magic, key, limit, dev.wait_warn)?;
        }
        let (listener, desc) = listen_like(info.root, rank, dev)?;
        // A little past this rank's own deadline: a root that gives up at
        // its deadline (started with rank 0, so no later than this one's)
        // sends why (the ranks that never joined), which beats a bare
        // timeout of this wait.
        let grace = deadline + ROOT_REASON_GRACE;
        let mut root = connect_greet(
            info.root,
            deadline,
            grace,
            rank,
            &format!("root {}", info.root),
            None,
            limit,
            magic,
            &key,
            root::ROLE,
            Kind::Hello,
            &Hello::new(nranks, desc).encode(),
        )?;
        wait_for_table(&mut root, rank, limit, grace, dev.wait_warn);
        let table = root.recv_kind(Kind::Table, grace)?;
        let descs = decode_table(&table, nranks).map_err(|e| root.wire(e))?;
        drop(root);
        // Bound only once the root has vouched that this rank is unique
        // (peers' sends retry until it is bound).
        let mailbox = FdMailbox::new(&key, info.root.port(), rank, &descs)?.with_limit(limit);
        Bootstrap::linked(
            magic,
            key,
            limit,
            deadline,
            descs,
            rank,
            listener,
            mailbox,
            dev.wait_warn,
        )
    }

    /// Rank `rank` of the ranks `descs` describes (each listening at its
    /// `listen`, this one on `listener`), once connected in a ring: to its
    /// successor, and accepting its predecessor. A subset rendezvous it
    /// serves later warns of absent ranks on `warn`'s schedule.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linked(
        magic: u64,
        key: Key,
        limit: Duration,
        deadline: Instant,
        descs: Vec<RankDesc>,
        rank: u32,
        listener: TcpListener,
        mailbox: FdMailbox,
        warn: crate::WaitWarn,
    ) -> Result<Bootstrap, BootstrapError> {
        let nranks = descs.len() as u32;
        let next_rank = (rank + 1) % nranks;
        let prev_rank = (rank + nranks - 1) % nranks;
        // Greeting the successor waits for its challenge, which it sends
        // from its own accept: both at once, or every rank would wait on
        // its successor.
        let (next, prev) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                connect_greet(
                    descs[next_rank as usize].listen,
                    deadline,
                    deadline,
                    rank,
                    &format!("rank {next_rank}"),
                    Some(next_rank),
                    limit,
                    magic,
                    &key,
                    RING,
                    Kind::Peer,
                    &encode_peer(rank, nranks),
                )
            });
            let prev = accept_peer(
                &listener, magic, &key, rank, nranks, prev_rank, deadline, limit,
            );
            let next = h.join().unwrap_or_else(|_| {
                Err(BootstrapError::Mismatch {
                    rank,
                    detail: "the ring connect thread panicked".into(),
                })
            });
            (next, prev)
        });
        let (next, prev) = (next?, prev?);
        Ok(Bootstrap {
            rank,
            nranks,
            magic,
            key,
            limit,
            descs,
            ring: Mutex::new(Some(Ring { next, prev, seq: 0 })),
            mailbox,
            listener: Some(listener),
            subsets: Mutex::new(HashMap::new()),
            warn,
        })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// The communicator's magic (ids of communicators split from this one
    /// are new ids with magics of their own).
    pub fn magic(&self) -> u64 {
        self.magic
    }

    /// A key for `purpose` (a layer's own proofs, e.g. the network
    /// transport's hellos), derived from the communicator's: every rank
    /// derives the same, nobody without the id can.
    pub fn layer_key(&self, purpose: &str) -> [u8; KEY_BYTES] {
        self.key.derive("layer", &[purpose.as_bytes()]).to_bytes()
    }

    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The deadline every wait of this bootstrap is bounded by.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Every rank's descriptor, in rank order.
    pub fn descs(&self) -> &[RankDesc] {
        &self.descs
    }

    /// Whether every rank runs on this machine.
    pub fn all_local(&self) -> bool {
        self.descs
            .iter()
            .all(|d| d.host == self.descs[self.rank as usize].host)
    }

    /// Every rank's `mine`, in rank order: `n - 1` steps around the ring.
    /// Every rank must call it (the calls are matched by number; a rank
    /// making another call is reported as a mismatch).
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        if mine.len() > MAX_RECORD {
            return Err(BootstrapError::InvalidArgument(format!(
                "a record of {} bytes exceeds the bootstrap's {MAX_RECORD}",
                mine.len()
            )));
        }
        let n = self.nranks as usize;
        let me = self.rank as usize;
        let mut out = vec![Vec::new(); n];
        out[me] = mine.to_vec();
        let mut guard = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ring) = guard.as_mut() else {
            return Ok(out);
        };
        ring.seq += 1;
        let seq = ring.seq;
        let deadline = Instant::now() + self.limit;
        for step in 0..n - 1 {
            let send_ix = (me + n - step) % n;
            let recv_ix = (me + n - step - 1) % n;
            let mut w = Writer::default();
            w.u32(seq as u32).u32(send_ix as u32).bytes(&out[send_ix]);
            let Ring { next, prev, .. } = ring;
            // Send on a helper thread: every rank sends before it receives,
            // so records larger than the socket buffers cannot deadlock.
            let (sent, got) = std::thread::scope(|s| {
                let h = s.spawn(|| next.send(Kind::Data, &w.0, deadline));
                let got = prev.recv_kind(Kind::Data, deadline);
                (
                    h.join().unwrap_or_else(|_| {
                        Err(BootstrapError::Mismatch {
                            rank: self.rank,
                            detail: "send thread panicked".into(),
                        })
                    }),
                    got,
                )
            });
            sent?;
            let got = got?;
            let mut r = Reader::new(&got, "gathered record");
            let (s, ix) = (
                r.u32().map_err(|e| prev.wire(e))?,
                r.u32().map_err(|e| prev.wire(e))?,
            );
            let rec = r.bytes(MAX_RECORD).map_err(|e| prev.wire(e))?.to_vec();
            r.finish().map_err(|e| prev.wire(e))?;
            if s != seq as u32 || ix as usize != recv_ix {
                return Err(BootstrapError::Mismatch {
                    rank: self.rank,
                    detail: format!(
                        "bootstrap call {seq} step {step} expected rank {recv_ix}'s record of call {seq}, got rank {ix}'s of call {s}: ranks made different calls"
                    ),
                });
            }
            out[recv_ix] = rec;
        }
        Ok(out)
    }

    /// `data` of rank `root`, on every rank (others pass anything).
    pub fn broadcast(&self, root: u32, data: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        if root >= self.nranks {
            return Err(BootstrapError::InvalidArgument(format!(
                "broadcast root {root} out of range for {} ranks",
                self.nranks
            )));
        }
        let mine = if self.rank == root { data } else { &[] };
        Ok(self.all_gather(mine)?.swap_remove(root as usize))
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<(), BootstrapError> {
        self.all_gather(&[]).map(|_| ())
    }

    /// The id of a new rendezvous among `members` (ranks of this
    /// bootstrap, ascending, this rank among them) that the other ranks do
    /// not join: NCCL's `ncclCommShrink`, where excluded ranks may be dead.
    /// Nothing is sent over this bootstrap's ring. The lowest member serves
    /// the rendezvous on its ring listener (kept open since init); the
    /// magic is derived from this bootstrap's, the member list and how
    /// many subsets of that list this rank made before, so every member
    /// computes the same id, and members that disagree on the list meet
    /// different magics and fail at the deadline instead of mixing. Pass the id to
    /// [`Bootstrap::init`] with `members.len()` ranks.
    pub fn subset_id(&self, members: &[u32]) -> Result<UniqueId, BootstrapError> {
        let bad = |m: String| Err(BootstrapError::InvalidArgument(m));
        if members.windows(2).any(|w| w[0] >= w[1]) {
            return bad(format!(
                "subset {members:?} is not ascending without repeats"
            ));
        }
        if let Some(r) = members.iter().find(|&&r| r >= self.nranks) {
            return bad(format!(
                "subset rank {r} is out of range for {} ranks",
                self.nranks
            ));
        }
        if !members.contains(&self.rank) {
            return bad(format!(
                "rank {} is not in the subset {members:?}",
                self.rank
            ));
        }
        let seq = {
            let mut m = self.subsets.lock().unwrap_or_else(|p| p.into_inner());
            let k = m.entry(members.to_vec()).or_insert(0);
            *k += 1;
            *k
        };
        let magic = subset_magic(self.magic, seq, members);
        let member_bytes: Vec<u8> = members.iter().flat_map(|r| r.to_le_bytes()).collect();
        let key = self
            .key
            .derive("subset", &[&seq.to_le_bytes(), &member_bytes]);
        let leader = members[0];
        let at = self.descs[leader as usize].listen;
        if members.len() > 1 && leader == self.rank {
            let l = self.listener.as_ref().ok_or_else(|| {
                BootstrapError::InvalidArgument("a 1-rank bootstrap has no listener".into())
            })?;
            let l = l
                .try_clone()
                .map_err(|e| BootstrapError::io(self.rank, "sharing the ring listener", &e))?;
            root::spawn(l, magic, key, self.limit, self.warn)?;
        }
        Ok(UniqueId::for_root(magic, key, at))
    }

    /// This rank's mailbox for file descriptors from ranks of this machine.
    pub fn mailbox(&self) -> &FdMailbox {
        &self.mailbox
    }
}

/// `nranks` is 1..=MAX_RANKS and `rank` one of them.
pub(crate) fn check_ranks(nranks: u32, rank: u32) -> Result<(), BootstrapError> {
    if nranks == 0 || nranks > MAX_RANKS {
        return Err(BootstrapError::InvalidArgument(format!(
            "{nranks} ranks: a communicator has 1..={MAX_RANKS}"
        )));
    }
    if rank >= nranks {
        return Err(BootstrapError::InvalidArgument(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    Ok(())
}

/// This process's descriptor as `rank` (not listening yet).
/// Waits until the root starts sending the rank table (or `grace`),
/// warning on `warn`'s schedule: the root sends it once every rank has
/// joined, and only the root's process knows who has not (it warns too).
fn wait_for_table(root: &mut Conn, rank: u32, limit: Duration, grace: Instant, warn: WaitWarn) {
    let started = Instant::now();
    let mut next = started + warn.first;
    while next < grace && !root.wait_readable(next) {
        let limit = if limit >= crate::MAX_LIMIT {
            "no deadline".to_string()
        } else {
            format!("deadline {limit:?}")
        };
        WaitWarn::say(&format!(
            "oxccl: rank {rank} still waits for the rank table from the bootstrap {} after {:.1} s ({limit}): the root sends it once every rank has joined; the root's process names the ranks missing",
            root.peer,
            started.elapsed().as_secs_f64()
        ));
        next += warn.every;
    }
}

fn my_desc(rank: u32, dev: &DeviceInfo) -> RankDesc {
    RankDesc {
        rank,
        host: host_identity(dev.host_id.as_deref()),
        pid: std::process::id(),
        pidns: crate::fdpass::pid_namespace(),
        device: dev.device.unwrap_or(-1),
        bus_id: dev.bus_id.clone(),
        listen: crate::wire::NO_ADDR,
    }
}

/// A ring listener of the root's family, and this rank's descriptor
/// naming it.
pub(crate) fn listen_like(
    root: SocketAddr,
    rank: u32,
    dev: &DeviceInfo,
) -> Result<(TcpListener, RankDesc), BootstrapError> {
    let listener = sock::listen(SocketAddr::new(local_ip_like(root, dev)?, 0), rank)?;
    let mut desc = my_desc(rank, dev);
    desc.listen = listener
        .local_addr()
        .map_err(|e| BootstrapError::io(rank, "reading the listening address", &e))?;
    Ok((listener, desc))
}

/// A subset rendezvous's magic: every member computes it alike (SplitMix64
/// steps over the parent's magic, the sequence number and the members);
/// never 0 nor NCCL's fixed magic.
pub(crate) fn subset_magic(parent: u64, seq: u64, members: &[u32]) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut h = mix(parent ^ 0x9e37_79b9_7f4a_7c15);
    for v in std::iter::once(seq).chain(members.iter().map(|&r| u64::from(r))) {
        h = mix(h.wrapping_add(v).wrapping_add(0x9e37_79b9_7f4a_7c15));
    }
    match h {
        0 | crate::id::COMM_ID_MAGIC => 1,
        h => h,
    }
}

/// An address of ours to listen on, of the root's family: loopback when
/// the root is on loopback (all ranks on this machine), else the chosen
/// interface.
fn local_ip_like(root: SocketAddr, dev: &DeviceInfo) -> Result<std::net::IpAddr, BootstrapError> {
    if root.ip().is_loopback() {
        return Ok(root.ip());
    }
    crate::iface::local_addr(&dev.iface).map(|i| i.addr)
}

/// Accepts the ring predecessor's connection: hellos are read at once
/// through a [`Gate`], so strangers, garbage and silence are dropped
/// without holding up the predecessor.
#[allow(clippy::too_many_arguments)]
fn accept_peer(
    l: &std::net::TcpListener,
    magic: u64,
    key: &Key,
    rank: u32,
    nranks: u32,
    want: u32,
    deadline: Instant,
    limit: Duration,
) -> Result<Conn, BootstrapError> {
    let mut gate = Gate::new(magic, *key, RING, Kind::Peer, rank, limit);
    loop {
        for mut v in gate.wait(l, deadline) {
            match decode_peer(&v.body) {
                Ok((r, n)) if r == want && n == nranks => match v.ack(key, RING, deadline) {
                    Ok(()) => {
                        v.conn.peer = format!("rank {want}");
                        v.conn.peer_rank = Some(want);
                        return Ok(v.conn);
                    }
                    Err(e) => tracing::warn!(%e, "oxccl bootstrap could not answer rank {want}"),
                },
                Ok((r, n)) => {
                    let why = format!(
                        "rank {rank}'s ring listener expects rank {want} of {nranks}, \
                         not rank {r} of {n}"
                    );
                    tracing::warn!(
                        "oxccl bootstrap dropped a ring connection from {}: {why}",
                        v.from
                    );
                    // A holder of the key, misplaced: it learns why at once.
                    let _ = v.conn.send(
                        Kind::Fail,
                        why.as_bytes(),
                        Instant::now() + Duration::from_secs(1),
                    );
                }
                Err(e) => tracing::warn!(
                    "oxccl bootstrap dropped a ring connection from {}: {e}",
                    v.from
                ),
            }
        }
        if Instant::now() >= deadline {
            return Err(BootstrapError::Timeout {
                rank,
                waiting_for: format!(
                    "ring predecessor rank {want} to connect{}",
                    gate.starved_note()
                ),
                limit,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;
    use crate::wire::frame;

    /// Strangers at a ring listener (garbage, silence, a peer hello
    /// signed with another key, a right hello from the wrong rank) come
    /// first; the predecessor, holding the key, is the one accepted.
    #[test]
    fn strangers_at_the_ring_listener_are_dropped_and_the_predecessor_accepted() {
        let limit = Duration::from_secs(20);
        let deadline = Instant::now() + limit;
        let (magic, key) = (0x77, Key::random().unwrap());
        let l = sock::listen("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let at = l.local_addr().unwrap();
        let greet = |k: Key, rank: u32| {
            connect_greet(
                at,
                deadline,
                deadline,
                rank,
                "rank 1",
                Some(1),
                limit,
                magic,
                &k,
                RING,
                Kind::Peer,
                &encode_peer(rank, 3),
            )
        };
        std::thread::scope(|s| {
            let strangers = s.spawn(|| {
                let mut garbage = TcpStream::connect(at).unwrap();
                garbage.write_all(&[0x5a; 100]).unwrap();
                let silent = TcpStream::connect(at).unwrap();
                let mut header_only = TcpStream::connect(at).unwrap();
                header_only
                    .write_all(&frame(magic, Kind::Peer, &[0; 80])[..16])
                    .unwrap();
                let forged = greet(Key::random().unwrap(), 0);
                assert!(
                    matches!(&forged, Err(BootstrapError::Rejected { reason, .. }) if reason.contains("key")),
                    "{forged:?}"
                );
                let wrong_rank = greet(key, 2);
                assert!(
                    matches!(&wrong_rank, Err(BootstrapError::Rejected { reason, .. }) if reason.contains("expects rank 0")),
                    "{wrong_rank:?}"
                );
                // The predecessor, after all of them.
                let mut real = greet(key, 0).expect("the predecessor is accepted");
                real.stream.write_all(b"me").unwrap();
                (garbage, silent, header_only)
            });
            let mut got = accept_peer(&l, magic, &key, 1, 3, 0, deadline, limit).unwrap();
            assert_eq!(got.peer_rank, Some(0));
            let mut b = [0u8; 2];
            got.stream.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"me");
            drop(strangers.join().unwrap());
        });
    }
}
