//! The topology selector inside the communicator: overrides win, the
//! choice depends on the size, and the NCCL_DEBUG=INFO line carries the
//! predicted time. No timing is asserted.

use oxccl::config::{parse_algo_filter, parse_proto_filter};
use oxccl::{Algo, BackendKind, CollKind, Config, DataType, Error, Proto, RedOp};

fn host_config() -> Config {
    Config {
        backend: BackendKind::Host,
        ..Config::default()
    }
}

/// Runs an in-place f32 AllReduce of `count` elements on every rank, on
/// buffers from `alloc` (registered) or plain slices, and returns rank 0's
/// choice.
fn run_all_reduce(comms: &[oxccl::Communicator], count: usize, alloc: bool) -> oxccl::Choice {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let n = comms.len() as f32;
                if alloc {
                    let b = c.alloc::<f32>(count).unwrap();
                    b.copy_from_slice(&vec![1.0; count]).unwrap();
                    c.all_reduce(&b, &b, RedOp::Sum).unwrap();
                    assert!(b.to_vec().unwrap().iter().all(|&x| x == n));
                } else {
                    let mut v = vec![1.0f32; count];
                    c.all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
                    assert!(v.iter().all(|&x| x == n));
                }
            });
        }
    });
    comms[0].last_choice().expect("a collective ran")
}

#[test]
fn small_and_large_all_reduce_choose_differently_on_host() {
    let comms = oxccl::init_all_with(4, host_config()).unwrap();
    let small = comms[0]
        .choice_for(CollKind::AllReduce, 4, DataType::F32)
        .unwrap();
    let large = comms[0]
        .choice_for(CollKind::AllReduce, 64 << 20, DataType::F32)
        .unwrap();
    assert_ne!(small.algo, large.algo, "small {small}, large {large}");
    assert!(!small.forced && !large.forced);
    assert!(small.predicted_us.is_some() && large.predicted_us.is_some());
    // Every rank decides alike, and a real call uses the selector's pick.
    for c in &comms {
        let mine = c.choice_for(CollKind::AllReduce, 4, DataType::F32).unwrap();
        assert_eq!(mine, small);
    }
    assert_eq!(run_all_reduce(&comms, 4, true), small);
    // Plain slices are not registered: the FIFO model chooses, still
    // among what is allowed.
    assert!(!run_all_reduce(&comms, 4, false).forced);
}

#[test]
fn algorithm_override_wins_over_the_selector() {
    for (filter, want) in [
        ("ring", Algo::Ring),
        ("allreduce:tree", Algo::DoubleBinaryTree),
        ("chain", Algo::Chain),
    ] {
        let config = Config {
            algo: parse_algo_filter("NCCL_ALGO", filter).unwrap(),
            ..host_config()
        };
        let comms = oxccl::init_all_with(3, config).unwrap();
        for count in [4usize, 1 << 24] {
            let c = comms[0]
                .choice_for(CollKind::AllReduce, count, DataType::F32)
                .unwrap();
            assert_eq!(c.algo, want, "NCCL_ALGO={filter}, {count} elements");
            assert!(c.forced);
        }
        let ran = run_all_reduce(&comms, 1000, false);
        assert_eq!(ran.algo, want);
        assert!(ran.forced);
    }
}

#[test]
fn channel_override_wins_and_is_marked() {
    let config = Config {
        channels: Some(3),
        ..host_config()
    };
    let comms = oxccl::init_all_with(2, config).unwrap();
    let ran = run_all_reduce(&comms, 5000, true);
    assert_eq!(ran.channels, 3);
    assert!(ran.forced);
}

