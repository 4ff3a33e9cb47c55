//! A wait that passes its first warning period says so (progress of a
//! hang, not silence), naming what it waits for, before its deadline. In a test binary of its
//! own: `tracing` caches per-callsite interest process-wide.

use std::time::Duration;

mod common;
use common::Capture;

use oxccl::{BackendKind, Config, RedOp};

#[test]
fn a_long_wait_warns_before_its_deadline() {
    let (cap, subscriber) = Capture::subscriber(tracing::Level::WARN);
    let config = Config::builder()
        .backend(BackendKind::Host)
        .deadline(Duration::from_millis(500))
        .wait_warnings(Duration::from_millis(50), Duration::from_secs(60))
        .build()
        .unwrap();
    let comms = oxccl::init_all_with(2, config).unwrap();
    let b = comms[0].alloc::<f32>(4).unwrap();
    let e = tracing::subscriber::with_default(subscriber, || {
        // Rank 1 never calls.
        comms[0].all_reduce_in_place(&b, RedOp::Sum).unwrap_err()
    });
    let log = cap.text();
    let warn = log
        .lines()
        .find(|l| l.contains("still waiting"))
        .unwrap_or_else(|| panic!("no warning in {log:?}; error {e}"));
    assert!(warn.contains("rank 1 has not reached it"), "{warn}");
    assert!(warn.contains(" WARN "), "{warn}");
    assert!(matches!(e, oxccl::Error::Timeout(_)), "{e}");
}
