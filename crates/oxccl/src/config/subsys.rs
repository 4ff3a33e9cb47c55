//! `NCCL_DEBUG_SUBSYS`: which subsystems' INFO (and TRACE) lines show, in
//! NCCL's syntax: names separated by commas, case-insensitive, `ALL` for
//! every one, and a leading `^` for all but the names listed. NCCL's
//! default is `INIT,BOOTSTRAP,ENV`, so per-call lines (`COLL`) show only
//! when asked for. Warnings show whatever the subsystems.
//!
//! Each subsystem is a set of `tracing` targets (module paths, or the
//! explicit `oxccl::coll`-style targets some lines name); lines of
//! other targets show at warning level only.

use crate::error::{Error, Result};

/// A set of NCCL subsystems (NCCL's bit values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subsystems(pub u64);

/// NCCL's subsystem names and bits, and what of ours each covers.
const TABLE: &[(&str, u64, &[&str])] = &[
    ("INIT", 1, &["oxccl::init", "oxccl::check", "oxccl_cuda"]),
    ("COLL", 2, &["oxccl::coll"]),
    ("P2P", 4, &["oxccl_host::fabric", "oxccl::p2p"]),
    (
        "SHM",
        8,
        &["oxccl_host::fabric", "oxccl_host::shm", "oxccl_host::procs"],
    ),
    ("NET", 16, &["oxccl_host::net", "oxccl_net"]),
    ("GRAPH", 32, &["oxccl::graph", "oxccl_topo"]),
    ("TUNING", 64, &["oxccl::select", "oxccl::tuning"]),
    (
        "ENV",
        128,
        &["oxccl::settings", "oxccl::param", "oxccl::config"],
    ),
    ("ALLOC", 256, &["oxccl::buffer", "oxccl::sink"]),
    ("CALL", 512, &["oxccl::call"]),
    ("PROXY", 1024, &["oxccl_host::net::proxy"]),
    ("NVLS", 2048, &[]),
    ("BOOTSTRAP", 4096, &["oxccl_bootstrap"]),
    (
        "REG",
        8192,
        &["oxccl::register", "oxccl::registry", "oxccl::window"],
    ),
    ("PROFILE", 16384, &["oxccl::profile", "oxccl::observe"]),
    ("RAS", 32768, &[]),
    ("DESTROY", 65536, &[]),
    ("ALLOC_HOST", 131072, &[]),
];

/// Every crate of ours: lines of targets no enabled subsystem covers show
/// at warning level.
const CRATES: &[&str] = &[
    "oxccl",
    "oxccl_host",
    "oxccl_cuda",
    "oxccl_topo",
    "oxccl_bootstrap",
    "oxccl_net",
];

impl Subsystems {
    pub const ALL: Subsystems = Subsystems(u64::MAX);

    /// NCCL's default: INIT, BOOTSTRAP and ENV.
    pub const fn nccl_default() -> Subsystems {
        Subsystems(1 | 4096 | 128)
    }

    /// Parses `value` of the variable `var` (NCCL's syntax); an unknown
    /// name is an error naming it.
    pub fn parse(var: &str, value: &str) -> Result<Subsystems> {
        let v = value.trim();
        let (invert, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut mask = 0u64;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let upper = name.to_ascii_uppercase();
            if upper == "ALL" {
                mask = u64::MAX;
                continue;
            }
            let bit = TABLE
                .iter()
                .find(|(n, _, _)| *n == upper)
                .map(|(_, b, _)| *b)
                .ok_or_else(|| Error::Config {
                    var: var.into(),
                    value: value.into(),
                    reason: format!(
                        "unknown subsystem {name:?}; expected ALL or some of {}, optionally after ^",
                        TABLE.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
                    ),
                })?;
            mask |= bit;
        }
        Ok(Subsystems(if invert { !mask } else { mask }))
    }

    /// Whether subsystem `name` (NCCL's name) is in the set.
    pub fn has(self, name: &str) -> bool {
        TABLE.iter().any(|(n, b, _)| *n == name && self.0 & b != 0)
    }

    /// The `tracing` filter directives for `level` (`info`, `trace`):
    /// every crate at `warn`, the targets of each subsystem in the set at
    /// `level`.
    pub fn directives(self, level: &str) -> String {
        let mut d: Vec<String> = CRATES.iter().map(|c| format!("{c}=warn")).collect();
        let mut targets: Vec<&str> = TABLE
            .iter()
            .filter(|(_, b, _)| self.0 & b != 0)
            .flat_map(|(_, _, t)| t.iter().copied())
            .collect();
        targets.sort_unstable();
        targets.dedup();
        d.extend(targets.into_iter().map(|t| format!("{t}={level}")));
        d.join(",")
    }
}

impl Default for Subsystems {
    fn default() -> Self {
        Subsystems::nccl_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &str) -> Subsystems {
        Subsystems::parse("NCCL_DEBUG_SUBSYS", v).unwrap()
    }

    #[test]
    fn names_lists_all_and_negation_read_as_nccl() {
        assert_eq!(p("INIT"), Subsystems(1));
        assert_eq!(p("init, coll"), Subsystems(3));
        assert_eq!(p("ALL"), Subsystems::ALL);
        assert_eq!(p("^COLL"), Subsystems(!2));
        assert_eq!(p("^INIT,NET"), Subsystems(!(1 | 16)));
        assert!(p("^COLL").has("NET") && !p("^COLL").has("COLL"));
        assert_eq!(Subsystems::default(), p("INIT,BOOTSTRAP,ENV"));
        assert!(!Subsystems::default().has("COLL"));
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_it() {
        let e = Subsystems::parse("NCCL_DEBUG_SUBSYS", "INIT,COLLS").unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("NCCL_DEBUG_SUBSYS") && m.contains("COLLS"),
            "{m}"
        );
    }

    #[test]
    fn directives_raise_only_the_chosen_subsystems() {
        let d = p("COLL").directives("info");
        assert!(
            d.contains("oxccl=warn") && d.contains("oxccl_host=warn"),
            "{d}"
        );
        assert!(d.contains("oxccl::coll=info"), "{d}");
        assert!(
            !d.contains("oxccl::init=info") && !d.contains("oxccl_host::net=info"),
            "{d}"
        );
        let all = Subsystems::ALL.directives("trace");
        assert!(all.contains("oxccl_host::net=trace") && all.contains("oxccl::init=trace"));
    }
}
