//! Configuration: algorithm/protocol filters, channels, deadline, backend,
//! and their environment variables. [`Config`] is the root of the settings
//! tree; `crate::settings` lists every variable and reads them.
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
//! tree), `chain`, `btree`, `oneshot`, `twoshot`, `allpairs`, `ce` (copy
//! engine: copies only, registered buffers, never picked unless forced). Protocols:
//! `simple`, `ll`. NCCL algorithms and protocols oxccl does not implement
//! (`nvls`, `nvlstree`, `collnet`, `collnetdirect`, `collnetchain`, `pat`;
//! `ll128`) are ignored with a warning printed to stderr once the
//! configuration is read (unless the debug level is `NONE`), so values
//! written for NCCL work unchanged: `^nvls` allows everything oxccl has,
//! and an entry naming only such names (`NCCL_PROTO=LL128`) restricts
//! nothing. A filter that then leaves a collective nothing oxccl runs
//! (`NCCL_PROTO=^simple` on the host backend) fails init naming the
//! variable; misspellings are errors. Every value is checked when the
//! configuration is read, before any communicator exists.
//!
//! Other variables: `OXCCL_CHANNELS` (else `NCCL_MAX_NCHANNELS`) caps the
//! channel count; `OXCCL_DEADLINE_MS` sets the wait deadline (`0`, `off` or
//! `none`: none; default 300 s, none through the C ABI; a wait for absent
//! peers warns on stderr after `OXCCL_WAIT_WARN_MS`, default 10 s, then every
//! `OXCCL_WAIT_WARN_EVERY_MS`, default a minute);
//! `OXCCL_DETERMINISTIC=1` keeps reductions to plans that reduce in rank
//! order ([`Config::deterministic`]);
//! `OXCCL_BACKEND` = `host` | `cuda` | `auto`; `OXCCL_CHUNK_BYTES` (`64K`,
//! `1M`, ...) sets the piece size plans pipeline in; `OXCCL_CHECK_CALLS=0`
//! turns off the comparison of calls between ranks, `=all` extends it to
//! ranks that talk over the network.
//!
//! Logging: `OXCCL_DEBUG` (else `NCCL_DEBUG`) = `NONE` | `VERSION` |
//! `WARN` | `ABORT` | `INFO` | `TRACE` (NCCL's levels), written to stderr
//! through `tracing`; `OXCCL_DEBUG_SUBSYS` (else `NCCL_DEBUG_SUBSYS`)
//! picks the subsystems whose INFO and TRACE lines show, in NCCL's syntax
//! and with NCCL's default `INIT,BOOTSTRAP,ENV` (each call's line is
//! `COLL`'s; see [`Subsystems`]); `RUST_LOG` replaces the filter when set.
//! An application with its own `tracing` subscriber gets every event.
//!
//! The step trace: `OXCCL_TRACE=path` (and `OXCCL_TRACE_CALLS`, default
//! 64) sets [`Config::trace`] ([`TraceSettings`]); see [`crate::observe`].
//!
//! In code, [`Config::builder`] sets the same things with types:
//! `Config::builder().backend(BackendKind::Host).algorithms(&[Algo::Ring]).build()`.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use oxccl_core::{Algo, CollKind, Proto};

use crate::backend::BackendKind;
use crate::error::{Error, Result};
pub use branches::WaitWarn;

pub(crate) mod branches;
mod builder;
mod subsys;
pub use branches::{CudaSettings, HostSettings, ProcsPath};
pub use builder::ConfigBuilder;
pub use subsys::Subsystems;

/// Calls per rank the step trace records unless `OXCCL_TRACE_CALLS` says.
pub const DEFAULT_TRACE_CALLS: usize = 64;

/// What `OXCCL_TRACE` and `OXCCL_TRACE_CALLS` ask for (see the step trace
/// in [`crate::observe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSettings {
    /// Where the trace is written.
    pub path: std::path::PathBuf,
    /// Calls per rank recorded (from the first).
    pub calls: usize,
}

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
    /// NCCL names the value listed that oxccl lacks and so ignored, each
    /// as the warning to print (`Config::from_env` prints them once).
    pub ignored: Vec<String>,
}

