//! [`ConfigBuilder`]: the configuration with types instead of strings.

use std::time::Duration;

use oxccl_core::{Algo, CollKind, Proto};

use super::{Config, CudaSettings, DebugLevel, Filter, HostSettings, Rule, NO_DEADLINE};
use crate::backend::BackendKind;
use crate::error::{Error, Result};

/// Builds a [`Config`]; [`ConfigBuilder::build`] checks it as the
/// environment's values are checked.
#[derive(Clone, Debug)]
#[must_use]
pub struct ConfigBuilder(pub(super) Config);

fn rule<T: Copy>(names: &[T], exclude: bool) -> Rule<T> {
    Rule {
        exclude,
        names: names.to_vec(),
    }
}

impl ConfigBuilder {
    pub fn backend(mut self, b: BackendKind) -> Self {
        self.0.backend = b;
        self
    }

    /// Only these algorithms, for every collective without its own rule
    /// (`NCCL_ALGO=ring,tree`).
    pub fn algorithms(mut self, algos: &[Algo]) -> Self {
        self.0.algo.default = Some(rule(algos, false));
        self
    }

    /// Every algorithm but these (`NCCL_ALGO=^ring`).
    pub fn excluding_algorithms(mut self, algos: &[Algo]) -> Self {
        self.0.algo.default = Some(rule(algos, true));
        self
    }

    /// Only these algorithms for `kind` (`NCCL_ALGO=allreduce:tree`).
    pub fn algorithms_for(mut self, kind: CollKind, algos: &[Algo]) -> Self {
        self.0.algo.per_coll.push((kind, rule(algos, false)));
        self
    }

    /// Only these protocols (`NCCL_PROTO=simple`).
    pub fn protocols(mut self, protos: &[Proto]) -> Self {
        self.0.proto.default = Some(rule(protos, false));
        self
    }

    /// Only these protocols for `kind`.
    pub fn protocols_for(mut self, kind: CollKind, protos: &[Proto]) -> Self {
        self.0.proto.per_coll.push((kind, rule(protos, false)));
        self
    }

    /// A fixed channel count (capped by the backend's maximum).
    pub fn channels(mut self, n: u32) -> Self {
        self.0.channels = Some(n);
        self
    }

    /// Every wait gives up after `d`.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.0.deadline = d;
        self
    }

    /// Waits never give up.
    pub fn no_deadline(mut self) -> Self {
        self.0.deadline = NO_DEADLINE;
        self
    }

    /// A wait for peers that have not reached a call warns after `first`,
    /// then every `every` (defaults 10 s and a minute).
    pub fn wait_warnings(mut self, first: Duration, every: Duration) -> Self {
        self.0.wait_warn = super::WaitWarn { first, every };
        self
    }

    /// The CUDA device this process's rank runs on (ranks as processes);
    /// without it ranks of one host take the visible devices round-robin.
    /// A negative ordinal is refused by [`ConfigBuilder::build`].
    pub fn device(mut self, ordinal: i32) -> Self {
        self.0.cuda.device = Some(ordinal);
        self
    }

    /// Piece size in bytes (`OXCCL_CHUNK_BYTES`).
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.0.chunk_bytes = Some(bytes);
        self
    }

    /// Deterministic reductions (`OXCCL_DETERMINISTIC`; default off): see
    /// [`Config::deterministic`].
    pub fn deterministic(mut self, on: bool) -> Self {
        self.0.deterministic = on;
        self
    }

    /// Whether calls are compared between ranks (default on).
    pub fn check_calls(mut self, on: bool) -> Self {
        self.0.check_calls = on;
        self
    }

    /// Whether calls are compared between ranks that talk over the network
    /// too (default off; see [`Config::check_calls_across_hosts`]).
    pub fn check_calls_across_hosts(mut self, on: bool) -> Self {
        self.0.check_calls_across_hosts = on;
        self
    }

    /// Logging, as `OXCCL_DEBUG` would set it.
    pub fn debug(mut self, level: DebugLevel) -> Self {
        self.0.debug = Some(level);
        self
    }

    /// A topology file to read instead of detecting the machine
    /// (`OXCCL_TOPO_FILE`).
    pub fn topology_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.0.topology_file = Some(path.into());
        self
    }

    /// The host backend's settings (`OXCCL_NET_CHANNELS`, the socket
    /// layout, `NCCL_P2P_DISABLE`/`NCCL_SHM_DISABLE`).
    pub fn host(mut self, s: HostSettings) -> Self {
        self.0.host = s;
        self
    }

    /// The CUDA backend's settings (`OXCCL_CACHE_DIR`, `OXCCL_PROC_HEAP`,
    /// the experiments).
    pub fn cuda(mut self, s: CudaSettings) -> Self {
        self.0.cuda = s;
        self
    }

    /// The rendezvous's settings (`NCCL_COMM_ID`, `NCCL_SOCKET_IFNAME`,
    /// `NCCL_HOSTID`, ...).
    pub fn bootstrap(mut self, s: oxccl_bootstrap::BootstrapSettings) -> Self {
        self.0.bootstrap = s;
        self
    }

    /// The configuration, or the first value that cannot work: a zero
    /// channel count, chunk or deadline, a negative device ordinal, an
    /// empty algorithm or protocol list.
    pub fn build(self) -> Result<Config> {
        let c = self.0;
        let bad = |var: &str, value: String, reason: &str| Error::Config {
            var: var.into(),
            value,
            reason: reason.into(),
        };
        if c.channels == Some(0) {
            return Err(bad("channels", "0".into(), "expected a positive count"));
        }
        if c.chunk_bytes == Some(0) {
            return Err(bad(
                "chunk_bytes",
                "0".into(),
                "expected a positive byte count",
            ));
        }
        if let Some(d) = c.cuda.device.filter(|&d| d < 0) {
            return Err(bad(
                "device",
                d.to_string(),
                "a CUDA device ordinal is 0 or more",
            ));
        }
        if c.deadline.is_zero() {
            return Err(bad(
                "deadline",
                "0".into(),
                "a zero deadline fails every wait; use no_deadline() to turn it off",
            ));
        }
        if c.wait_warn.every.is_zero() {
            return Err(bad(
                "wait_warnings",
                "0".into(),
                "a zero period would warn on every poll",
            ));
        }
        check_lists("algorithms", &c.algo)?;
        check_lists("protocols", &c.proto)?;
        Ok(c)
    }
}

/// An include list naming nothing would allow nothing.
fn check_lists<T>(what: &str, f: &Filter<T>) -> Result<()> {
    let rules = f.default.iter().chain(f.per_coll.iter().map(|(_, r)| r));
    for r in rules {
        if !r.exclude && r.names.is_empty() {
            return Err(Error::Config {
                var: what.into(),
                value: "[]".into(),
                reason: "an empty list allows nothing".into(),
            });
        }
    }
    Ok(())
}
