//! The INFO line names the choice and the predicted time.
//!
//! In a test binary of its own: `tracing` caches per-callsite interest
//! process-wide, so a scoped subscriber racing other tests' calls on other
//! threads could miss the event.

use std::io::Write;
use std::sync::{Arc, Mutex};

use oxccl::{BackendKind, Config, RedOp};

fn host_config() -> Config {
    Config {
        backend: BackendKind::Host,
        ..Config::default()
    }
}

/// A `tracing` writer that appends to a shared buffer.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn info_line_names_the_choice_and_predicted_time() {
    let cap = Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let comms = oxccl::init_all_with(1, host_config()).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        let mut v = vec![2.0f32; 256];
        comms[0].all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
    });
    let log = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("allreduce count 256 float"))
        .unwrap_or_else(|| panic!("no collective line in {log:?}"));
    let choice = comms[0].last_choice().unwrap();
    assert!(line.contains(&choice.to_string()), "{line}");
    assert!(
        line.contains(" predicted ") && line.contains(" us"),
        "{line}"
    );
    assert!(line.contains(" INFO "), "{line}");
}
