//! Settings lookups as values. oxccl's parsers of `NCCL_*`/`OXCCL_*`
//! variables (the facade's settings, the launcher variables, the network
//! transport's knobs) take `get: impl Fn(&str) -> Option<String>`, so they
//! stay pure functions of their input. Only the facade's `settings` module
//! reads the process environment; this crate never does. The crates above
//! share [`BadVar`] because they all depend on the bootstrap.

use std::collections::HashMap;

use thiserror::Error;

/// A bad environment variable: its name, its value and what was expected
/// (the `Config` variant of the bootstrap's and the network transport's
/// errors; the facade's `Error::Config` carries the same three).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{var}={value:?}: {reason}")]
pub struct BadVar {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

/// A lookup answering from `pairs` instead of the process environment
/// (tests, tools that take settings from flags); where a name repeats,
/// the last pair wins.
pub fn from_pairs(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_answer_and_the_last_repeat_wins() {
        let get = from_pairs(&[("A", "1"), ("B", "2"), ("A", "3")]);
        assert_eq!(get("A").as_deref(), Some("3"));
        assert_eq!(get("B").as_deref(), Some("2"));
        assert_eq!(get("C"), None);
    }
}