#[test]
fn protocol_the_backend_lacks_is_a_config_error() {
    let config = Config {
        proto: parse_proto_filter("NCCL_PROTO", "LL").unwrap(),
        ..host_config()
    };
    match oxccl::init_all_with(2, config) {
        Err(Error::Config { reason, .. }) => {
            assert!(reason.contains("simple"), "{reason}")
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    // Allowing Simple among others keeps it to what the backend runs.
    let config = Config {
        proto: parse_proto_filter("NCCL_PROTO", "LL,Simple").unwrap(),
        ..host_config()
    };
    let comms = oxccl::init_all_with(2, config).unwrap();
    let c = comms[0]
        .choice_for(CollKind::AllReduce, 4, DataType::F32)
        .unwrap();
    assert_eq!(c.proto, Proto::Simple);
    assert!(c.forced);
}

/// A device runs at most so many channels (on the H200, 16 with 8 ranks
/// resident), and the double binary tree's plan has two per channel. A
/// forced tree, with or without a configured channel count, must be
/// clamped to fit, not refused at launch (the H200 sweep died on it with
/// "32 channels; at most 16 fit"). The null backend refuses an oversized
/// plan as the device does, so without the clamp this test fails.
#[test]
fn a_forced_tree_is_clamped_to_the_channels_the_device_runs() {
    use std::sync::Arc;
    let topo = oxccl_topo::Topology::preset("single-gpu", 1).unwrap();
    for channels in [None, Some(16), Some(32)] {
        for (filter, want) in [("tree", Algo::DoubleBinaryTree), ("ring", Algo::Ring)] {
            let config = Config {
                algo: parse_algo_filter("NCCL_ALGO", filter).unwrap(),
                channels,
                topology: Some(topo.clone()),
                ..Config::default()
            };
            let backend = Arc::new(oxccl::backend::null::NullBackend::new(16, 1 << 17));
            let comms = oxccl::init_all_on(8, backend.clone(), config).unwrap();
            for count in [1024usize, 64 << 20] {
                std::thread::scope(|s| {
                    for c in &comms {
                        s.spawn(move || {
                            let b = c.alloc::<f32>(count).unwrap();
                            c.all_reduce(&b, &b, RedOp::Sum).unwrap_or_else(|e| {
                                panic!("{filter} channels {channels:?} count {count}: {e}")
                            });
                        });
                    }
                });
                let c = comms[0].last_choice().unwrap();
                assert_eq!(c.algo, want, "{c}");
                assert!(want.plan_channels(c.channels) <= 16, "{c}");
                // What was asked for is kept where it fits.
                if want == Algo::Ring && channels.is_some() {
                    assert_eq!(c.channels, 16, "{c}");
                }
                if want == Algo::DoubleBinaryTree && channels.is_some() {
                    assert_eq!(c.channels, 8, "{c}");
                }
            }
            assert!(backend.prepared() > 0);
        }
    }
}

/// A backend that runs one channel cannot run the double binary tree at
/// all: the call falls back to another allowed algorithm or says which
/// were refused, never an internal error.
#[test]
fn a_tree_that_cannot_fit_is_refused_with_a_reason() {
    use std::sync::Arc;
    let topo = oxccl_topo::Topology::preset("single-gpu", 1).unwrap();
    for (filter, ok) in [("tree", false), ("tree,ring", true)] {
        let config = Config {
            algo: parse_algo_filter("NCCL_ALGO", filter).unwrap(),
            topology: Some(topo.clone()),
            ..Config::default()
        };
        let backend = Arc::new(oxccl::backend::null::NullBackend::new(1, 1 << 17));
        let comms = oxccl::init_all_on(2, backend, config).unwrap();
        let got: Vec<oxccl::Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let b = c.alloc::<f32>(4096).unwrap();
                        c.all_reduce(&b, &b, RedOp::Sum)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in got {
            match (ok, r) {
                (true, Ok(())) => {
                    assert_eq!(comms[0].last_choice().unwrap().algo, Algo::Ring);
                }
                (false, Err(e @ Error::NoAlgorithm { .. })) => {
                    assert!(e.to_string().contains("at most 1 channels"), "{e}");
                }
                (_, r) => panic!("NCCL_ALGO={filter}: {r:?}"),
            }
        }
    }
}

/// What `xtask topo --explain` tables is what a communicator picks: the
/// facade's choice on buffers from `alloc` (and with the default
/// configuration) equals `Policy::gpu`'s best for the same placement and
/// channel cap, for ranks sharing one GPU (the calibrated policy) and
/// ranks on eight GPUs, every size from 8 B to 256 MiB.
#[test]
fn the_pick_is_the_policy_that_topo_explain_tables() {
    use oxccl_topo::Policy;
    use std::sync::Arc;
    for (preset, gpus) in [
        ("single-gpu", vec![0usize; 8]),
        ("hgx-h100", (0..8).collect()),
    ] {
        let topo = oxccl_topo::Topology::preset(preset, 1).unwrap();
        let config = Config {
            topology: Some(topo.clone()),
            ..Config::default()
        };
        let cap = 16;
        let backend = Arc::new(oxccl::backend::null::NullBackend::new(cap, 1 << 17));
        let comms = oxccl::init_all_on(8, backend, config).unwrap();
        let policy = Policy::gpu(&topo, &gpus, cap);
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
            CollKind::AllToAll,
        ] {
            for count in (1..=25).map(|i| 1usize << i) {
                let got = comms[0].choice_for(kind, count, DataType::F32).unwrap();
                let bytes = oxccl::core::Collective::new(kind, count, 0).bytes(8, 4);
                let want = policy.best(kind, bytes, true, &Algo::ALL, &[Proto::Simple, Proto::LL]);
                assert_eq!(
                    (got.algo, got.proto, got.channels, got.transport),
                    (want.algo, want.proto, want.channels, want.transport),
                    "{preset} {kind} {bytes} B: communicator {got}, policy {want}"
                );
            }
        }
    }
}
