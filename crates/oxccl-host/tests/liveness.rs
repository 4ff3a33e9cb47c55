//! Progress and failure: oversubscribed ranks, deadlines, abort, and
//! connections that persist across calls.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check_request, run_plan, small_config, Checked, RankResult};
use oxccl_core::{
    gen, generate, testkit, Algo, Awaited, CollKind, Collective, DataType, FaultCause, PlanRequest,
    RedOp,
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
    let algos: Vec<Algo> = Algo::ALL
        .into_iter()
        .filter(|&a| gen::supports(a, CollKind::AllReduce))
        .collect();
    let counts = [1usize, 1000, 65_537, 1 << 20];
    let mut ran = 0;
    for &algo in &algos {
        for count in counts {
            for rep in 0..2 {
                let req = allreduce(8, count, algo, 2, chunk);
                // Every case runs and is checked element by element.
                assert_eq!(
                    check_request::<f32>(&fab, &req, RedOp::Sum, rep),
                    Ok(Checked::Ran),
                    "{algo} count {count} rep {rep}"
                );
                ran += 1;
            }
        }
    }
    assert!(algos.len() >= 6, "AllReduce algorithms: {algos:?}");
    assert_eq!(ran, algos.len() * counts.len() * 2);
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
        Err(HostError::Deadline(f)) => {
            assert_eq!(
                (f.cause, f.rank, f.peer, f.channel, f.step, f.awaited),
                (FaultCause::Deadline, 1, 0, 0, 1, Awaited::Message)
            );
            assert!(f.waited >= Duration::from_millis(300));
            assert_eq!(f.absent, &[0]);
        }
        other => panic!("expected a deadline naming peer 0, got {other:?}"),
    }
}

/// Waits until `cond` holds, polling; panics naming `what` after a bound
/// far beyond any scheduling delay (a hang must fail, not block CI).
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gave up waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Starts `ring_with_absent(n, absent)` on `fab` (whose deadline is long),
/// waits until every present rank has started the call, then calls `end`
/// (which ends the wait: a zero deadline, or abort) and returns the
/// results. Waiting for arrival instead of for time, the ranks that never
/// joined are exactly `absent`, however loaded the machine.
fn after_arrival(
    fab: &Arc<HostFabric>,
    n: u32,
    absent: &[u32],
    end: impl FnOnce(&HostFabric),
) -> Vec<Option<RankResult<f32>>> {
    let present: Vec<u32> = (0..n).filter(|r| !absent.contains(r)).collect();
    let before: Vec<u64> = present
        .iter()
        .map(|&r| fab.calls_started(r).unwrap())
        .collect();
    let run = {
        let (fab, absent) = (fab.clone(), absent.to_vec());
        std::thread::spawn(move || ring_with_absent(&fab, n, &absent))
    };
    wait_until("every present rank to start its call", || {
        present
            .iter()
            .zip(&before)
            .all(|(&r, &b)| fab.calls_started(r) == Some(b + 1))
    });
    end(fab);
    run.join().expect("ranks")
}

/// With more ranks, the rank whose deadline fires first may wait on a
/// neighbour, not on the missing rank; the error still names exactly the
/// ranks that never joined, and every other rank stops promptly with that
/// reason.
#[test]
fn missing_rank_fails_everyone_and_the_fabric_stays_failed() {
    for (n, absent) in [(4, vec![0]), (4, vec![0, 2]), (8, vec![3, 4, 7])] {
        let fab = HostFabric::new(n, small_config(64));
        let res = after_arrival(&fab, n, &absent, |f| f.set_deadline(Duration::ZERO));
        let mut deadlines = 0;
        for (r, res) in res.iter().enumerate() {
            let Some(res) = res else {
                assert!(absent.contains(&(r as u32)), "rank {r} did not run");
                continue;
            };
            match res {
                Err(HostError::Deadline(f)) => {
                    assert_eq!(f.rank, r as u32);
                    assert_eq!(f.absent, absent, "rank {r}");
                    deadlines += 1;
                }
                Err(HostError::Failed(msg)) => {
                    assert!(
                        msg.contains(&format!(
                            "{} never joined",
                            oxccl_core::ranks_with(&absent, ("", "")).trim_end()
                        )),
                        "rank {r}: {msg}"
                    );
                    assert!(msg.contains("rebuild"), "{msg}");
                }
                other => panic!("rank {r}: expected a failure, got {other:?}"),
            }
        }
        assert!(deadlines >= 1);
        let Some(HostError::Failed(msg)) = fab.failure() else {
            panic!("fabric must be failed");
        };
        assert!(
            msg.contains(&format!(
                "{} never joined",
                oxccl_core::ranks_with(&absent, ("", "")).trim_end()
            )),
            "{msg}"
        );
        assert!(msg.contains("rebuild"), "{msg}");
        // Later calls are refused at once, even with every rank present.
        for res in ring_with_absent(&fab, n, &[]) {
            match res.unwrap() {
                Err(HostError::Failed(m)) => assert!(m.contains("rebuild"), "{m}"),
                other => panic!("expected the sticky failure, got {other:?}"),
            }
        }
    }
}

#[test]
fn abort_stops_waiting_ranks() {
    let fab = HostFabric::new(4, small_config(64));
    // Abort once ranks 1-3 are certainly inside their calls.
    let res = after_arrival(&fab, 4, &[0], |f| f.abort("rank 0 gave up"));
    assert!(res[0].is_none());
    for (r, res) in res.into_iter().enumerate().skip(1) {
        match res.unwrap() {
            Err(HostError::Aborted { rank, why }) => {
                assert_eq!(rank, r as u32);
                assert_eq!(why, "rank 0 gave up");
            }
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
