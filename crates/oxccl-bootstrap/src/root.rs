//! The root: collects one hello per rank, checks them, and answers every
//! rank with the table of all descriptors (NCCL's bootstrap root, as a
//! star). Each root serves one rendezvous and gives up at its deadline.
//!
//! Every root of the process is served by one thread, started with the
//! first and ended with the last: it polls all their listeners and the
//! connections still saying hello ([`Gate`]), so unused unique ids cost a
//! listening socket each, not a thread, and a storm of strangers costs
//! bounded memory and no threads. A hello counts only once it proved the
//! id's key; anything else is dropped, naming its address, and the
//! rendezvous goes on. Hellos that cannot belong to one rendezvous (two
//! claims on one rank, rank counts that disagree, a rank out of range),
//! which only holders of the key can send, fail every rank that has joined
//! and every one that joins afterwards, until the deadline: never a hang.
//! Sending the table (or the reason for failing) to the ranks runs on a
//! short-lived thread of its own, so a slow rank never holds up the
//! other roots. A rendezvous still waiting after [`WaitWarn::first`]
//! says so on stderr (logging set up or not), naming the ranks not yet
//! joined, and again every [`WaitWarn::every`]: with no deadline (the C
//! ABI's default) a rank that never starts is otherwise silence.

use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use crate::auth::Key;
use crate::desc::{encode_table, Hello, RankDesc, MAX_RANKS, PROTOCOL};
use crate::error::BootstrapError;
use crate::handshake::{Gate, Verified};
use crate::sock::Conn;
use crate::wire::Kind;
use crate::WaitWarn;

/// The root's own "rank" in errors and logs.
pub(crate) const ROOT: u32 = u32::MAX;

/// The role string of the root's proofs.
pub(crate) const ROLE: &str = "root";

struct Joined {
    conn: Conn,
    desc: RankDesc,
}

/// One rendezvous being served.
struct Root {
    l: TcpListener,
    gate: Gate,
    limit: Duration,
    deadline: Instant,
    nranks: Option<u32>,
    slots: Vec<Option<Joined>>,
    joined: u32,
    failed: Option<String>,
    started: Instant,
    warn: WaitWarn,
    /// When the next warning is due.
    next_warn: Instant,
}

/// What a finished root leaves to send.
enum Finish {
    Table(Vec<Joined>, Vec<u8>, Instant),
    Fail(Vec<Joined>, String),
}

impl Root {
    /// Takes the hellos that arrived; `Some` once the rendezvous is over.
    fn advance(&mut self) -> Option<Finish> {
        for v in self.gate.advance(&self.l) {
            self.take(v);
        }
        if self.failed.is_none() && self.nranks.is_some_and(|n| self.joined == n) {
            let joined: Vec<Joined> = self.slots.iter_mut().filter_map(Option::take).collect();
            let descs: Vec<RankDesc> = joined.iter().map(|j| j.desc.clone()).collect();
            return Some(Finish::Table(joined, encode_table(&descs), self.deadline));
        }
        if Instant::now() >= self.deadline {
            let missing: Vec<u32> = (0..self.slots.len() as u32)
                .filter(|&r| self.slots[r as usize].is_none())
                .collect();
            let why = self.failed.clone().unwrap_or_else(|| {
                format!(
                    "bootstrap deadline of {:?}: {} never joined the root{}",
                    self.limit,
                    oxccl_core::ranks_named(&missing),
                    self.gate.starved_note()
                )
            });
            tracing::warn!("oxccl bootstrap root gave up: {why}");
            let joined = self.slots.iter_mut().filter_map(Option::take).collect();
            return Some(Finish::Fail(joined, why));
        }
        None
    }

