//! A rank whose call fails validation posts that to its peers: their
//! matching calls fail at once, naming it and the reason, instead of
//! waiting for a call that never comes; the error says whom to blame and
//! the communicator stays usable.

use std::time::Duration;

mod common;
use common::on_ranks;

use oxccl::{BackendKind, Config, Error, RedOp};

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
