//! NCCL_ALGO / NCCL_PROTO syntax and the OXCCL_ twins, through pure
//! functions (the process environment is never touched).

use std::time::Duration;

use oxccl::config::{parse_algo_filter, parse_proto_filter, DebugLevel, NO_DEADLINE};
use oxccl::{Algo, BackendKind, CollKind, Config, Error, Proto, RedOp};
use oxccl_bootstrap::env::from_pairs as vars;

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
        "nvls,rign",
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
    let f = parse_proto_filter("NCCL_PROTO", "^LL,simple").unwrap();
    assert_eq!(
        f.allowed(CollKind::AllReduce, &Proto::ALL),
        vec![Proto::LL128]
    );
    let f = parse_proto_filter("NCCL_PROTO", "allreduce:LL").unwrap();
    assert_eq!(f.allowed(CollKind::AllReduce, &Proto::ALL), vec![Proto::LL]);
    assert!(f.ignored.is_empty());
}

#[test]
fn ll128_is_ignored_as_nccl_only() {
    // No backend runs LL128: naming it, allowed or excluded, restricts
    // nothing and leaves one warning per mention.
    for (v, mentions) in [
        ("LL128", 1),
        ("^LL128", 1),
        ("allreduce:ll128", 1),
        ("LL128;broadcast:^ll128", 2),
    ] {
        let f = parse_proto_filter("NCCL_PROTO", v).unwrap();
        assert!(f.is_empty(), "{v}: {f:?}");
        assert_eq!(f.ignored.len(), mentions, "{v}");
        assert!(f.ignored[0].contains("NCCL protocol"), "{:?}", f.ignored);
    }
    let f = parse_proto_filter("NCCL_PROTO", "LL128,Simple").unwrap();
    assert_eq!(
        f.allowed(CollKind::AllReduce, &Proto::ALL),
        vec![Proto::Simple]
    );
    let c =
        Config::from_vars(vars(&[("NCCL_PROTO", "LL128"), ("NCCL_ALGO", "^nvls,pat")])).unwrap();
    let names = c.ignored_names();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[0].starts_with("NCCL_ALGO=\"^nvls,pat\": \"nvls\""),
        "{names:?}"
    );
    assert!(
        names[2].starts_with("NCCL_PROTO=\"LL128\": \"LL128\""),
        "{names:?}"
    );
    // And a clique made under it runs.
    let c = Config::from_vars(vars(&[("NCCL_PROTO", "LL128"), ("OXCCL_BACKEND", "host")])).unwrap();
    let comms = oxccl::init_all_with(1, c).unwrap();
    let mut v = vec![1.0f32; 4];
    comms[0].all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
}

#[test]
fn a_filter_that_leaves_nothing_names_its_variable() {
    // Once LL128 is set aside, `^simple` leaves the host backend nothing.
    let c = Config::from_vars(vars(&[
        ("NCCL_PROTO", "^simple,ll128"),
        ("OXCCL_BACKEND", "host"),
    ]))
    .unwrap();
    match oxccl::init_all_with(1, c) {
        Err(Error::Config { var, .. }) => assert_eq!(var, "NCCL_PROTO"),
        other => panic!("{:?}", other.map(|_| ())),
    }
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

#[test]
fn nccl_algorithms_oxccl_lacks_are_ignored() {
    // `^nvls`, common on clusters, excludes nothing oxccl has.
    for v in [
        "^nvls",
        "^nvls,collnet",
        "nvls",
        "^PAT",
        "allreduce:nvlstree",
    ] {
        let f = parse_algo_filter("NCCL_ALGO", v).unwrap();
        assert!(f.is_empty(), "{v}: {f:?}");
    }
    let f = parse_algo_filter("NCCL_ALGO", "nvls,ring;allreduce:^collnetdirect,tree").unwrap();
    assert_eq!(f.allowed(CollKind::AllGather, &Algo::ALL), vec![Algo::Ring]);
    assert!(!f.allows(CollKind::AllReduce, Algo::DoubleBinaryTree));
    assert!(f.allows(CollKind::AllReduce, Algo::Ring));
    // And a clique made under `^nvls` runs.
    let c = Config::from_vars(vars(&[("NCCL_ALGO", "^nvls"), ("OXCCL_BACKEND", "host")])).unwrap();
    let comms = oxccl::init_all_with(1, c).unwrap();
    let mut v = vec![1.0f32; 4];
    comms[0].all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
}

#[test]
fn every_nccl_debug_level_is_accepted() {
    for (v, want) in [
        ("NONE", DebugLevel::None),
        ("VERSION", DebugLevel::Version),
        ("WARN", DebugLevel::Warn),
        ("abort", DebugLevel::Abort),
        ("INFO", DebugLevel::Info),
        ("TRACE", DebugLevel::Trace),
    ] {
        let c = Config::from_vars(vars(&[("NCCL_DEBUG", v)])).unwrap();
        assert_eq!(c.debug, Some(want), "{v}");
    }
    assert!(DebugLevel::Trace > DebugLevel::Info && DebugLevel::Abort > DebugLevel::Warn);
}

/// A deadline that is neither milliseconds nor a way to switch it off
/// is refused with a message listing everything that is accepted.
#[test]
fn a_bad_deadline_says_what_is_accepted() {
    for v in ["abc", "-5", "1.5", "4294967296"] {
        match Config::from_vars(vars(&[("OXCCL_DEADLINE_MS", v)])) {
            Err(e @ Error::Config { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("OXCCL_DEADLINE_MS")
                        && msg.contains("milliseconds")
                        && msg.contains("0, off or none for no deadline"),
                    "{v}: {msg}"
                );
            }
            other => panic!("OXCCL_DEADLINE_MS={v}: {other:?}"),
        }
    }
    for v in ["0", "off", "OFF", "none", " None "] {
        let c = Config::from_vars(vars(&[("OXCCL_DEADLINE_MS", v)])).unwrap();
        assert_eq!(c.deadline, NO_DEADLINE, "{v:?}");
    }
}

#[test]
fn the_deadline_can_be_switched_off() {
    for v in ["0", "off", "OFF"] {
        let c = Config::from_vars(vars(&[("OXCCL_DEADLINE_MS", v)])).unwrap();
        assert_eq!(c.deadline, NO_DEADLINE, "{v}");
    }
    let c = Config::builder()
        .backend(BackendKind::Host)
        .no_deadline()
        .build()
        .unwrap();
    let comms = oxccl::init_all_with(2, c).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut v = vec![c.rank() as f32; 1000];
                c.all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
                assert_eq!(v, vec![1.0; 1000]);
            });
        }
    });
}

