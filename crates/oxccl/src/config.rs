//! Configuration: algorithm/protocol filters, channels, deadline, backend,
//! and their environment variables.
//!
//! `NCCL_ALGO` / `NCCL_PROTO` follow NCCL's syntax, and `OXCCL_ALGO` /
//! `OXCCL_PROTO` (same syntax) win over them:
//!
//! - a comma list allows only those names: `ring,tree`;
//! - a leading `^` excludes them instead: `^ring`;
//! - `;`-separated `collective:list` entries apply per collective, and a
//!   plain list among them applies to every other collective:
//!   `allreduce:tree;broadcast:^ring` or `ring;allreduce:tree,ring`.
//!
//! Names are case-insensitive. Algorithms: `ring`, `tree` (double binary
//! tree), `chain`, `btree`, `oneshot`, `twoshot`, `allpairs`. Protocols:
//! `simple`, `ll`, `ll128`. NCCL names oxccl does not implement (`nvls`,
//! `collnet`, `pat`, ...) and misspellings are errors, never ignored.
//!
//! Other variables: `OXCCL_CHANNELS` (else `NCCL_MAX_NCHANNELS`) caps the
//! channel count; `OXCCL_DEADLINE_MS` sets the wait deadline;
//! `OXCCL_BACKEND` = `host` | `cuda` | `auto`; `OXCCL_CHUNK_BYTES` (`64K`,
//! `1M`, ...) sets the piece size plans pipeline in; `OXCCL_CHECK_CALLS=0`
//! turns off the comparison of calls between ranks; `OXCCL_DEBUG` (else
//! `NCCL_DEBUG`) = `VERSION` | `WARN` | `INFO` | `TRACE` turns on logging.

use std::str::FromStr;
use std::time::Duration;

use oxccl_core::{Algo, CollKind, Proto};

use crate::backend::BackendKind;
use crate::error::{Error, Result};

/// Which names a filter lets through, for one collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule<T> {
    /// `^` form: the names are excluded rather than allowed.
    pub exclude: bool,
    pub names: Vec<T>,
}

impl<T: PartialEq> Rule<T> {
    fn allows(&self, x: &T) -> bool {
        self.names.contains(x) != self.exclude
    }
}

/// A parsed `NCCL_ALGO`/`NCCL_PROTO` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter<T> {
    /// Applies to collectives without their own rule.
    pub default: Option<Rule<T>>,
    pub per_coll: Vec<(CollKind, Rule<T>)>,
}

impl<T> Default for Filter<T> {
    fn default() -> Self {
        Filter {
            default: None,
            per_coll: Vec::new(),
        }
    }
}

impl<T: PartialEq + Copy> Filter<T> {
    /// Whether `x` may be used for `kind`.
    pub fn allows(&self, kind: CollKind, x: T) -> bool {
        let rule = self
            .per_coll
            .iter()
            .rev()
            .find(|(k, _)| *k == kind)
            .map(|(_, r)| r)
            .or(self.default.as_ref());
        rule.is_none_or(|r| r.allows(&x))
    }

    /// The members of `all` allowed for `kind`, in `all`'s order.
    pub fn allowed(&self, kind: CollKind, all: &[T]) -> Vec<T> {
        all.iter()
            .copied()
            .filter(|x| self.allows(kind, *x))
            .collect()
    }

    /// Whether no rule is set.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.per_coll.is_empty()
    }
}

/// NCCL algorithm names that oxccl knows but does not implement.
const NCCL_ONLY_ALGOS: [&str; 6] = [
    "collnet",
    "collnetdirect",
    "collnetchain",
    "nvls",
    "nvlstree",
    "pat",
];

/// Parses one algorithm name, in NCCL's or oxccl's spelling.
fn parse_algo(var: &str, value: &str, name: &str) -> Result<Algo> {
    if NCCL_ONLY_ALGOS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(Error::Config {
            var: var.into(),
            value: value.into(),
            reason: format!("algorithm {name:?} is an NCCL algorithm oxccl does not implement; use ring, tree, chain, btree, oneshot, twoshot or allpairs"),
        });
    }
    Algo::from_str(name).map_err(|e| Error::Config {
        var: var.into(),
        value: value.into(),
        reason: e.to_string(),
    })
}

fn parse_proto(var: &str, value: &str, name: &str) -> Result<Proto> {
    Proto::from_str(name).map_err(|e| Error::Config {
        var: var.into(),
        value: value.into(),
        reason: e.to_string(),
    })
}

/// Parses a filter value with `item` parsing each name. `var` names the
/// variable in errors.
fn parse_filter<T>(
    var: &str,
    value: &str,
    item: impl Fn(&str, &str, &str) -> Result<T>,
) -> Result<Filter<T>> {
    let bad = |reason: String| Error::Config {
        var: var.into(),
        value: value.into(),
        reason,
    };
    let mut f = Filter::default();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (coll, list) = match entry.split_once(':') {
            Some((c, l)) => (
                Some(CollKind::from_str(c.trim()).map_err(|e| bad(e.to_string()))?),
                l.trim(),
            ),
            None => (None, entry),
        };
        let (exclude, list) = match list.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        let names = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| item(var, value, n))
            .collect::<Result<Vec<T>>>()?;
        if names.is_empty() {
            return Err(bad(format!("entry {entry:?} names nothing")));
        }
        let rule = Rule { exclude, names };
        match coll {
            Some(k) => f.per_coll.push((k, rule)),
            None if f.default.is_some() => {
                return Err(bad("more than one list applies to every collective".into()))
            }
            None => f.default = Some(rule),
        }
    }
    Ok(f)
}

