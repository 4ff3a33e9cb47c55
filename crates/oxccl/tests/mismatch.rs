//! Calls that do not match across ranks are errors on every rank involved,
//! before any data moves, naming the ranks and what differed; the
//! communicator stays usable. One body per case, run on the host backend
//! and (when a device is present) on CUDA.

use std::time::Duration;

mod common;
use common::{assert_names, on_ranks, KIND_SIDES};

use oxccl::{BackendKind, Communicator, Config, Error, RedOp};

fn comms(backend: BackendKind, n: u32) -> Vec<Communicator> {
    oxccl::init_all_with(
        n,
        Config {
            backend,
            deadline: Duration::from_secs(20),
            ..Config::default()
        },
    )
    .unwrap()
}

/// The mismatch message of `r`, or a panic naming what came instead.
fn mismatch<T: std::fmt::Debug>(r: &oxccl::Result<T>) -> String {
    match r {
        Err(e @ Error::Mismatch { .. }) => {
            assert_eq!(e.nccl_result(), 5, "invalid usage");
            e.to_string()
        }
        other => panic!("expected a mismatch error, got {other:?}"),
    }
}

/// A correct AllReduce on every rank: the communicator is still usable
/// and no stray message from the failed call reaches it.
fn still_usable(comms: &[Communicator]) {
    let n = comms.len() as f32;
    let got = on_ranks(comms, |c| {
        let b = c.alloc::<f32>(64).unwrap();
        b.copy_from_slice(&[c.rank() as f32 + 1.0; 64]).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
        c.synchronize().unwrap();
        b.to_vec().unwrap()
    });
    for v in got {
        assert_eq!(v, vec![n * (n + 1.0) / 2.0; 64]);
    }
}

/// Rank 0 broadcasts while ranks 1-3 all-reduce (the first case).
fn broadcast_against_all_reduce(comms: &[Communicator]) {
    let out = on_ranks(comms, |c| {
        let b = c.alloc::<f32>(1024).unwrap();
        b.copy_from_slice(&[c.rank() as f32 + 1.0; 1024]).unwrap();
        let r = if c.rank() == 0 {
            c.broadcast_in_place(&b, 0)
        } else {
            c.all_reduce_in_place(&b, RedOp::Sum)
        };
        c.synchronize().unwrap();
        (r, b.to_vec().unwrap())
    });
    for (rank, (r, data)) in out.iter().enumerate() {
        assert_names(
            &mismatch(r),
            &[&format!("rank {rank}:"), KIND_SIDES[0], KIND_SIDES[1]],
        );
        assert_eq!(data, &vec![rank as f32 + 1.0; 1024], "nothing was written");
    }
    still_usable(comms);
}

/// Ranks 0-1 pass 1 Mi elements, ranks 2-3 512 Ki (the second case).
fn counts_differ(comms: &[Communicator]) {
    let out = on_ranks(comms, |c| {
        let len = if c.rank() < 2 { 1 << 20 } else { 1 << 19 };
        let b = c.alloc::<f32>(len).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum)
    });
    for r in &out {
        let m = mismatch(r);
        assert!(
            m.contains("ranks 0-1: allreduce(sum) of 1048576 x float"),
            "{m}"
        );
        assert!(
            m.contains("ranks 2-3: allreduce(sum) of 524288 x float"),
            "{m}"
        );
    }
    still_usable(comms);
}

/// One field differs on one rank: type, op, root; each named.
fn one_field_differs(comms: &[Communicator]) {
    let out = on_ranks(comms, |c| {
        if c.rank() == 2 {
            let b = c.alloc::<f64>(8).unwrap();
            c.all_reduce_in_place(&b, RedOp::Sum)
        } else {
            let b = c.alloc::<f32>(8).unwrap();
            c.all_reduce_in_place(&b, RedOp::Sum)
        }
    });
    for r in &out {
        let m = mismatch(r);
        assert!(m.contains("rank 2: allreduce(sum) of 8 x double"), "{m}");
        assert!(
            m.contains("ranks 0-1, 3: allreduce(sum) of 8 x float"),
            "{m}"
        );
    }
    let out = on_ranks(comms, |c| {
        let b = c.alloc::<i32>(8).unwrap();
        let op = if c.rank() == 3 {
            RedOp::Max
        } else {
            RedOp::Sum
        };
        c.all_reduce_in_place(&b, op)
    });
    for r in &out {
        assert!(mismatch(r).contains("rank 3: allreduce(max) of 8 x int32"));
    }
    let out = on_ranks(comms, |c| {
        let (s, d) = (c.alloc::<u8>(8).unwrap(), c.alloc::<u8>(8).unwrap());
        c.reduce(&s, &d, RedOp::Sum, if c.rank() == 1 { 1 } else { 0 })
    });
    for r in &out {
        let m = mismatch(r);
        assert!(
            m.contains("rank 1: reduce(sum, root 1) of 8 x uint8"),
            "{m}"
        );
        assert!(m.contains("ranks 0, 2-3: reduce(sum, root 0)"), "{m}");
    }
    still_usable(comms);
}

