//! Progress and failure: oversubscribed ranks, deadlines, abort, and
//! connections that persist across calls.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{check_request, run_plan, small_config, Checked, RankResult};
use oxccl_core::{
    gen, generate, testkit, Algo, CollKind, Collective, DataType, PlanRequest, RedOp,
};
use oxccl_host::{HostConfig, HostError, HostFabric};

fn allreduce(n: u32, count: usize, algo: Algo, channels: u32, chunk: usize) -> PlanRequest {
    let mut req = PlanRequest::new(Collective::new(CollKind::AllReduce, count, 0), n, algo);
    req.channels = channels;
    req.chunk = chunk;
    req
}

/// Eight ranks on a two-core machine: every AllReduce algorithm, several
/// sizes, repeated, on one fabric with the default waiting policy. A
/// livelock or lost wake-up shows up as a deadline error (or a hang).
#[test]
fn eight_ranks_oversubscribed_allreduce_sweep() {
    let cfg = HostConfig {
        deadline: Duration::from_secs(60),
        slot_bytes: 64 << 10,
        ..HostConfig::default()
    };
    let fab = HostFabric::new(8, cfg);
    let chunk = (64 << 10) / 4;
    let mut ran = 0;
    for algo in Algo::ALL
        .into_iter()
        .filter(|&a| gen::supports(a, CollKind::AllReduce))
    {
        for count in [1usize, 1000, 65_537, 1 << 20] {
            for rep in 0..2 {
                let req = allreduce(8, count, algo, 2, chunk);
                match check_request::<f32>(&fab, &req, RedOp::Sum, rep) {
                    Ok(Checked::Ran) => ran += 1,
                    Ok(Checked::Unsupported) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
    assert!(ran >= 8, "ran {ran} AllReduces");
    assert!(fab.failure().is_none());
}

/// Runs an `n`-rank ring AllReduce with `absent` ranks never calling.
fn ring_with_absent(fab: &Arc<HostFabric>, n: u32, absent: &[u32]) -> Vec<Option<RankResult<f32>>> {
    let req = allreduce(n, 1000, Algo::Ring, 1, 16);
    let plan = generate(&req).unwrap();
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| testkit::input(&req.coll, n, r, RedOp::Sum, 1))
        .collect();
    let op = RedOp::Sum.lower(DataType::F32, n);
    run_plan(fab, &plan, &inputs, false, &op, absent)
}

fn short_deadline() -> HostConfig {
    HostConfig {
        deadline: Duration::from_millis(300),
        ..small_config(64)
    }
}

#[test]
fn missing_peer_gives_deadline_naming_it() {
    let fab = HostFabric::new(2, short_deadline());
    let res = ring_with_absent(&fab, 2, &[0]);
    assert!(res[0].is_none());
    // Rank 1 sends its first block, then waits for rank 0's.
    match res[1].as_ref().unwrap() {
        Err(HostError::Deadline {
            rank: 1,
            peer: 0,
            channel: 0,
            step: 1,
            waiting_for: "message",
            elapsed,
            absent,
        }) => {
            assert!(*elapsed >= Duration::from_millis(300));
            assert_eq!(absent, &[0]);
        }
        other => panic!("expected a deadline naming peer 0, got {other:?}"),
    }
}

/// With more ranks, the rank whose deadline fires first may wait on a
/// neighbour, not on the missing rank; the error still names the rank that
/// never joined, and every other rank stops promptly with that reason.
#[test]
fn missing_rank_fails_everyone_and_the_fabric_stays_failed() {
    let fab = HostFabric::new(4, short_deadline());
    let res = ring_with_absent(&fab, 4, &[0]);
    let mut deadlines = 0;
    for (r, res) in res.iter().enumerate().skip(1) {
        match res.as_ref().unwrap() {
            Err(HostError::Deadline { rank, absent, .. }) => {
                assert_eq!(*rank, r as u32);
                assert_eq!(absent, &[0]);
                deadlines += 1;
            }
            Err(HostError::Failed(msg)) => {
                assert!(msg.contains("[0] never joined"), "{msg}");
                assert!(msg.contains("rebuild"), "{msg}");
            }
            other => panic!("rank {r}: expected a failure, got {other:?}"),
        }
    }
    assert!(deadlines >= 1);
    let Some(HostError::Failed(msg)) = fab.failure() else {
        panic!("fabric must be failed");
    };
    assert!(msg.contains("rebuild"), "{msg}");
    // Later calls are refused at once, even with every rank present.
    for res in ring_with_absent(&fab, 4, &[]) {
        match res.unwrap() {
            Err(HostError::Failed(m)) => assert!(m.contains("rebuild"), "{m}"),
            other => panic!("expected the sticky failure, got {other:?}"),
        }
    }
}

#[test]
fn abort_stops_waiting_ranks() {
    let fab = HostFabric::new(4, small_config(64));
    let waiting = {
        let fab = fab.clone();
        std::thread::spawn(move || ring_with_absent(&fab, 4, &[0]))
    };
    // Abort once rank 1 is certainly inside its call (it has sent a message).
    while fab.link_counters(0, 1, 2).is_none_or(|c| c[0] == 0) {
        std::thread::sleep(Duration::from_millis(1));
    }
    fab.abort();
    let res = waiting.join().unwrap();
    for (r, res) in res.into_iter().enumerate().skip(1) {
        match res.unwrap() {
            Err(HostError::Aborted { rank }) => assert_eq!(rank, r as u32),
            other => panic!("rank {r}: expected Aborted, got {other:?}"),
        }
    }
    assert!(fab.failure().is_some());
    let again = ring_with_absent(&fab, 4, &[]);
    assert!(again
        .into_iter()
        .all(|r| matches!(r, Some(Err(HostError::Aborted { .. })))));
}

/// Connections persist: counters keep growing across calls, by the same
/// amount each call, and results stay right.
#[test]
fn repeated_calls_reuse_connections() {
    let fab = HostFabric::new(3, small_config(64));
    let req = allreduce(3, 1000, Algo::Ring, 2, 16);
    let mut per_call = None;
    for k in 1..=4u64 {
        assert_eq!(
            check_request::<f32>(&fab, &req, RedOp::Sum, k),
            Ok(Checked::Ran)
        );
        let [tail, head, posted, consumed] = fab.link_counters(0, 0, 1).unwrap();
        assert_eq!(tail, head, "every message drained");
        assert_eq!((posted, consumed), (0, 0));
        let m = *per_call.get_or_insert(tail);
        assert!(m > 2, "the FIFO (2 slots) wrapped");
        assert_eq!(tail, k * m, "call {k}");
    }
}
