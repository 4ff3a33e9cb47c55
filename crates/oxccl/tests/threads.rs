//! Several threads calling on one communicator: `Communicator` is `Sync`
//! and orders them (each call holds the communicator for its length), so
//! concurrent calls never collide inside the backend. Different calls
//! racing in different orders on different ranks are reported as a
//! mismatch, never as an internal error.

mod common;
use common::host;

use oxccl::{Communicator, Error, RedOp};

fn assert_sync<T: Sync + Send>() {}

#[test]
fn communicator_is_send_and_sync() {
    assert_sync::<Communicator>();
}

#[test]
fn two_threads_per_rank_same_calls_all_succeed() {
    let comms = host(3);
    std::thread::scope(|s| {
        for c in &comms {
            for t in 0..2 {
                s.spawn(move || {
                    for i in 0..20 {
                        let b = c.alloc::<u32>(256).unwrap();
                        b.copy_from_slice(&[c.rank() + 1; 256]).unwrap();
                        c.all_reduce_in_place(&b, RedOp::Sum)
                            .unwrap_or_else(|e| panic!("thread {t} call {i}: {e}"));
                        assert_eq!(b.to_vec().unwrap(), vec![6; 256]);
                    }
                });
            }
        }
    });
}

#[test]
fn racing_different_calls_are_mismatches_not_internal_errors() {
    let comms = host(2);
    let results: Vec<oxccl::Result<()>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for c in &comms {
            for len in [64usize, 128] {
                hs.push(s.spawn(move || {
                    let b = c.alloc::<f32>(len).unwrap();
                    (0..10).try_for_each(|_| c.all_reduce_in_place(&b, RedOp::Sum).map(drop))
                }));
            }
        }
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        match r {
            Ok(()) | Err(Error::Mismatch { .. }) => {}
            Err(e) => panic!("expected success or a mismatch, got {e}"),
        }
    }
}