/// Rank 0 sends to rank 1, which never receives and calls AllReduce
/// instead (the third case): both fail, and the message never
/// reaches the next collective.
fn unmatched_send(comms: &[Communicator]) {
    let out = on_ranks(comms, |c| {
        let b = c.alloc::<f32>(16).unwrap();
        b.copy_from_slice(&[7.0; 16]).unwrap();
        if c.rank() == 0 {
            let sent = c.send(&b, 1);
            let after = c.all_reduce_in_place(&b, RedOp::Sum);
            (sent, after)
        } else {
            let first = c.all_reduce_in_place(&b, RedOp::Sum);
            let after = c.all_reduce_in_place(&b, RedOp::Sum);
            (first, after)
        }
    });
    let m = mismatch(&out[0].0);
    assert!(m.contains("rank 0 sends 16 x float to rank 1"), "{m}");
    assert!(m.contains("without the matching recv"), "{m}");
    for (first, _) in &out[1..] {
        let m = mismatch(first);
        assert!(
            m.contains("rank 0: no collective: it waits in a send of 16 x float to rank 1"),
            "{m}"
        );
    }
    for (_, after) in &out {
        assert!(after.is_ok(), "{after:?}");
    }
    still_usable(comms);
}

/// Send 16, receive 32: one error on each side, nothing moved, and the
/// pair's next Send/Recv matches as usual.
fn send_recv_counts_differ(comms: &[Communicator]) {
    let out = on_ranks(comms, |c| {
        let b = c.alloc::<i32>(32).unwrap();
        b.copy_from_slice(&[c.rank() as i32; 32]).unwrap();
        match c.rank() {
            0 => c.send(b.slice(..16), 1),
            1 => c.recv(&b, 0),
            _ => Ok(()),
        }
        .map(|()| {
            c.synchronize().unwrap();
            b.to_vec().unwrap()
        })
    });
    let (m0, m1) = (mismatch(&out[0]), mismatch(&out[1]));
    assert!(m0.contains("rank 0 sends 16 x int32 to rank 1"), "{m0}");
    assert!(m0.contains("but rank 1 receives 32 x int32"), "{m0}");
    assert!(
        m1.contains("rank 1 receives 32 x int32 from rank 0"),
        "{m1}"
    );
    assert!(m1.contains("but rank 0 sends 16 x int32"), "{m1}");
    let out = on_ranks(comms, |c| {
        let b = c.alloc::<i32>(32).unwrap();
        b.copy_from_slice(&[c.rank() as i32 + 10; 32]).unwrap();
        match c.rank() {
            0 => c.send(&b, 1).unwrap(),
            1 => c.recv(&b, 0).unwrap(),
            _ => {}
        }
        c.synchronize().unwrap();
        b.to_vec().unwrap()
    });
    assert_eq!(out[1], vec![10; 32], "rank 1 got rank 0's second message");
    still_usable(comms);
}

