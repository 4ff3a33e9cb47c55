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

/// Without the call check, a rank whose peer never calls waits inside the
/// plan: that wait warns too, with no deadline, at the first period and
/// again at every later one, naming the absent rank. The peer calls only
/// once two warnings were seen, so the count does not depend on timing.
#[test]
fn a_wait_inside_a_plan_warns_periodically_without_deadline() {
    let (cap, subscriber) = Capture::subscriber(tracing::Level::WARN);
    let config = Config::builder()
        .backend(BackendKind::Host)
        .no_deadline()
        .check_calls(false)
        .wait_warnings(Duration::from_millis(30), Duration::from_millis(30))
        .build()
        .unwrap();
    let comms = oxccl::init_all_with(2, config).unwrap();
    let warnings = || cap.text().matches("oxccl-host: waiting").count();
    std::thread::scope(|s| {
        s.spawn(|| {
            while warnings() < 2 {
                std::thread::sleep(Duration::from_millis(5));
            }
            let b = comms[1].alloc::<f32>(4).unwrap();
            comms[1].all_reduce_in_place(&b, RedOp::Sum).unwrap();
        });
        let b = comms[0].alloc::<f32>(4).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            comms[0].all_reduce_in_place(&b, RedOp::Sum).unwrap();
        });
    });
    let log = cap.text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("oxccl-host: waiting"))
        .collect();
    assert!(lines.len() >= 2, "{log}");
    for l in lines {
        assert!(l.contains(" WARN ") && l.contains("no deadline"), "{l}");
        assert!(l.contains("ranks not yet in this call: [1]"), "{l}");
    }
}
