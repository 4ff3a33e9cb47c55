//! The transport's knobs, read from the environment as NCCL reads them.

use std::time::Duration;

use oxccl_bootstrap::env::BadVar;

use crate::error::{NetError, WireError};
use crate::wire::MAX_SOCKS;

/// How the TCP transport spreads one connection over sockets and threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Helper threads per connection (`NCCL_SOCKET_NTHREADS`, 1 to 16;
    /// default 1 here, [`auto_sockets`]'s in the host backend).
    pub nthreads: usize,
    /// Sockets each helper thread drives (`NCCL_NSOCKS_PERTHREAD`; default
    /// 2). `nthreads × nsocks_per_thread` is at most 64. The listener's
    /// count is the connection's: its handle carries it and the connecting
    /// end opens that many sockets.
    pub nsocks_per_thread: usize,
    /// Smallest part of a message given to one socket (NCCL's 64 KiB), so
    /// small messages do not pay for many sockets.
    pub min_chunk: usize,
    /// Longest a connect, an accept or a stalled socket may wait.
    pub deadline: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            nthreads: 1,
            nsocks_per_thread: 2,
            min_chunk: 64 << 10,
            deadline: oxccl_bootstrap::DEFAULT_DEADLINE,
        }
    }
}

fn number(var: &'static str, v: &str, lo: usize, hi: usize) -> Result<usize, NetError> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| {
            NetError::Config(BadVar {
                var,
                value: v.into(),
                reason: format!("expected an integer from {lo} to {hi}"),
            })
        })
}

/// The first of `NCCL_<name>` and `OXCCL_<name>` that is set; the `OXCCL_`
/// twin wins when both are.
fn twin(
    get: &impl Fn(&str) -> Option<String>,
    [ox, nc]: [&'static str; 2],
) -> Option<(&'static str, String)> {
    get(ox)
        .filter(|v| !v.trim().is_empty())
        .map(|v| (ox, v))
        .or_else(|| get(nc).filter(|v| !v.trim().is_empty()).map(|v| (nc, v)))
}

impl TcpConfig {
    /// Sockets per connection.
    pub fn nsocks(&self) -> usize {
        self.nthreads * self.nsocks_per_thread
    }
}

/// Most helper threads per connection (NCCL's `MAX_THREADS`).
pub const MAX_THREADS: usize = 16;
/// Most threads per connection a default takes ([`auto_sockets`]).
pub const AUTO_MAX_THREADS: usize = 4;
/// Sockets per thread a default takes (NCCL's socket transport splits a
/// message over sockets, so one thread's two sockets keep a part in flight
/// while it writes the other).
pub const AUTO_SOCKS_PER_THREAD: usize = 2;
/// Socket threads per core a default lets a rank start over all its
/// connections: most of them sleep (a ring moves data on its two
/// neighbours' connections only), so the bound is on threads that exist,
/// not on threads that run.
pub const AUTO_THREADS_PER_CORE: usize = 8;

/// The default layout of a connection, `(threads, sockets per thread)`,
/// for a rank that may use `cores` cores (`std::thread::available_parallelism`),
/// shares them with `local_ranks` ranks of its communicator on its host and
/// has `conns` connections (both directions, every peer and channel):
///
/// - a thread per connection for every two cores of the rank's share, at
///   least 1 and at most [`AUTO_MAX_THREADS`], each with
///   [`AUTO_SOCKS_PER_THREAD`] sockets. A message is split over the sockets
///   ([`crate::wire::split`]), so more threads copy its parts at once: on a
///   16-core host, 2 processes over loopback with 4 channels reached 96.5%
///   of one stream with 4 × 2 and 74.8% with 1 × 2 (`docs/perf/LOG.md`,
///   the 2026-12-04 17:10 H200 run call 13);
/// - at most [`AUTO_THREADS_PER_CORE`] threads per core of the share over
///   all `conns` connections, so many peers (eager connections to every one)
///   fall back to 1 thread per connection;
/// - so a 2-core machine with 2 ranks (CI) keeps 1 × 2.
pub fn auto_sockets(cores: usize, local_ranks: usize, conns: usize) -> (usize, usize) {
    let share = (cores / local_ranks.max(1)).max(1);
    let conns = conns.max(1);
    let threads = (share / 2)
        .min(AUTO_THREADS_PER_CORE * share / conns)
        .clamp(1, AUTO_MAX_THREADS);
    (threads, AUTO_SOCKS_PER_THREAD)
}

/// One count of a rank's socket layout: set by the user (authoritative),
/// or the rank's default ([`auto_sockets`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    Set(usize),
    Auto(usize),
}