    /// Who has not joined yet, for the warning of a long wait.
    fn waiting_for(&self) -> String {
        let n = match (self.nranks, &self.failed) {
            (_, Some(why)) => return format!("it failed ({why}) and waits for its deadline"),
            (None, _) => return "no rank has joined yet".to_string(),
            (Some(n), None) => n,
        };
        let missing: Vec<u32> = (0..n)
            .filter(|&r| self.slots.get(r as usize).is_none_or(Option::is_none))
            .collect();
        format!(
            "{} of {n} ranks joined; {} not yet (its init has not reached this root){}",
            self.joined,
            oxccl_core::ranks_named(&missing),
            self.gate.starved_note()
        )
    }

    /// Warns once the wait has gone on past `next_warn`.
    fn warn_if_due(&mut self, now: Instant) {
        if now < self.next_warn {
            return;
        }
        self.next_warn = now + self.warn.every;
        let limit = if self.limit >= crate::MAX_LIMIT {
            "no deadline".to_string()
        } else {
            format!("deadline {:?}", self.limit)
        };
        let at = self
            .l
            .local_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let msg = format!(
            "oxccl: the bootstrap root at {at} still waits after {:.1} s ({limit}): {}",
            now.duration_since(self.started).as_secs_f64(),
            self.waiting_for()
        );
        WaitWarn::say(&msg);
    }

    /// A hello whose proof held.
    fn take(&mut self, mut v: Verified) {
        let h = match Hello::decode(&v.body) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(
                    "oxccl bootstrap root dropped a connection from {}: {e}",
                    v.from
                );
                return;
            }
        };
        let quick = Instant::now() + Duration::from_secs(1);
        if let Err(e) = v.ack(self.gate.key(), ROLE, quick) {
            tracing::warn!(%e, "oxccl bootstrap root dropped a connection from {}", v.from);
            return;
        }
        let mut c = v.conn;
        if let Some(why) = &self.failed {
            let _ = c.send(Kind::Fail, why.as_bytes(), quick);
            return;
        }
        if let Err(why) = check(&h, self.nranks, &self.slots) {
            let _ = c.send(Kind::Fail, why.as_bytes(), quick);
            for j in self.slots.iter_mut().filter_map(Option::take) {
                let mut c = j.conn;
                let _ = c.send(Kind::Fail, why.as_bytes(), quick);
            }
            self.failed = Some(why);
            return;
        }
        let n = *self.nranks.get_or_insert(h.nranks);
        if self.slots.is_empty() {
            self.slots.resize_with(n as usize, || None);
        }
        c.peer = format!("rank {}", h.desc.rank);
        c.peer_rank = Some(h.desc.rank);
        let r = h.desc.rank as usize;
        self.slots[r] = Some(Joined {
            conn: c,
            desc: h.desc,
        });
        self.joined += 1;
    }
}

impl Finish {
    /// Sends the table or the reason to every joined rank.
    fn send(self) {
        match self {
            Finish::Table(joined, table, deadline) => {
                for mut j in joined {
                    // A rank that died meanwhile finds out through its peers.
                    if let Err(e) = j.conn.send(Kind::Table, &table, deadline) {
                        tracing::warn!(%e, "oxccl bootstrap root could not send the table");
                    }
                }
            }
            Finish::Fail(joined, why) => {
                let until = Instant::now() + Duration::from_secs(1);
                for mut j in joined {
                    let _ = j.conn.send(Kind::Fail, why.as_bytes(), until);
                }
            }
        }
    }
}

/// The process's root service: roots handed to it and not yet taken by
/// its thread, whether that thread runs, and the eventfd that wakes it.
struct Service {
    incoming: Vec<Root>,
    running: bool,
    bell: Option<Arc<OwnedFd>>,
}

static SERVICE: Mutex<Service> = Mutex::new(Service {
    incoming: Vec::new(),
    running: false,
    bell: None,
});