impl<T> Default for Filter<T> {
    fn default() -> Self {
        Filter {
            default: None,
            per_coll: Vec::new(),
            ignored: Vec::new(),
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

/// NCCL protocol names that no oxccl backend runs (the core knows LL128
/// for its cost model, but nothing executes it).
const NCCL_ONLY_PROTOS: [&str; 1] = ["ll128"];

/// Parses one algorithm name, in NCCL's or oxccl's spelling. NCCL
/// algorithms oxccl does not implement are ignored (so `NCCL_ALGO=^nvls`,
/// common on clusters, means "every algorithm"): `None`. Misspellings are
/// errors.
fn parse_algo(var: &str, value: &str, name: &str) -> Result<Option<Algo>> {
    if NCCL_ONLY_ALGOS.contains(&name.to_ascii_lowercase().as_str()) {
        return Ok(None);
    }
    Algo::from_str(name).map(Some).map_err(|e| Error::Config {
        var: var.into(),
        value: value.into(),
        reason: e.to_string(),
    })
}

/// Parses one protocol name; `ll128`, which no backend runs, is ignored
/// as NCCL-only algorithms are.
fn parse_proto(var: &str, value: &str, name: &str) -> Result<Option<Proto>> {
    if NCCL_ONLY_PROTOS.contains(&name.to_ascii_lowercase().as_str()) {
        return Ok(None);
    }
    Proto::from_str(name).map(Some).map_err(|e| Error::Config {
        var: var.into(),
        value: value.into(),
        reason: e.to_string(),
    })
}

/// Parses a filter value with `item` parsing each name (`None`: an NCCL
/// `what` oxccl lacks, recorded in [`Filter::ignored`]). `var` names the
/// variable in errors.
fn parse_filter<T>(
    var: &str,
    value: &str,
    what: &str,
    item: impl Fn(&str, &str, &str) -> Result<Option<T>>,
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
        let listed: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        if listed.is_empty() {
            return Err(bad(format!("entry {entry:?} names nothing")));
        }
        let mut names = Vec::new();
        for n in listed {
            match item(var, value, n)? {
                Some(x) => names.push(x),
                None => f.ignored.push(format!(
                    "{var}={value:?}: {n:?} is an NCCL {what} oxccl does not implement; ignored"
                )),
            }
        }
        if names.is_empty() {
            // Only names that are ignored: the entry says nothing oxccl
            // can follow (`^nvls` excludes nothing, `nvls` allows nothing
            // that exists), so it does not restrict the choice.
            continue;
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
    parse_filter(var, value, "algorithm", parse_algo)
}

/// Parses an `NCCL_PROTO`-style value (see the module docs).
pub fn parse_proto_filter(var: &str, value: &str) -> Result<Filter<Proto>> {
    parse_filter(var, value, "protocol", parse_proto)
}

/// Logging level from `NCCL_DEBUG`/`OXCCL_DEBUG`: NCCL's levels, in its
/// order. `NONE` logs nothing; `VERSION` prints the version once; `WARN`
/// and `ABORT` (NCCL: warnings, plus a message when it aborts) log
/// warnings and failures; `INFO` adds each call's choice; `TRACE` adds the
/// per-call detail (plan lookups, the call check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    None,
    Version,
    Warn,
    Abort,
    Info,
    Trace,
}

impl DebugLevel {
    pub(crate) fn parse(var: &str, value: &str) -> Result<DebugLevel> {
        Ok(match value.trim().to_ascii_uppercase().as_str() {
            "NONE" | "" => DebugLevel::None,
            "VERSION" => DebugLevel::Version,
            "WARN" => DebugLevel::Warn,
            "ABORT" => DebugLevel::Abort,
            "INFO" => DebugLevel::Info,
            "TRACE" => DebugLevel::Trace,
            _ => {
                return Err(Error::Config {
                    var: var.into(),
                    value: value.into(),
                    reason: "expected NONE, VERSION, WARN, ABORT, INFO or TRACE".into(),
                })
            }
        })
    }
}

/// The deadline that is no deadline: waits never give up (a hang stays a
/// hang, still warned about periodically; see [`Config::wait_warn`]).
pub const NO_DEADLINE: Duration = Duration::MAX;

/// The one-step LL AllReduce's largest payload by default (64 KiB per
/// rank: 128 KiB of LL lines per sender and parity).
pub const DEFAULT_LL1_BYTES: usize = 64 << 10;

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
    /// Every wait gives up after this long; [`NO_DEADLINE`] (from
    /// `OXCCL_DEADLINE_MS=0`, `off` or `none`) waits for ever.
    pub deadline: Duration,
    /// When a wait for peers that have not reached a call first warns
    /// (`OXCCL_WAIT_WARN_MS`, default 10 s), then how often it warns again
    /// (`OXCCL_WAIT_WARN_EVERY_MS`, default a minute). The warning goes to
    /// stderr whether or not logging was asked for, naming the absent
    /// ranks and the call; it is printed with or without a deadline. Calls
    /// a backend enqueues (CUDA) that have not completed by then get the
    /// same warning from the clique's watchdog thread.
    pub wait_warn: WaitWarn,
    /// Piece size override in bytes (`OXCCL_CHUNK_BYTES`): FIFO messages
    /// (capped at the backend's slot) and registered direct plans' pieces.
    /// `None`: the backend's slot for FIFO plans, larger pieces for direct
    /// ones.
    pub chunk_bytes: Option<usize>,
    /// Largest AllReduce, in bytes per rank, the one-step LL path
    /// (`ll1`, [`Algo::OneShotLl`]) serves (`OXCCL_LL1_BYTES`, default
    /// [`DEFAULT_LL1_BYTES`]); each rank's LL slots take 2 × ranks × twice
    /// this. 0 turns the path off (`ll1` then runs the FIFO one-shot).
    pub ll1_bytes: usize,
    /// Logging requested through the environment.
    pub debug: Option<DebugLevel>,
    /// Whose INFO and TRACE lines show (`OXCCL_DEBUG_SUBSYS`, else
    /// `NCCL_DEBUG_SUBSYS`; NCCL's default INIT, BOOTSTRAP, ENV).
    pub debug_subsys: Subsystems,
    /// Deterministic reductions (`OXCCL_DETERMINISTIC=1`; default off):
    /// AllReduce, Reduce and ReduceScatter run only plans that reduce
    /// every element in rank order 0..n−1 from the original inputs
    /// ([`oxccl_core::gen::reduces_in_rank_order`]: one-shot and two-shot
    /// AllReduce, all-pairs Reduce and ReduceScatter), so a result is the
    /// same bits for a given rank count and input whatever the algorithm,
    /// protocol, channel count, piece size or call size, and equals the
    /// sequential reference. An algorithm filter that leaves a reduction
    /// no such plan makes its calls fail with [`crate::Error::NoAlgorithm`]
    /// (a per-collective rule fails init). Every rank must agree, as on
    /// `NCCL_ALGO`.
    pub deterministic: bool,
    /// Compare every call's fingerprint with the peers' before any data
    /// moves (`OXCCL_CHECK_CALLS`, default on; see [`crate::Error::Mismatch`]).
    /// Ranks as processes check only if every rank has it on, and over the
    /// network only with [`Config::check_calls_across_hosts`]: a communicator's
    /// [`crate::Communicator::config`] says whether it checks.
    pub check_calls: bool,
    /// Also compare calls between ranks that talk over the network
    /// (`OXCCL_CHECK_CALLS=all`; default off): each collective then costs
    /// every rank n − 1 small messages out and in, over connections made at
    /// init (`check/mirror.rs`). Only with [`Config::check_calls`], and only
    /// if every rank asks for it.
    pub check_calls_across_hosts: bool,
    /// The machine a GPU backend's selector models, given instead of
    /// detected (what `OXCCL_TOPO_FILE` does, without the process
    /// environment or the live driver). `None`: detect it. The host
    /// backend models no GPU and ignores it.
    pub topology: Option<oxccl_topo::Topology>,
    /// A topology file to read instead of detecting the machine
    /// (`OXCCL_TOPO_FILE`, else `NCCL_TOPO_FILE`); [`Config::topology`]
    /// wins over it.
    pub topology_file: Option<std::path::PathBuf>,
    /// The most outputs one pushing step writes (`OXCCL_PUSH_GROUP`, an
    /// experiment); `None`: the plan generators' defaults.
    pub push_group: Option<usize>,
    /// Whether direct Send/Recv plans may run (`OXCCL_P2P_DIRECT=0` turns
    /// them off, an experiment; default on). The sender decides and the
    /// receiver follows through the call check, so ranks cannot disagree.
    pub p2p_direct: bool,
    /// The host backend's settings (network channels and sockets).
    pub host: HostSettings,
    /// The CUDA backend's settings (kernel cache, heap, experiments).
    pub cuda: CudaSettings,
    /// The rendezvous's settings (`NCCL_COMM_ID`, interface, host id; its
    /// `wait_warn` is this configuration's `wait_warn` at init).
    pub bootstrap: oxccl_bootstrap::BootstrapSettings,
    /// The step trace (`OXCCL_TRACE`, `OXCCL_TRACE_CALLS`); `None`: off.
    pub trace: Option<TraceSettings>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Auto,
            algo: Filter::default(),
            proto: Filter::default(),
            channels: None,
            deadline: oxccl_bootstrap::DEFAULT_DEADLINE,
            wait_warn: WaitWarn::default(),
            chunk_bytes: None,
            ll1_bytes: DEFAULT_LL1_BYTES,
            debug: None,
            debug_subsys: Subsystems::default(),
            deterministic: false,
            check_calls: true,
            check_calls_across_hosts: false,
            topology: None,
            topology_file: None,
            push_group: None,
            p2p_direct: true,
            host: Default::default(),
            cuda: Default::default(),
            bootstrap: Default::default(),
            trace: None,
        }
    }
}

