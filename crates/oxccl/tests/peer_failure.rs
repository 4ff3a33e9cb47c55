//! A rank whose call fails validation posts that to its peers: their
//! matching calls fail at once, naming it and the reason, instead of
//! waiting for a call that never comes; the error says whom to blame and
//! the communicator stays usable.

use std::time::Duration;

mod common;
use common::on_ranks;

use oxccl::{BackendKind, Communicator, Config, Error, Group, RedOp};

/// `n` host ranks whose waits end by an answer: a `PeerFailed` can only
/// come from a posted refusal (a wait to the deadline, a minute, would be
/// a Timeout).
fn patient(n: u32) -> Vec<Communicator> {
    let config = Config::builder()
        .backend(BackendKind::Host)
        .deadline(Duration::from_secs(60))
        .build()
        .unwrap();
    oxccl::init_all_with(n, config).unwrap()
}

/// Asserts that `e` is a peer's failure blaming `peer`, naming `parts`.
fn blames(e: &Error, peer: u32, parts: &[&str]) {
    assert!(matches!(e, Error::PeerFailed { .. }), "{e}");
    assert_eq!(e.blamed_rank(), Some(peer), "{e}");
    common::assert_names(&e.to_string(), parts);
}

/// An AllReduce on every rank: the ranks' calls line up again after a
/// failed one.
fn lines_up(comms: &[Communicator]) {
    let n = comms.len() as f32;
    let sums = on_ranks(comms, |c| {
        let b = c.alloc::<f32>(16).unwrap();
        b.copy_from_slice(&[1.0; 16]).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
        c.synchronize().unwrap();
        b.to_vec().unwrap()
    });
    for v in sums {
        assert_eq!(v, vec![n; 16]);
    }
}

#[test]
fn a_refused_call_fails_the_peers_naming_the_rank_and_reason() {
    // The deadline is far beyond the test: only the posted refusal can end
    // the peers' waits with `PeerFailed` (a deadline would be a Timeout).
    let config = Config::builder()
        .backend(BackendKind::Host)
        .deadline(Duration::from_secs(600))
        .build()
        .unwrap();
    let comms = oxccl::init_all_with(3, config).unwrap();
    let got = on_ranks(&comms, |c| {
        let send = c.alloc::<f32>(8).unwrap();
        // Rank 1's receive buffer is too short: validation refuses it.
        let recv = c.alloc::<f32>(if c.rank() == 1 { 4 } else { 8 }).unwrap();
        c.all_reduce(&send, &recv, RedOp::Sum).unwrap_err()
    });
    assert!(matches!(got[1], Error::LengthMismatch { .. }), "{}", got[1]);
    assert_eq!(got[1].blamed_rank(), None, "its own error");
    for r in [0, 2] {
        let e = &got[r];
        assert!(matches!(e, Error::PeerFailed { .. }), "rank {r}: {e}");
        assert_eq!(e.blamed_rank(), Some(1), "{e}");
        assert!(e.peer_failed());
        let msg = e.to_string();
        assert!(msg.contains("peer rank 1 failed call #1"), "{msg}");
        assert!(
            msg.contains("a buffer's length does not fit the count"),
            "{msg}"
        );
    }
    // Every rank consumed call #1: the next call lines up and succeeds.
    let sums = on_ranks(&comms, |c| {
        let b = c.alloc::<f32>(16).unwrap();
        b.copy_from_slice(&[1.0; 16]).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
        c.synchronize().unwrap();
        b.to_vec().unwrap()
    });
    for v in sums {
        assert_eq!(v, vec![3.0; 16]);
    }
}

