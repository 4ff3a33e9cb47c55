//! Environment lookups as values. oxccl's readers of `NCCL_*`/`OXCCL_*`
//! variables (the facade's `Config`, the launcher variables, the network
//! transport's knobs) take `get: impl Fn(&str) -> Option<String>`, so they
//! stay pure functions of their input; these are the two lookups callers
//! pass. The crates above share this one because they all depend on the
//! bootstrap.

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

/// The process environment (unset or not Unicode: `None`).
pub fn process(name: &str) -> Option<String> {
    std::env::var(name).ok()
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
