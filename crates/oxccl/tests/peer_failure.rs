//! A rank whose call fails validation posts that to its peers: their
//! matching calls fail at once, naming it and the reason, instead of
//! waiting for a call that never comes; the error says whom to blame and
//! the communicator stays usable.

use std::time::Duration;

mod common;
use common::on_ranks;

use oxccl::{BackendKind, Buffer, Communicator, Config, Error, Group, RedOp};

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
    let comms = patient(3);
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
    lines_up(&comms);
}

/// Three buffers of 8 f32 on `c`, the second only 4 long on rank `short`.
fn bufs(c: &Communicator, short: u32) -> [Buffer<f32>; 3] {
    let len = |k: usize| if k == 1 && c.rank() == short { 4 } else { 8 };
    [0, 1, 2].map(|k| c.alloc::<f32>(len(k)).unwrap())
}

/// What the peers' errors name in `short_recv_in_a_group`.
const SHORT_RECV_IN_A_GROUP: &[&str] = &["call #1", "length does not fit the count"];

/// What the peers' errors name where rank 1 sends to a peer out of range.
const SEND_OUT_OF_RANGE: &[&str] = &["its group", "x float", "peer is out of range"];

/// What the peers' errors name in `unmatched_self_pairs`.
const UNMATCHED_SELF_PAIRS: &[&str] = &["call #1", "receives from itself do not"];

/// Runs `group` on every rank of `n`: rank `refuser`'s group fails with
/// an error of its own (printed), every other rank's at once with a
/// [`Error::PeerFailed`] blaming it ("peer rank R failed ...") and naming
/// `parts`; then the ranks' calls line up again.
fn refused_group(
    n: u32,
    refuser: usize,
    group: impl Fn(&Communicator) -> oxccl::Result<()> + Sync,
    parts: &[&str],
) {
    let comms = patient(n);
    let got: Vec<Error> = on_ranks(&comms, |c| group(c).unwrap_err());
    println!("rank {refuser}: {}", got[refuser]);
    assert!(!got[refuser].peer_failed(), "{}", got[refuser]);
    assert_eq!(got[refuser].blamed_rank(), None, "its own error");
    let named = format!("peer rank {refuser} failed");
    for (r, e) in got.iter().enumerate().filter(|(r, _)| *r != refuser) {
        assert!(matches!(e, Error::PeerFailed { .. }), "rank {r}: {e}");
        assert_eq!(e.blamed_rank(), Some(refuser as u32), "{e}");
        common::assert_names(&e.to_string(), &[&named]);
        common::assert_names(&e.to_string(), parts);
    }
    lines_up(&comms);
}

/// A call refused inside a group fails the group on its rank, and the
/// peers' group ends fail at once naming the rank and the reason: a
/// collective refused as it is added (the group may go on being filled,
/// but its end returns the refusal), and sends to the rank itself that
/// its receives from itself do not match, found at the end before
/// anything is published.
#[test]
fn calls_refused_in_groups_fail_the_peers_group_ends() {
    refused_group(3, 1, short_recv_in_a_group, SHORT_RECV_IN_A_GROUP);
    refused_group(3, 2, unmatched_self_pairs, UNMATCHED_SELF_PAIRS);
}

/// Rank 1's AllReduce has a short receive buffer; a valid one follows.
fn short_recv_in_a_group(c: &Communicator) -> oxccl::Result<()> {
    let [send, recv, other] = bufs(c, 1);
    let mut g = Group::new();
    let added = g.all_reduce(c, &send, &recv, RedOp::Sum);
    assert_eq!(added.is_err(), c.rank() == 1, "{added:?}");
    // The group is still filled after the refusal.
    g.all_reduce(c, &other, &other, RedOp::Max).unwrap();
    g.end()
}

/// Rank 2 sends 8 elements to itself and receives 4 from itself.
fn unmatched_self_pairs(c: &Communicator) -> oxccl::Result<()> {
    let [a, b, all] = bufs(c, 2);
    let mut g = Group::new();
    g.send(c, &a, c.rank()).unwrap();
    g.recv(c, &b, c.rank()).unwrap();
    g.all_reduce(c, &all, &all, RedOp::Sum).unwrap();
    g.end()
}

/// The usual form: `?` on the refused operation leaves [`oxccl::group`]'s
/// closure, dropping the group unended; the refusal is posted all the
/// same. Here in a Send/Recv-only group, where the peer waits on its
/// pairs rather than on a collective.
#[test]
fn a_send_refused_in_a_dropped_group_fails_its_pairs() {
    let group = |c: &Communicator| {
        let [send, _, recv] = bufs(c, 1);
        let (me, to) = (c.rank(), if c.rank() == 1 { 7 } else { 1 });
        oxccl::group(|g| {
            g.send(c, &send, to)?;
            g.recv(c, &recv, 1 - me)
        })
    };
    refused_group(2, 1, group, SEND_OUT_OF_RANGE);
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
