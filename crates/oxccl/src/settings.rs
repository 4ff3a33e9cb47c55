//! Every environment variable oxccl reads, and the one place it reads them.
//!
//! [`SETTINGS`] lists each variable (name, NCCL twin, default, unit, who it
//! is for, what it does); the README's table is generated from it.
//! [`Environment::capture`] reads the process environment once, and
//! [`Config::from_vars`] turns a lookup into the typed tree: the facade's
//! [`Config`] with its branches for the host backend ([`HostSettings`]),
//! the CUDA backend ([`CudaSettings`]), the bootstrap
//! ([`oxccl_bootstrap::BootstrapSettings`]) and the topology file. The tree
//! is passed down at init: no other crate, and no other module of this one,
//! reads the environment (tidy checks). `OXCCL_*` names win over their
//! `NCCL_*` twins. A set `OXCCL_*` variable that is not in the table gets
//! one warning naming the nearest known name.
//!
//! [`Config::builder`] and the C ABI's `ncclConfig_t` fill the same tree.

use std::collections::BTreeMap;

use crate::config::Config;
use crate::error::Result;

mod nearest;
mod read;
mod table;

pub use crate::config::{CudaSettings, HostSettings, ProcsPath};
pub use nearest::nearest;
pub use oxccl_bootstrap::iface::{Family, IfaceSettings};
pub use oxccl_bootstrap::BootstrapSettings;
pub use oxccl_cuda::GateMode;
pub use oxccl_host::SocketSettings;
pub use table::{setting, Kind, Setting, SETTINGS};

/// A snapshot of the variables oxccl cares about: every name in
/// [`SETTINGS`] (and twins) that is set, and every `OXCCL_*` one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// Reads the process environment: the library's only read of it.
    /// Names or values that are not Unicode are skipped.
    pub fn capture() -> Environment {
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with("OXCCL_") || setting(k).is_some());
        Environment {
            vars: vars.collect(),
        }
    }

    /// A snapshot holding `pairs` (tests, tools that take settings from
    /// flags); where a name repeats, the last pair wins.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Environment {
        Environment {
            vars: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<String> {
        self.vars.get(name).cloned()
    }

    /// The set `OXCCL_*` names that no row of [`SETTINGS`] knows, each
    /// with the nearest known name.
    pub fn unknown(&self) -> Vec<(&str, &'static str)> {
        self.vars
            .keys()
            .filter(|k| k.starts_with("OXCCL_") && setting(k).is_none())
            .map(|k| (k.as_str(), nearest(k)))
            .collect()
    }

    /// One warning per unknown `OXCCL_*` name (after logging is set up,
    /// so the warning shows where `OXCCL_DEBUG` asked for warnings).
    pub fn warn_unknown(&self) {
        for (name, near) in self.unknown() {
            tracing::warn!(
                "oxccl: {name:?} is set, but oxccl reads no such variable; did you mean {near:?}?"
            );
        }
    }
}

impl Config {
    /// Defaults overridden by the process environment, read once
    /// ([`Environment::capture`]). Installs the logging `OXCCL_DEBUG` asks
    /// for, then warns about unknown `OXCCL_*` variables and prints the
    /// NCCL algorithm and protocol names the filters ignored.
    pub fn from_env() -> Result<Config> {
        Config::from_env_defaulting(false)
    }

    /// As [`Config::from_env`], with NCCL's defaults where they differ
    /// from this crate's: waits have no deadline unless `OXCCL_DEADLINE_MS`
    /// is set, since NCCL's users own the timeout (a framework's watchdog
    /// polls the async error and aborts). What the C ABI reads.
    pub fn from_env_as_nccl() -> Result<Config> {
        Config::from_env_defaulting(true)
    }

