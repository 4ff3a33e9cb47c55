//! NCCL_ALGO / NCCL_PROTO syntax and the OXCCL_ twins, through pure
//! functions (the process environment is never touched).

use std::collections::HashMap;

use oxccl::config::{parse_algo_filter, parse_proto_filter, DebugLevel};
use oxccl::{Algo, CollKind, Config, Error, Proto};

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn comma_list_allows_only_those() {
    let f = parse_algo_filter("NCCL_ALGO", "Ring,Tree").unwrap();
    assert!(f.allows(CollKind::AllReduce, Algo::Ring));
    assert!(f.allows(CollKind::AllReduce, Algo::DoubleBinaryTree));
    assert!(!f.allows(CollKind::AllReduce, Algo::OneShot));
}

#[test]
fn caret_excludes() {
    let f = parse_algo_filter("NCCL_ALGO", "^ring").unwrap();
    assert!(!f.allows(CollKind::AllGather, Algo::Ring));
    assert!(f.allows(CollKind::AllGather, Algo::AllPairs));
}

#[test]
fn per_collective_forms() {
    let f = parse_algo_filter("NCCL_ALGO", "allreduce:tree;broadcast:^ring").unwrap();
    assert_eq!(
        f.allowed(CollKind::AllReduce, &Algo::ALL),
        vec![Algo::DoubleBinaryTree]
    );
    assert!(!f.allows(CollKind::Broadcast, Algo::Ring));
    assert!(f.allows(CollKind::Broadcast, Algo::Chain));
    // Collectives without a rule are unrestricted.
    assert!(f.allows(CollKind::AllGather, Algo::Ring));
    let g = parse_algo_filter("NCCL_ALGO", "ring;allreduce:tree,ring").unwrap();
    assert!(!g.allows(CollKind::AllGather, Algo::AllPairs));
    assert!(g.allows(CollKind::AllReduce, Algo::DoubleBinaryTree));
}

#[test]
fn unknown_names_are_errors_naming_the_variable() {
    for bad in [
        "rign",
        "nvls",
        "allreduce:bogus",
        "notacoll:ring",
        "^",
        "allreduce:",
    ] {
        match parse_algo_filter("NCCL_ALGO", bad) {
            Err(Error::Config { var, value, .. }) => {
                assert_eq!(var, "NCCL_ALGO");
                assert_eq!(value, bad);
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(parse_proto_filter("NCCL_PROTO", "LL,fast").is_err());
}

#[test]
fn protocols_parse() {
    let f = parse_proto_filter("NCCL_PROTO", "^LL128").unwrap();
    assert_eq!(
        f.allowed(CollKind::AllReduce, &Proto::ALL),
        vec![Proto::Simple, Proto::LL]
    );
}

#[test]
fn oxccl_twins_win_over_nccl() {
    let c = Config::from_vars(vars(&[
        ("NCCL_ALGO", "tree"),
        ("OXCCL_ALGO", "ring"),
        ("NCCL_PROTO", "ll"),
        ("NCCL_DEBUG", "WARN"),
        ("OXCCL_DEBUG", "info"),
        ("NCCL_MAX_NCHANNELS", "3"),
        ("OXCCL_DEADLINE_MS", "2500"),
        ("OXCCL_BACKEND", "host"),
        ("OXCCL_CHUNK_BYTES", "128K"),
    ]))
    .unwrap();
    assert_eq!(
        c.algo.allowed(CollKind::AllReduce, &Algo::ALL),
        vec![Algo::Ring]
    );
    assert_eq!(
        c.proto.allowed(CollKind::AllReduce, &Proto::ALL),
        vec![Proto::LL]
    );
    assert_eq!(c.debug, Some(DebugLevel::Info));
    assert_eq!(c.channels, Some(3));
    assert_eq!(c.deadline, std::time::Duration::from_millis(2500));
    assert_eq!(c.backend, oxccl::BackendKind::Host);
    assert_eq!(c.chunk_bytes, Some(128 << 10));
}

#[test]
fn bad_values_are_errors() {
    for (k, v) in [
        ("NCCL_ALGO", "Rnig"),
        ("NCCL_PROTO", "fast"),
        ("NCCL_DEBUG", "LOUD"),
        ("OXCCL_CHANNELS", "0"),
        ("OXCCL_DEADLINE_MS", "soon"),
        ("OXCCL_BACKEND", "tpu"),
        ("OXCCL_CHUNK_BYTES", "0"),
        ("OXCCL_CHUNK_BYTES", "12Q"),
        ("OXCCL_CHUNK_BYTES", "99999999999999999999G"),
    ] {
        match Config::from_vars(vars(&[(k, v)])) {
            Err(Error::Config { var, .. }) => assert_eq!(var, k),
            other => panic!("{k}={v}: {other:?}"),
        }
    }
}

#[test]
fn empty_environment_gives_defaults() {
    let c = Config::from_vars(|_| None).unwrap();
    assert!(c.algo.is_empty() && c.proto.is_empty());
    assert_eq!(c.channels, None);
    assert_eq!(c.chunk_bytes, None);
}