impl std::fmt::Display for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Count::Set(n) => write!(f, "{n} (set)"),
            Count::Auto(n) => write!(f, "{n}"),
        }
    }
}

impl Count {
    pub fn value(self) -> usize {
        match self {
            Count::Set(n) | Count::Auto(n) => n,
        }
    }
}

/// What a rank proposes for its connections' layout: threads per
/// connection (`NCCL_SOCKET_NTHREADS`) and sockets per thread
/// (`NCCL_NSOCKS_PERTHREAD`), each where set, else its default. The ranks
/// swap proposals at setup and every one takes [`agree`]'s answer, so both
/// ends of every connection lay it out alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub nthreads: Count,
    pub nsocks_per_thread: Count,
}

const THREADS_VARS: [&str; 2] = ["OXCCL_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS"];
const SOCKS_VARS: [&str; 2] = ["OXCCL_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD"];

fn too_many(nthreads: usize, per_thread: usize, reason: &str) -> NetError {
    NetError::Config(BadVar {
        var: "NCCL_NSOCKS_PERTHREAD",
        value: per_thread.to_string(),
        reason: format!(
            "{nthreads} threads × {per_thread} sockets exceeds {MAX_SOCKS} sockets per connection{reason}"
        ),
    })
}

/// The socket layout the user set (`NCCL_SOCKET_NTHREADS`,
/// `NCCL_NSOCKS_PERTHREAD` or their `OXCCL_` twins): each count where set,
/// checked in range; `None` where the rank's default applies. The facade
/// reads it with the rest of its settings and passes it down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketSettings {
    pub nthreads: Option<usize>,
    pub nsocks_per_thread: Option<usize>,
}

impl SocketSettings {
    /// The two counts read through `get` (the `OXCCL_` twin wins): threads
    /// 1 to 16, sockets per thread 1 to 64, both set at most 64 in all.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<SocketSettings, NetError> {
        let count = |vars, hi| -> Result<Option<usize>, NetError> {
            twin(&get, vars)
                .map(|(var, v)| number(var, &v, 1, hi))
                .transpose()
        };
        let s = SocketSettings {
            nthreads: count(THREADS_VARS, MAX_THREADS)?,
            nsocks_per_thread: count(SOCKS_VARS, MAX_SOCKS)?,
        };
        if let (Some(t), Some(p)) = (s.nthreads, s.nsocks_per_thread) {
            if t * p > MAX_SOCKS {
                return Err(too_many(t, p, ""));
            }
        }
        Ok(s)
    }
}

impl Proposal {
    /// What a rank proposes: the counts `set` names, else `auto`'s.
    pub fn new(set: &SocketSettings, auto: (usize, usize)) -> Proposal {
        let count = |s: Option<usize>, a| s.map_or(Count::Auto(a), Count::Set);
        Proposal {
            nthreads: count(set.nthreads, auto.0),
            nsocks_per_thread: count(set.nsocks_per_thread, auto.1),
        }
    }