/// Serves the rendezvous of (`magic`, `key`) on `l` until `limit` passes,
/// on the process's root thread.
pub(crate) fn spawn(
    l: TcpListener,
    magic: u64,
    key: Key,
    limit: Duration,
    warn: WaitWarn,
) -> Result<(), BootstrapError> {
    let limit = crate::clamp(limit);
    let io = |what: &str, e: std::io::Error| BootstrapError::io(ROOT, what.to_string(), &e);
    l.set_nonblocking(true)
        .map_err(|e| io("making the root's listener non-blocking", e))?;
    let root = Root {
        l,
        gate: Gate::new(magic, key, ROLE, Kind::Hello, ROOT, limit),
        limit,
        deadline: Instant::now() + limit,
        nranks: None,
        slots: Vec::new(),
        joined: 0,
        failed: None,
        started: Instant::now(),
        warn,
        next_warn: Instant::now() + warn.first,
    };
    let mut s = SERVICE.lock().unwrap_or_else(|p| p.into_inner());
    let bell = match &s.bell {
        Some(b) => b.clone(),
        None => {
            let b = Arc::new(
                eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
                    .map_err(|e| io("creating the root service's eventfd", e.into()))?,
            );
            s.bell = Some(b.clone());
            b
        }
    };
    s.incoming.push(root);
    if s.running {
        let _ = rustix::io::write(&*bell, &1u64.to_ne_bytes());
        return Ok(());
    }
    std::thread::Builder::new()
        .name("oxccl-bootstrap-root".into())
        .spawn(move || serve(&bell))
        .map_err(|e| io("spawning the bootstrap root thread", e))?;
    s.running = true;
    Ok(())
}

/// The service thread: until no root is left.
fn serve(bell: &OwnedFd) {
    let mut roots: Vec<Root> = Vec::new();
    loop {
        {
            let mut s = SERVICE.lock().unwrap_or_else(|p| p.into_inner());
            roots.append(&mut s.incoming);
            if roots.is_empty() {
                s.running = false;
                return;
            }
        }
        let now = Instant::now();
        let mut until = roots
            .iter()
            .map(|r| match r.gate.next_wake() {
                Some(w) => w.min(r.deadline).min(r.next_warn),
                None => r.deadline.min(r.next_warn),
            })
            .min()
            .unwrap_or(now);
        // Look at the clock now and then even when nothing is due.
        until = until.min(now + Duration::from_secs(1));
        let ready: Vec<bool> = {
            let mut fds = vec![PollFd::new(bell, PollFlags::IN)];
            let mut spans = Vec::with_capacity(roots.len());
            for r in &roots {
                let at = fds.len();
                r.gate.poll_fds(&r.l, &mut fds);
                spans.push(at..fds.len());
            }
            let t = until.saturating_duration_since(now);
            let ts = Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            };
            let _ = poll(&mut fds, Some(&ts));
            if !fds[0].revents().is_empty() {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(bell, &mut b);
            }
            spans
                .into_iter()
                .map(|s| fds[s].iter().any(|f| !f.revents().is_empty()))
                .collect()
        };
        let now = Instant::now();
        let mut i = 0;
        let mut ready = ready.into_iter();
        while i < roots.len() {
            let due = ready.next().unwrap_or(false)
                || now >= roots[i].deadline
                || roots[i].gate.next_wake().is_some_and(|w| now >= w);
            let done = if due { roots[i].advance() } else { None };
            match done {
                Some(f) => {
                    roots.swap_remove(i);
                    // `swap_remove` moved the last root here: look at it
                    // next pass, not with another's readiness.
                    ready = Vec::new().into_iter();
                    let _ = std::thread::Builder::new()
                        .name("oxccl-root-send".into())
                        .spawn(move || f.send());
                }
                None => {
                    roots[i].warn_if_due(now);
                    i += 1;
                }
            }
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

/// Whether the process's root service thread runs now (one thread serves
/// every root of the process), for tests and measurements.
pub fn service_running() -> bool {
    SERVICE.lock().unwrap_or_else(|p| p.into_inner()).running
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(protocol: u32, rank: u32) -> Hello {
        let desc = RankDesc {
            rank,
            host: "h/1".into(),
            pid: 42,
            pidns: 0,
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