    fn from_env_defaulting(as_nccl: bool) -> Result<Config> {
        let env = Environment::capture();
        let c = if as_nccl {
            Config::from_vars_as_nccl(|k| env.get(k))?
        } else {
            Config::from_vars(|k| env.get(k))?
        };
        crate::debug::init(c.debug, c.debug_subsys);
        env.warn_unknown();
        c.warn_ignored();
        Ok(c)
    }

    /// Defaults overridden by the variables `get` returns (a pure function
    /// of its input, so it can be tested without touching the process
    /// environment): the whole tree, every branch. `OXCCL_*` variables win
    /// over their `NCCL_*` twins.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        read::config(&get)
    }

    /// As [`Config::from_vars`], with NCCL's defaults where they differ
    /// (see [`Config::from_env_as_nccl`]).
    pub fn from_vars_as_nccl(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = read::config(&get)?;
        if get("OXCCL_DEADLINE_MS").is_none() {
            c.deadline = crate::config::NO_DEADLINE;
        }
        Ok(c)
    }
}

/// The README's variable table (markdown), from [`SETTINGS`]: what
/// `cargo xtask settings` writes between the README's markers.
pub fn markdown_table() -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(
        "| Variable | NCCL twin | Default | Unit | For | What it does |\n|---|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        out += &format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            s.name,
            s.nccl.map_or("".into(), |n| format!("`{n}`")),
            cell(s.default),
            cell(s.unit),
            s.kind.word(),
            cell(s.doc)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_oxccl_names_are_found_with_their_nearest() {
        let env = Environment::from_pairs(&[
            ("OXCCL_DEADLINE_MS", "10"),
            ("OXCCL_DEADLINE", "10"),
            ("OXCCL_ALOG", "ring"),
            ("NCCL_WHATEVER", "1"),
        ]);
        assert_eq!(
            env.unknown(),
            vec![
                ("OXCCL_ALOG", "OXCCL_ALGO"),
                ("OXCCL_DEADLINE", "OXCCL_DEADLINE_MS")
            ]
        );
    }

    /// The Rust default keeps a deadline; NCCL's (the C ABI's) has none
    /// unless the variable asks; the warning periods are settings.
    #[test]
    fn waits_default_to_a_deadline_in_rust_and_none_as_nccl() {
        let none = |_: &str| None;
        let rust = Config::from_vars(none).unwrap();
        assert_eq!(rust.deadline, std::time::Duration::from_secs(300));
        let nccl = Config::from_vars_as_nccl(none).unwrap();
        assert_eq!(nccl.deadline, crate::config::NO_DEADLINE);
        assert_eq!(nccl.wait_warn, crate::WaitWarn::default());
        let env = Environment::from_pairs(&[
            ("OXCCL_DEADLINE_MS", "5000"),
            ("OXCCL_WAIT_WARN_MS", "200"),
            ("OXCCL_WAIT_WARN_EVERY_MS", "700"),
        ]);
        let nccl = Config::from_vars_as_nccl(|k| env.get(k)).unwrap();
        assert_eq!(nccl.deadline, std::time::Duration::from_secs(5));
        assert_eq!(nccl.wait_warn.first, std::time::Duration::from_millis(200));
        assert_eq!(nccl.wait_warn.every, std::time::Duration::from_millis(700));
        let env = Environment::from_pairs(&[("OXCCL_WAIT_WARN_EVERY_MS", "0")]);
        assert!(Config::from_vars(|k| env.get(k)).is_err());
    }

    #[test]
    fn the_table_lists_every_launcher_variable() {
        for v in crate::LaunchEnv::vars() {
            assert!(setting(v).is_some(), "{v} is read but not in SETTINGS");
        }
    }

    #[test]
    fn the_markdown_has_a_row_per_setting() {
        let t = markdown_table();
        assert_eq!(t.lines().count(), SETTINGS.len() + 2);
        assert!(t.contains("| `OXCCL_ALGO` | `NCCL_ALGO` |"), "{t}");
        assert!(t.contains("host \\| cuda \\| auto"), "{t}");
    }
}