impl Config {
    /// The rendezvous's settings, with this configuration's wait warnings
    /// (a root still waiting for ranks warns as a call's wait does).
    pub(crate) fn bootstrap_settings(&self) -> oxccl_bootstrap::BootstrapSettings {
        oxccl_bootstrap::BootstrapSettings {
            wait_warn: self.wait_warn,
            ..self.bootstrap.clone()
        }
    }

    /// The options of a backend for a clique of `nranks` ranks configured
    /// by `self`.
    pub fn backend_options(&self, nranks: u32) -> crate::backend::BackendOptions {
        crate::backend::BackendOptions {
            nranks,
            deadline: self.deadline,
            wait_warn: self.wait_warn,
            ll1_bytes: self.ll1_bytes,
            host: self.host.clone(),
            cuda: self.cuda.clone(),
        }
    }

    /// The wait deadline as the waits take it (`None`: off).
    pub(crate) fn deadline_opt(&self) -> Option<Duration> {
        (self.deadline != NO_DEADLINE).then_some(self.deadline)
    }

    /// A typed builder starting from the defaults (the environment is not
    /// read): `Config::builder().backend(BackendKind::Host).build()?`.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder(Config::default())
    }

    /// The warnings for NCCL algorithm and protocol names the filters
    /// ignored, in the order the values listed them.
    pub fn ignored_names(&self) -> Vec<&str> {
        let algo = self.algo.ignored.iter();
        algo.chain(self.proto.ignored.iter())
            .map(String::as_str)
            .collect()
    }

    /// Prints [`Config::ignored_names`] to stderr, each once per process,
    /// unless the debug level is `NONE`: a value written for NCCL is
    /// followed only in part, which the user should see without asking
    /// for logs (so not through `tracing`, whose subscriber may be absent).
    pub(crate) fn warn_ignored(&self) {
        static PRINTED: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
        if self.debug == Some(DebugLevel::None) {
            return;
        }
        let mut printed = PRINTED.lock().unwrap_or_else(|p| p.into_inner());
        for w in self.ignored_names() {
            if printed.insert(w.to_string()) {
                eprintln!("oxccl WARN {w}");
            }
        }
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
pub(crate) fn parse_bytes(var: &str, v: &str) -> Result<usize> {
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

pub(crate) fn parse_positive(var: &str, v: &str) -> Result<u32> {
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
pub(crate) fn parse_bool(var: &str, v: &str) -> Result<bool> {
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