#[test]
fn the_builder_sets_typed_values_and_refuses_what_cannot_work() {
    let c = Config::builder()
        .backend(BackendKind::Host)
        .algorithms(&[Algo::Ring, Algo::Chain])
        .algorithms_for(CollKind::AllReduce, &[Algo::OneShot])
        .protocols(&[Proto::Simple])
        .channels(2)
        .deadline(Duration::from_secs(9))
        .chunk_bytes(64 << 10)
        .check_calls(false)
        .debug(DebugLevel::Warn)
        .build()
        .unwrap();
    assert_eq!(
        c.algo.allowed(CollKind::AllGather, &Algo::ALL),
        vec![Algo::Ring, Algo::Chain]
    );
    assert_eq!(
        c.algo.allowed(CollKind::AllReduce, &Algo::ALL),
        vec![Algo::OneShot]
    );
    assert_eq!(
        c.proto.allowed(CollKind::Reduce, &Proto::ALL),
        vec![Proto::Simple]
    );
    assert_eq!(
        (
            c.channels,
            c.deadline,
            c.chunk_bytes,
            c.check_calls,
            c.debug
        ),
        (
            Some(2),
            Duration::from_secs(9),
            Some(64 << 10),
            false,
            Some(DebugLevel::Warn)
        )
    );
    let ex = Config::builder()
        .excluding_algorithms(&[Algo::Ring])
        .build()
        .unwrap();
    assert!(!ex.algo.allows(CollKind::AllReduce, Algo::Ring));
    for bad in [
        Config::builder().channels(0),
        Config::builder().chunk_bytes(0),
        Config::builder().deadline(Duration::ZERO),
        Config::builder().algorithms(&[]),
        Config::builder().protocols_for(CollKind::AllReduce, &[]),
    ] {
        assert!(matches!(bad.build(), Err(Error::Config { .. })));
    }
    // A negative device ordinal, by either setter, names the device.
    for bad in [
        Config::builder().device(-1),
        Config::builder().cuda(oxccl::settings::CudaSettings {
            device: Some(i32::MIN),
            ..Default::default()
        }),
    ] {
        match bad.build() {
            Err(Error::Config { var, reason, .. }) => {
                assert_eq!(var, "device");
                assert!(reason.contains("0 or more"), "{reason}");
            }
            other => panic!("a negative device built: {other:?}"),
        }
    }
    assert_eq!(
        Config::builder().device(0).build().unwrap().cuda.device,
        Some(0)
    );
}

#[test]
fn the_builder_and_the_environment_fill_the_same_tree() {
    let from_env = Config::from_vars(vars(&[
        ("OXCCL_NET_CHANNELS", "2"),
        ("OXCCL_CACHE_DIR", "/tmp/kernels"),
        ("NCCL_HOSTID", "h1"),
        ("OXCCL_TOPO_FILE", "/t.xml"),
    ]))
    .unwrap();
    let built = Config::builder()
        .host(oxccl::settings::HostSettings {
            net_channels: Some(2),
            ..Default::default()
        })
        .cuda(oxccl::settings::CudaSettings {
            cache_dir: Some("/tmp/kernels".into()),
            ..Default::default()
        })
        .bootstrap(oxccl_bootstrap::BootstrapSettings {
            host_id: Some("h1".into()),
            ..Default::default()
        })
        .topology_file("/t.xml")
        .build()
        .unwrap();
    assert_eq!(built.host, from_env.host);
    assert_eq!(built.cuda, from_env.cuda);
    assert_eq!(built.bootstrap, from_env.bootstrap);
    assert_eq!(built.topology_file, from_env.topology_file);
}
