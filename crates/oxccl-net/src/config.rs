//! The transport's knobs, read from the environment as NCCL reads them.

use std::time::Duration;

use oxccl_bootstrap::env::BadVar;

use crate::error::NetError;
use crate::wire::MAX_SOCKS;

/// How the TCP transport spreads one connection over sockets and threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Helper threads per connection (`NCCL_SOCKET_NTHREADS`, 1 to 16;
    /// default 1).
    pub nthreads: usize,
    /// Sockets each helper thread drives (`NCCL_NSOCKS_PERTHREAD`; default
    /// 2). `nthreads × nsocks_per_thread` is at most 64.
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
            deadline: Duration::from_secs(300),
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
    /// The defaults with `NCCL_SOCKET_NTHREADS` and `NCCL_NSOCKS_PERTHREAD`
    /// (or their `OXCCL_` twins) read through `get`, under `deadline`.
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
        deadline: Duration,
    ) -> Result<TcpConfig, NetError> {
        let mut c = TcpConfig {
            deadline,
            ..TcpConfig::default()
        };
        if let Some((var, v)) = twin(&get, ["OXCCL_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS"]) {
            c.nthreads = number(var, &v, 1, 16)?;
        }
        if let Some((var, v)) = twin(&get, ["OXCCL_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD"]) {
            c.nsocks_per_thread = number(var, &v, 1, MAX_SOCKS)?;
        }
        if c.nsocks() > MAX_SOCKS {
            return Err(NetError::Config(BadVar {
                var: "NCCL_NSOCKS_PERTHREAD",
                value: c.nsocks_per_thread.to_string(),
                reason: format!(
                    "{} threads × {} sockets exceeds {MAX_SOCKS} sockets per connection",
                    c.nthreads, c.nsocks_per_thread
                ),
            }));
        }
        Ok(c)
    }

    /// [`TcpConfig::from_vars`] on this process's environment.
    pub fn from_env(deadline: Duration) -> Result<TcpConfig, NetError> {
        TcpConfig::from_vars(|k| std::env::var(k).ok(), deadline)
    }

    /// Sockets per connection.
    pub fn nsocks(&self) -> usize {
        self.nthreads * self.nsocks_per_thread
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

/// [`forced`] on this process's environment.
pub fn forced_by_env() -> Result<bool, NetError> {
    forced(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_bootstrap::env::from_pairs as vars;

    #[test]
    fn nccl_names_and_twins_are_read_and_checked() {
        let d = Duration::from_secs(1);
        let c = TcpConfig::from_vars(
            vars(&[
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("NCCL_NSOCKS_PERTHREAD", "3"),
            ]),
            d,
        )
        .unwrap();
        assert_eq!((c.nthreads, c.nsocks_per_thread, c.nsocks()), (4, 3, 12));
        let c = TcpConfig::from_vars(
            vars(&[
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("OXCCL_SOCKET_NTHREADS", "2"),
            ]),
            d,
        )
        .unwrap();
        assert_eq!(c.nthreads, 2);
        for bad in [
            vec![("NCCL_SOCKET_NTHREADS", "0")],
            vec![("NCCL_SOCKET_NTHREADS", "x")],
            vec![
                ("NCCL_SOCKET_NTHREADS", "16"),
                ("NCCL_NSOCKS_PERTHREAD", "8"),
            ],
        ] {
            assert!(matches!(
                TcpConfig::from_vars(vars(&bad), d),
                Err(NetError::Config(_))
            ));
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