/// Groups compare as one call; a lone collective in a group matches the
/// same collective outside one.
fn groups(comms: &[Communicator]) {
    let out = on_ranks(comms, |c| {
        let b = c.alloc::<f32>(4).unwrap();
        b.copy_from_slice(&[1.0; 4]).unwrap();
        let r = if c.rank() == 0 {
            oxccl::group(|g| g.all_reduce(c, &b, &b, RedOp::Sum))
        } else {
            c.all_reduce_in_place(&b, RedOp::Sum)
        };
        c.synchronize().unwrap();
        r.map(|()| b.to_vec().unwrap())
    });
    for r in out {
        assert_eq!(r.unwrap(), vec![4.0; 4]);
    }
    let out = on_ranks(comms, |c| {
        let (a, b) = (c.alloc::<f32>(4).unwrap(), c.alloc::<f32>(4).unwrap());
        oxccl::group(|g| {
            g.all_reduce(c, &a, &a, RedOp::Sum)?;
            // Rank 3 swaps the ops of its second call.
            let op = if c.rank() == 3 {
                RedOp::Min
            } else {
                RedOp::Max
            };
            g.all_reduce(c, &b, &b, op)
        })
    });
    for r in &out {
        let m = mismatch(r);
        assert!(m.contains("rank 3: a group of 2 collective(s)"), "{m}");
    }
    still_usable(comms);
}

fn every_case(backend: BackendKind) {
    let comms = comms(backend, 4);
    broadcast_against_all_reduce(&comms);
    counts_differ(&comms);
    one_field_differs(&comms);
    unmatched_send(&comms);
    send_recv_counts_differ(&comms);
    groups(&comms);
}

/// Rank 0's group sends 16 to rank 1, which receives 32, and sends 32 to
/// rank 2, which receives 32: ranks 0 and 1 get the mismatch; rank 2,
/// whose pair matched and whose data never comes, gets an error naming
/// rank 0 and why (the communicator fails) instead of its deadline's
/// timeout.
fn a_failed_pair_fails_the_group_peers(backend: BackendKind) {
    let comms = comms(backend, 3);
    let out = on_ranks(&comms, |c| {
        let b = c.alloc::<i32>(32).unwrap();
        let r = match c.rank() {
            0 => oxccl::group(|g| {
                g.send(c, b.slice(..16), 1)?;
                g.send(c, &b, 2)
            }),
            _ => c.recv(&b, 0),
        };
        r.and_then(|()| c.synchronize())
    });
    assert!(mismatch(&out[0]).contains("rank 0 sends 16 x int32 to rank 1"));
    assert!(mismatch(&out[1]).contains("but rank 0 sends 16 x int32"));
    match &out[2] {
        Err(Error::Timeout(m)) => panic!("rank 2 waited out its deadline: {m}"),
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("rank 0: a Send/Recv group"), "{m}");
            assert!(m.contains("rank 0 sends 16 x int32 to rank 1"), "{m}");
        }
        Ok(()) => panic!("rank 2 received what rank 0 never sent"),
    }
}

#[test]
fn host_a_failed_pair_fails_the_group_peers() {
    a_failed_pair_fails_the_group_peers(BackendKind::Host);
}

#[test]
fn cuda_a_failed_pair_fails_the_group_peers() {
    if oxccl::backend::cuda::device_or_skip("cuda_a_failed_pair_fails_the_group_peers").is_none() {
        return;
    }
    a_failed_pair_fails_the_group_peers(BackendKind::Cuda);
}

#[test]
fn host_mismatched_calls_are_errors_on_every_rank() {
    every_case(BackendKind::Host);
}

#[test]
fn cuda_mismatched_calls_are_errors_on_every_rank() {
    if oxccl::backend::cuda::device_or_skip("cuda_mismatched_calls_are_errors_on_every_rank")
        .is_none()
    {
        return;
    }
    every_case(BackendKind::Cuda);
}

/// A peer whose communicator was dropped or destroyed will never call
/// again: its peers among threads fail at once naming it, long before
/// their deadline (20 s here), on a collective and on a send.
fn gone_peers(backend: BackendKind) {
    let mut set = comms(backend, 3);
    drop(set.pop());
    let out = on_ranks(&set, |c| {
        let b = c.alloc::<f32>(8).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum)
    });
    for r in out {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Aborted(_)), "{e}");
        let m = e.to_string();
        assert!(
            m.contains("peer rank 2 destroyed or dropped its communicator")
                && m.contains("call #1 (allreduce(sum) of 8 x float)"),
            "{m}"
        );
    }
    // The communicators are unusable now, and a watchdog that polls the
    // async error (NCCL's `ncclCommGetAsyncError`) learns it, and why.
    for c in &set {
        let e = c.async_error().expect("a lost peer is an async error");
        assert!(matches!(e, Error::Aborted(_)), "{e}");
        assert!(
            e.to_string().contains("peer rank 2 destroyed or dropped"),
            "{e}"
        );
    }
    let pair = comms(backend, 2);
    pair[1].destroy();
    let b = pair[0].alloc::<f32>(8).unwrap();
    let m = pair[0].send(&b, 1).unwrap_err().to_string();
    assert!(
        m.contains("peer rank 1 destroyed or dropped")
            && m.contains("send #0 of 8 x float to rank 1"),
        "{m}"
    );
}