    /// [`SocketSettings::from_vars`] through `get`, then [`Proposal::new`].
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
        auto: (usize, usize),
    ) -> Result<Proposal, NetError> {
        Ok(Proposal::new(&SocketSettings::from_vars(get)?, auto))
    }

    pub const BYTES: usize = 5;

    /// Threads and sockets per thread (u16 each, little-endian), then a
    /// byte whose bits 0 and 1 say which of them the user set.
    pub fn encode(&self) -> [u8; Proposal::BYTES] {
        let mut b = [0u8; Proposal::BYTES];
        b[0..2].copy_from_slice(&(self.nthreads.value() as u16).to_le_bytes());
        b[2..4].copy_from_slice(&(self.nsocks_per_thread.value() as u16).to_le_bytes());
        b[4] = u8::from(matches!(self.nthreads, Count::Set(_)))
            | u8::from(matches!(self.nsocks_per_thread, Count::Set(_))) << 1;
        b
    }

    /// A proposal from exactly [`Proposal::BYTES`] bytes, counts in range.
    pub fn decode(b: &[u8]) -> Result<Proposal, WireError> {
        let b: [u8; Proposal::BYTES] = b.try_into().map_err(|_| WireError::Truncated {
            what: "socket proposal",
            got: b.len(),
            want: Proposal::BYTES,
        })?;
        let bad = |detail: String| WireError::Malformed {
            what: "socket proposal",
            detail,
        };
        let count = |at: usize, bit: u8, hi: usize| {
            let n = u16::from_le_bytes([b[at], b[at + 1]]) as usize;
            if !(1..=hi).contains(&n) {
                return Err(bad(format!("a count of {n} (1 to {hi} allowed)")));
            }
            Ok(if b[4] & bit != 0 {
                Count::Set(n)
            } else {
                Count::Auto(n)
            })
        };
        if b[4] > 3 {
            return Err(bad(format!("flags {:#x}", b[4])));
        }
        Ok(Proposal {
            nthreads: count(0, 1, MAX_THREADS)?,
            nsocks_per_thread: count(2, 2, MAX_SOCKS)?,
        })
    }
}

/// The one count every rank takes from every rank's (in rank order): the
/// value the ranks that set it set (they must agree: else an error naming
/// two of them), else the smallest default, so no host runs more threads
/// than its own default; and whether some rank set it.
fn agree_count(
    counts: impl Iterator<Item = Count>,
    var: &'static str,
) -> Result<(usize, bool), NetError> {
    let mut set: Option<(usize, usize)> = None;
    let mut auto = usize::MAX;
    for (r, c) in counts.enumerate() {
        match (c, set) {
            (Count::Set(n), None) => set = Some((r, n)),
            (Count::Set(n), Some((r0, n0))) if n != n0 => {
                return Err(NetError::Config(BadVar {
                    var,
                    value: n.to_string(),
                    reason: format!(
                        "rank {r} sets {n} but rank {r0} sets {n0}: set it alike on every rank \
                         (or on none, for each host's default)"
                    ),
                }))
            }
            (Count::Set(_), Some(_)) => {}
            (Count::Auto(n), _) => auto = auto.min(n),
        }
    }
    Ok(match set {
        Some((_, n)) => (n, true),
        None => (auto.max(1), false),
    })
}

/// The layout `(threads, sockets per thread)` of every connection, from
/// every rank's proposal (in rank order): per count, what the ranks that
/// set it set (a disagreement is an error), else the smallest default. A
/// default count shrinks so the connection keeps to 64 sockets; two set
/// counts past that are an error.
pub fn agree(props: &[Proposal]) -> Result<(usize, usize), NetError> {
    let (t, t_set) = agree_count(props.iter().map(|p| p.nthreads), THREADS_VARS[1])?;
    let (s, s_set) = agree_count(props.iter().map(|p| p.nsocks_per_thread), SOCKS_VARS[1])?;
    if t * s <= MAX_SOCKS {
        return Ok((t, s));
    }
    match (t_set, s_set) {
        (_, false) => Ok((t, MAX_SOCKS / t)),
        (false, true) => Ok((MAX_SOCKS / s, s)),
        (true, true) => Err(too_many(t, s, " (the counts set on different ranks)")),
    }
}