/// Parses an `NCCL_ALGO`-style value (see the module docs).
pub fn parse_algo_filter(var: &str, value: &str) -> Result<Filter<Algo>> {
    parse_filter(var, value, parse_algo)
}

/// Parses an `NCCL_PROTO`-style value (see the module docs).
pub fn parse_proto_filter(var: &str, value: &str) -> Result<Filter<Proto>> {
    parse_filter(var, value, parse_proto)
}

/// Logging level from `NCCL_DEBUG`/`OXCCL_DEBUG`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    Version,
    Warn,
    Info,
    Trace,
}

impl DebugLevel {
    fn parse(var: &str, value: &str) -> Result<DebugLevel> {
        Ok(match value.trim().to_ascii_uppercase().as_str() {
            "VERSION" => DebugLevel::Version,
            "WARN" => DebugLevel::Warn,
            "INFO" => DebugLevel::Info,
            "TRACE" => DebugLevel::Trace,
            _ => {
                return Err(Error::Config {
                    var: var.into(),
                    value: value.into(),
                    reason: "expected VERSION, WARN, INFO or TRACE".into(),
                })
            }
        })
    }
}

/// How a clique is set up and how it chooses plans.
#[derive(Clone, Debug)]
pub struct Config {
    pub backend: BackendKind,
    /// Which algorithms may be chosen (per collective).
    pub algo: Filter<Algo>,
    /// Which protocols may be chosen (per collective).
    pub proto: Filter<Proto>,
    /// Channel count: `None` lets the selector decide; the backend's
    /// maximum caps it either way.
    pub channels: Option<u32>,
    /// Every wait gives up after this long.
    pub deadline: Duration,
    /// Piece size override in bytes (`OXCCL_CHUNK_BYTES`): FIFO messages
    /// (capped at the backend's slot) and registered direct plans' pieces.
    /// `None`: the backend's slot for FIFO plans, larger pieces for direct
    /// ones.
    pub chunk_bytes: Option<usize>,
    /// Logging requested through the environment.
    pub debug: Option<DebugLevel>,
    /// Compare every call's fingerprint with the peers' before any data
    /// moves (`OXCCL_CHECK_CALLS`, default on; see [`crate::Error::Mismatch`]).
    pub check_calls: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Auto,
            algo: Filter::default(),
            proto: Filter::default(),
            channels: None,
            deadline: Duration::from_secs(300),
            chunk_bytes: None,
            debug: None,
            check_calls: true,
        }
    }
}

impl Config {
    /// The wait deadline as the waits take it.
    pub(crate) fn deadline_opt(&self) -> Option<Duration> {
        Some(self.deadline)
    }

    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// Defaults overridden by the variables `get` returns (a pure function
    /// of its input, so it can be tested without touching the process
    /// environment). `OXCCL_*` variables win over their `NCCL_*` twins.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let pick = |ox: &'static str, nccl: Option<&'static str>| {
            get(ox)
                .map(|v| (ox, v))
                .or_else(|| nccl.and_then(|n| get(n).map(|v| (n, v))))
        };
        let mut c = Config::default();
        if let Some((var, v)) = pick("OXCCL_ALGO", Some("NCCL_ALGO")) {
            c.algo = parse_algo_filter(var, &v)?;
        }
        if let Some((var, v)) = pick("OXCCL_PROTO", Some("NCCL_PROTO")) {
            c.proto = parse_proto_filter(var, &v)?;
        }
        if let Some((var, v)) = pick("OXCCL_CHANNELS", Some("NCCL_MAX_NCHANNELS")) {
            c.channels = Some(parse_positive(var, &v)?);
        }
        if let Some((var, v)) = pick("OXCCL_DEADLINE_MS", None) {
            c.deadline = Duration::from_millis(parse_positive(var, &v)?.into());
        }
        if let Some((var, v)) = pick("OXCCL_CHUNK_BYTES", None) {
            c.chunk_bytes = Some(parse_bytes(var, &v)?);
        }
        if let Some((var, v)) = pick("OXCCL_BACKEND", None) {
            c.backend = BackendKind::from_str(&v).map_err(|_| Error::Config {
                var: var.into(),
                value: v.clone(),
                reason: "expected host, cuda or auto".into(),
            })?;
        }
        if let Some((var, v)) = pick("OXCCL_CHECK_CALLS", None) {
            c.check_calls = parse_bool(var, &v)?;
        }
        if let Some((var, v)) = pick("OXCCL_DEBUG", Some("NCCL_DEBUG")) {
            c.debug = Some(DebugLevel::parse(var, &v)?);
        }
        Ok(c)
    }
}

/// Parses a byte count: `8`, `64K`, `1M`, `2G` (powers of 1024; the
/// sweep's sizes and `OXCCL_CHUNK_BYTES`).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1usize << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("bad size suffix in {s:?}: use K, M or G")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.parse::<usize>()
        .map_err(|e| format!("bad size {s:?}: {e}"))?
        .checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// A positive byte count (see [`parse_size`]) from variable `var`.
fn parse_bytes(var: &str, v: &str) -> Result<usize> {
    match parse_size(v) {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err(Error::Config {
            var: var.into(),
            value: v.into(),
            reason: "expected a positive byte count".into(),
        }),
        Err(reason) => Err(Error::Config {
            var: var.into(),
            value: v.into(),
            reason,
        }),
    }
}

fn parse_positive(var: &str, v: &str) -> Result<u32> {
    match v.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::Config {
            var: var.into(),
            value: v.into(),
            reason: "expected a positive integer".into(),
        }),
    }
}

/// `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no` (any case).
fn parse_bool(var: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(Error::Config {
            var: var.into(),
            value: v.into(),
            reason: "expected 1 or 0 (true/false, on/off, yes/no)".into(),
        }),
    }
}
