//! Helpers shared by the facade's test binaries.

use oxccl::{BackendKind, Communicator, Config};

#[allow(dead_code)] // only the raw-entry tests use it
pub mod raw;

#[allow(dead_code)] // only the multi-process tests use it
pub mod procs;

#[allow(dead_code)] // only the profiler plugin tests use it
pub mod profiler;

/// What a kind mismatch names in both mismatch tests: rank 0 broadcasts
/// 1024 f32 while ranks 1-3 AllReduce them.
#[allow(dead_code)] // only the mismatch tests use it
pub const KIND_SIDES: [&str; 2] = [
    "rank 0: broadcast(root 0) of 1024 x float",
    "ranks 1-3: allreduce(sum) of 1024 x float",
];

/// Asserts that the error message `m` contains every one of `parts` (the
/// ranks it names and what each group of them called), showing `m` when
/// one is missing.
#[allow(dead_code)] // only the mismatch tests use it
pub fn assert_names(m: &str, parts: &[&str]) {
    for part in parts {
        assert!(m.contains(part), "{part:?} missing from: {m}");
    }
}

/// `n` communicators on the host backend, whatever the machine has.
#[allow(dead_code)] // not every test binary uses it
pub fn host(n: u32) -> Vec<Communicator> {
    oxccl::init_all_with(
        n,
        Config {
            backend: BackendKind::Host,
            ..Config::default()
        },
    )
    .unwrap()
}

/// `n` communicators on the CUDA backend (default configuration), or
/// `None` after `test`'s `skipped: no CUDA device` line where there is no
/// driver (under `OXCCL_REQUIRE_GPU=1` that panics instead).
#[allow(dead_code)] // not every test binary has CUDA tests
pub fn cuda(test: &str, n: u32) -> Option<Vec<Communicator>> {
    oxccl::backend::cuda::device_or_skip(test)?;
    let config = Config {
        backend: BackendKind::Cuda,
        ..Config::default()
    };
    Some(oxccl::init_all_with(n, config).expect("CUDA communicators"))
}

/// Runs `f` on every rank's own thread; results in rank order.
#[allow(dead_code)] // not every test binary runs ranks on threads
pub fn on_ranks<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A `tracing` writer that appends to a shared buffer, for tests that
/// read the log.
#[derive(Clone, Default)]
#[allow(dead_code)] // only the log tests use it
pub struct Capture(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[allow(dead_code)]
impl Capture {
    /// A subscriber at `level` writing into a new capture, and the capture.
    pub fn subscriber(level: tracing::Level) -> (Capture, impl tracing::Subscriber) {
        let cap = Capture::default();
        let writer = cap.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (cap, sub)
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