/// Whether the environment read through `get` forces ranks of one host
/// onto the network, as NCCL does with `NCCL_P2P_DISABLE=1` and
/// `NCCL_SHM_DISABLE=1` together (or their `OXCCL_` twins): with both
/// peer-to-peer and shared memory off, only the network is left.
pub fn forced(get: impl Fn(&str) -> Option<String>) -> Result<bool, NetError> {
    let flag = |names: [&'static str; 2]| -> Result<bool, NetError> {
        match twin(&get, names) {
            None => Ok(false),
            Some((var, v)) => match v.trim() {
                "1" => Ok(true),
                "0" => Ok(false),
                _ => Err(NetError::Config(BadVar {
                    var,
                    value: v,
                    reason: "expected 0 or 1".into(),
                })),
            },
        }
    };
    Ok(flag(["OXCCL_P2P_DISABLE", "NCCL_P2P_DISABLE"])?
        && flag(["OXCCL_SHM_DISABLE", "NCCL_SHM_DISABLE"])?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_bootstrap::env::from_pairs as vars;

    const AUTO: (usize, usize) = (3, 2);

    #[test]
    fn nccl_names_and_twins_are_read_and_checked() {
        let p = Proposal::from_vars(
            vars(&[
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("NCCL_NSOCKS_PERTHREAD", "3"),
            ]),
            AUTO,
        )
        .unwrap();
        assert_eq!(
            (p.nthreads, p.nsocks_per_thread),
            (Count::Set(4), Count::Set(3))
        );
        let p = Proposal::from_vars(
            vars(&[
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("OXCCL_SOCKET_NTHREADS", "2"),
            ]),
            AUTO,
        )
        .unwrap();
        assert_eq!(
            (p.nthreads, p.nsocks_per_thread),
            (Count::Set(2), Count::Auto(2))
        );
        let p = Proposal::from_vars(vars(&[]), AUTO).unwrap();
        assert_eq!(
            (p.nthreads, p.nsocks_per_thread),
            (Count::Auto(3), Count::Auto(2))
        );
        for bad in [
            vec![("NCCL_SOCKET_NTHREADS", "0")],
            vec![("NCCL_SOCKET_NTHREADS", "17")],
            vec![("NCCL_SOCKET_NTHREADS", "x")],
            vec![("NCCL_NSOCKS_PERTHREAD", "65")],
            vec![
                ("NCCL_SOCKET_NTHREADS", "16"),
                ("NCCL_NSOCKS_PERTHREAD", "8"),
            ],
        ] {
            assert!(
                matches!(
                    Proposal::from_vars(vars(&bad), AUTO),
                    Err(NetError::Config(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_default_grows_with_the_cores_and_stays_in_bounds() {
        // 2 cores, 2 ranks (CI): one thread of two sockets.
        assert_eq!(auto_sockets(2, 2, 10), (1, 2));
        assert_eq!(auto_sockets(1, 1, 10), (1, 2));
        assert_eq!(auto_sockets(4, 2, 10), (1, 2));
        // 16 cores, 2 ranks, 4 channels and the control connection each
        // way: the 4 x 2 measured on the H200 host.
        assert_eq!(auto_sockets(16, 2, 10), (4, 2));
        assert_eq!(auto_sockets(8, 2, 10), (2, 2));
        // Ranks sharing the host share its cores.
        assert_eq!(auto_sockets(16, 8, 70), (1, 2));
        // Many connections: the threads a rank starts stay bounded.
        assert_eq!(auto_sockets(16, 1, 40), (3, 2));
        assert_eq!(auto_sockets(128, 8, 150), (1, 2));
        // Nonsense inputs still give a layout.
        assert_eq!(auto_sockets(0, 0, 0), (1, 2));
        for cores in [1, 2, 3, 8, 16, 64, 256, 4096] {
            for local in [1, 2, 3, 8, 64] {
                for conns in [1, 2, 10, 70, 1000] {
                    let (t, s) = auto_sockets(cores, local, conns);
                    assert!(
                        (1..=AUTO_MAX_THREADS).contains(&t),
                        "{cores} {local} {conns}"
                    );
                    assert!(t * s <= MAX_SOCKS && s >= 1);
                    let share = (cores / local).max(1);
                    assert!(t == 1 || t * conns <= AUTO_THREADS_PER_CORE * share);
                }
            }
        }
    }

    fn prop(t: Count, s: Count) -> Proposal {
        Proposal {
            nthreads: t,
            nsocks_per_thread: s,
        }
    }

    #[test]
    fn ranks_agree_on_set_counts_else_the_smallest_default() {
        use Count::{Auto, Set};
        // Defaults differ: the smallest, so no host runs more than its own.
        assert_eq!(
            agree(&[prop(Auto(4), Auto(2)), prop(Auto(1), Auto(2))]),
            Ok((1, 2))
        );
        // A count set on one rank is everyone's.
        assert_eq!(
            agree(&[prop(Auto(1), Auto(2)), prop(Set(4), Auto(2))]),
            Ok((4, 2))
        );
        assert_eq!(
            agree(&[
                prop(Set(4), Auto(2)),
                prop(Auto(1), Set(3)),
                prop(Set(4), Auto(2))
            ]),
            Ok((4, 3))
        );
        // Set on two ranks, differently: refused, naming both.
        let e = agree(&[
            prop(Set(4), Auto(2)),
            prop(Auto(1), Auto(2)),
            prop(Set(2), Auto(2)),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("NCCL_SOCKET_NTHREADS") && e.contains("rank 2 sets 2 but rank 0 sets 4"),
            "{e}"
        );
        let e = agree(&[prop(Auto(1), Set(1)), prop(Auto(1), Set(8))]).unwrap_err();
        assert!(e.to_string().contains("NCCL_NSOCKS_PERTHREAD"), "{e}");
        // Counts set on different ranks past 64 sockets: a default one
        // shrinks, two set ones are refused.
        assert_eq!(
            agree(&[prop(Set(16), Auto(2)), prop(Auto(1), Auto(8))]),
            Ok((16, 2))
        );
        assert_eq!(
            agree(&[prop(Auto(4), Set(32)), prop(Auto(4), Auto(2))]),
            Ok((2, 32))
        );
        assert!(agree(&[prop(Set(16), Auto(2)), prop(Auto(1), Set(8))]).is_err());
        // One rank: its own.
        assert_eq!(agree(&[prop(Auto(3), Auto(2))]), Ok((3, 2)));
    }

    #[test]
    fn proposals_travel_and_garbage_is_refused() {
        use Count::{Auto, Set};
        for p in [
            prop(Auto(1), Auto(2)),
            prop(Set(16), Auto(4)),
            prop(Auto(3), Set(64)),
            prop(Set(2), Set(2)),
        ] {
            assert_eq!(Proposal::decode(&p.encode()), Ok(p));
        }
        let good = prop(Set(2), Auto(2)).encode();
        assert!(Proposal::decode(&good[..4]).is_err());
        for (at, byte) in [(0, 0u8), (0, 17), (2, 0), (2, 65), (4, 4)] {
            let mut b = good;
            b[at] = byte;
            assert!(Proposal::decode(&b).is_err(), "byte {at} = {byte}");
        }
    }

    #[test]
    fn only_both_switches_together_force_the_network() {
        assert!(!forced(vars(&[])).unwrap());
        assert!(!forced(vars(&[("NCCL_P2P_DISABLE", "1")])).unwrap());
        assert!(forced(vars(&[
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1")
        ]))
        .unwrap());
        assert!(forced(vars(&[
            ("OXCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1")
        ]))
        .unwrap());
        assert!(!forced(vars(&[
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1"),
            ("OXCCL_SHM_DISABLE", "0")
        ]))
        .unwrap());
        assert!(forced(vars(&[
            ("NCCL_P2P_DISABLE", "yes"),
            ("NCCL_SHM_DISABLE", "1")
        ]))
        .is_err());
    }
}