#[test]
fn host_a_dropped_or_destroyed_peer_is_named_at_once() {
    gone_peers(BackendKind::Host);
}

#[test]
fn cuda_a_dropped_or_destroyed_peer_is_named_at_once() {
    if oxccl::backend::cuda::device_or_skip("cuda_a_dropped_or_destroyed_peer_is_named_at_once")
        .is_none()
    {
        return;
    }
    gone_peers(BackendKind::Cuda);
}

/// The commonest first mistake: one thread calling every rank in turn.
/// Rank 0's call can only end at the deadline; its error says why.
#[test]
fn host_one_thread_calling_every_rank_is_told_how_to_call() {
    let comms = impatient(2);
    let b = comms[0].alloc::<f32>(8).unwrap();
    let m = comms[0]
        .all_reduce_in_place(&b, RedOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(m.contains("rank 1 has not reached it"), "{m}");
    assert!(
        m.contains("from a thread of their own") && m.contains("oxccl::group"),
        "{m}"
    );
}

/// Host communicators with a 300 ms deadline.
fn impatient(n: u32) -> Vec<Communicator> {
    oxccl::init_all_with(
        n,
        Config {
            backend: BackendKind::Host,
            deadline: Duration::from_millis(300),
            ..Config::default()
        },
    )
    .unwrap()
}

/// A send whose peer never calls anything ends at the deadline, naming
/// the peer and what is missing; it never hangs.
#[test]
fn host_send_to_an_idle_peer_times_out_with_a_diagnosis() {
    let comms = impatient(2);
    let b = comms[0].alloc::<f32>(8).unwrap();
    let e = comms[0].send(&b, 1).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    let m = e.to_string();
    assert!(m.contains("send #0 of 8 x float to rank 1"), "{m}");
    assert!(m.contains("rank 1 has not posted the matching recv"), "{m}");
}

/// A collective some rank never joins ends at the deadline naming it.
#[test]
fn host_collective_with_a_missing_rank_times_out_naming_it() {
    let comms = impatient(3);
    let out = on_ranks(&comms[..2], |c| {
        let b = c.alloc::<f32>(8).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum)
    });
    // The first rank past the deadline fails the clique; the other may
    // see that failure instead of its own deadline.
    let timeouts: Vec<String> = out
        .into_iter()
        .map(|r| r.unwrap_err())
        .filter(|e| matches!(e, Error::Timeout(_)))
        .map(|e| e.to_string())
        .collect();
    assert!(!timeouts.is_empty());
    for m in timeouts {
        assert!(m.contains("rank 2 has not reached it"), "{m}");
        assert!(m.contains("call #1 (allreduce(sum) of 8 x float)"), "{m}");
    }
}

/// With the check off, matching calls still run (the switch is honoured,
/// and through the environment as well).
#[test]
fn host_check_can_be_switched_off() {
    let cfg = Config::from_vars(|k| (k == "OXCCL_CHECK_CALLS").then(|| "0".into())).unwrap();
    assert!(!cfg.check_calls);
    assert!(Config::default().check_calls);
    let e = Config::from_vars(|k| (k == "OXCCL_CHECK_CALLS").then(|| "maybe".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("or all"), "{e}");
    // `all`: on, and across the network too; plain `1` leaves that off.
    let all = Config::from_vars(|k| (k == "OXCCL_CHECK_CALLS").then(|| "ALL".into())).unwrap();
    assert!(all.check_calls && all.check_calls_across_hosts);
    let one = Config::from_vars(|k| (k == "OXCCL_CHECK_CALLS").then(|| "1".into())).unwrap();
    assert!(one.check_calls && !one.check_calls_across_hosts);
    assert!(!Config::default().check_calls_across_hosts);
    let comms = oxccl::init_all_with(
        3,
        Config {
            backend: BackendKind::Host,
            ..cfg
        },
    )
    .unwrap();
    still_usable(&comms);
}
