//! The INFO line names the choice and the predicted time.
//!
//! In a test binary of its own: `tracing` caches per-callsite interest
//! process-wide, so a scoped subscriber racing other tests' calls on other
//! threads could miss the event.

mod common;
use common::Capture;

use oxccl::{BackendKind, Config, RedOp};

fn host_config() -> Config {
    Config {
        backend: BackendKind::Host,
        ..Config::default()
    }
}

#[test]
fn info_line_names_the_choice_and_predicted_time() {
    let (cap, subscriber) = Capture::subscriber(tracing::Level::INFO);
    let comms = oxccl::init_all_with(1, host_config()).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        // In place, one rank has nothing to move, and says so; out of
        // place it copies, by the plan the line names.
        let mut v = vec![2.0f32; 256];
        comms[0].all_reduce_in_place(&mut v, RedOp::Max).unwrap();
        let mut out = vec![0.0f32; 256];
        comms[0].all_reduce(&v, &mut out, RedOp::Sum).unwrap();
    });
    let log = cap.text();
    assert!(
        log.contains("allreduce(max) of 256 x float: nothing to move (one rank, in place)"),
        "{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("allreduce(sum) of 256 x float: "))
        .unwrap_or_else(|| panic!("no collective line in {log:?}"));
    let choice = comms[0].last_choice().unwrap();
    assert!(line.contains(&choice.to_string()), "{line}");
    assert!(
        line.contains(" predicted ") && line.contains(" us"),
        "{line}"
    );
    assert!(line.contains(" INFO "), "{line}");
    assert!(
        !line.contains("root"),
        "a rootless call logs no root: {line}"
    );
    assert!(line.contains("(host-model estimate"), "{line}");
}