/// A collective refused inside a group fails the group on its rank (the
/// group may go on being filled, but its end returns the refusal), and
/// the peers' group ends fail at once naming the rank and the reason.
#[test]
fn a_call_refused_in_a_group_fails_the_peers_group_ends() {
    let comms = patient(3);
    let got = on_ranks(&comms, |c| {
        let send = c.alloc::<f32>(8).unwrap();
        let recv = c.alloc::<f32>(if c.rank() == 1 { 4 } else { 8 }).unwrap();
        let other = c.alloc::<f32>(8).unwrap();
        let mut g = Group::new();
        let added = g.all_reduce(c, &send, &recv, RedOp::Sum);
        assert_eq!(
            added.is_err(),
            c.rank() == 1,
            "rank {}: {added:?}",
            c.rank()
        );
        // The group is still filled after the refusal.
        g.all_reduce(c, &other, &other, RedOp::Max).unwrap();
        g.end().unwrap_err()
    });
    assert!(matches!(got[1], Error::LengthMismatch { .. }), "{}", got[1]);
    assert_eq!(got[1].blamed_rank(), None, "its own error");
    for r in [0, 2] {
        blames(
            &got[r],
            1,
            &[
                "peer rank 1 failed call #1",
                "a buffer's length does not fit the count",
            ],
        );
    }
    lines_up(&comms);
}

/// The usual form: `?` on the refused operation leaves [`oxccl::group`]'s
/// closure, dropping the group unended; the refusal is posted all the
/// same. Here in a Send/Recv-only group, where the peers wait on their
/// pairs rather than on a collective.
#[test]
fn a_send_refused_in_a_dropped_group_fails_its_pairs() {
    let comms = patient(2);
    let got = on_ranks(&comms, |c| {
        let (me, n) = (c.rank(), c.nranks());
        let send = c.alloc::<f32>(8).unwrap();
        let recv = c.alloc::<f32>(8).unwrap();
        // Rank 1 names a peer out of range: validation refuses it.
        let to = if me == 1 { 7 } else { (me + 1) % n };
        oxccl::group(|g| {
            g.send(c, &send, to)?;
            g.recv(c, &recv, (me + n - 1) % n)
        })
        .unwrap_err()
    });
    assert!(matches!(got[1], Error::PeerOutOfRange { .. }), "{}", got[1]);
    blames(
        &got[0],
        1,
        &[
            "peer rank 1 failed its group",
            "x float",
            "its peer is out of range",
        ],
    );
    lines_up(&comms);
}

/// Sends to a rank itself that its receives from itself do not match are
/// found at the group's end, before anything is published: refused there
/// and posted like any refusal.
#[test]
fn unmatched_sends_to_oneself_are_refused_at_the_group_end() {
    let comms = patient(3);
    let got = on_ranks(&comms, |c| {
        let me = c.rank();
        let a = c.alloc::<f32>(8).unwrap();
        let b = c.alloc::<f32>(if me == 2 { 4 } else { 8 }).unwrap();
        let all = c.alloc::<f32>(8).unwrap();
        let mut g = Group::new();
        g.send(c, &a, me).unwrap();
        g.recv(c, &b, me).unwrap();
        g.all_reduce(c, &all, &all, RedOp::Sum).unwrap();
        g.end()
    });
    let mine = got[2].as_ref().unwrap_err();
    assert!(matches!(mine, Error::InvalidUsage(_)), "{mine}");
    assert!(
        mine.to_string()
            .contains("sends [8] to itself but receives [4]"),
        "{mine}"
    );
    for r in [0, 1] {
        let e = got[r].as_ref().unwrap_err();
        blames(
            e,
            2,
            &[
                "peer rank 2 failed call #1",
                "its sends to itself and receives from itself do not match",
            ],
        );
    }
    lines_up(&comms);
}

/// A rank thread that owns its communicator and ends mid-job drops it:
/// its peers' next call fails at once naming it, well before the
/// deadline.
#[test]
fn a_rank_thread_that_exits_is_named_by_its_peers() {
    let got: Vec<Option<Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = patient(3)
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    if c.rank() == 2 {
                        return None; // exits, dropping its communicator
                    }
                    let b = c.alloc::<f32>(8).unwrap();
                    c.all_reduce_in_place(&b, RedOp::Sum).err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(got[2].is_none());
    for r in [0, 1] {
        let e = got[r].as_ref().expect("the call fails");
        assert!(matches!(e, Error::Aborted(_)), "rank {r}: {e}");
        common::assert_names(
            &e.to_string(),
            &[
                "peer rank 2 destroyed or dropped its communicator",
                "call #1",
            ],
        );
    }
}
