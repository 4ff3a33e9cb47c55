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
                s.spawn(move || {
                    // A rank whose check fails aborts every communicator, so
                    // its peers' waits end at once instead of at the
                    // deadline (the failure would otherwise look like a hang).
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c))) {
                        Ok(v) => v,
                        Err(p) => {
                            for other in comms {
                                other.abort();
                            }
                            std::panic::resume_unwind(p)
                        }
                    }
                })
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

/// The [`oxccl::backend::Backend`] methods a test backend passes on to
/// its `inner` backend unchanged (memory, synchronisation, the timer and
/// the copy ceiling), for wrappers that change only launches or failures.
#[allow(unused_macros)] // only the test backends use it
macro_rules! forward_to_inner {
    () => {
        fn alloc(&self, rank: u32, bytes: usize) -> Result<oxccl::backend::RawBuf, oxccl::Error> {
            self.inner.alloc(rank, bytes)
        }
        unsafe fn free(&self, rank: u32, buf: oxccl::backend::RawBuf) {
            // SAFETY: passed on under the caller's contract.
            unsafe { self.inner.free(rank, buf) }
        }
        unsafe fn write(
            &self,
            rank: u32,
            dst: oxccl::backend::RawBuf,
            src: &[u8],
        ) -> Result<(), oxccl::Error> {
            // SAFETY: as above.
            unsafe { self.inner.write(rank, dst, src) }
        }
        unsafe fn read(
            &self,
            rank: u32,
            src: oxccl::backend::RawBuf,
            dst: &mut [u8],
        ) -> Result<(), oxccl::Error> {
            // SAFETY: as above.
            unsafe { self.inner.read(rank, src, dst) }
        }
        fn synchronize(&self, rank: u32) -> Result<(), oxccl::Error> {
            self.inner.synchronize(rank)
        }
        fn timer(&self, rank: u32) -> Result<Box<dyn oxccl::backend::Timer>, oxccl::Error> {
            self.inner.timer(rank)
        }
        fn copy_bandwidth(&self, bytes: usize) -> Result<f64, oxccl::Error> {
            self.inner.copy_bandwidth(bytes)
        }
    };
}
#[allow(unused_imports)] // only the test backends use it
pub(crate) use forward_to_inner;

/// The [`oxccl::backend::Backend`] methods that describe the `inner`
/// backend's kind and plans (kind, registered memory, chunk, channels,
/// plan preparation), passed on unchanged.
#[allow(unused_macros)] // only the test backends use it
macro_rules! forward_plans_to_inner {
    () => {
        fn kind(&self) -> oxccl::backend::BackendKind {
            self.inner.kind()
        }
        fn registered_alloc(&self) -> bool {
            self.inner.registered_alloc()
        }
        fn chunk_bytes(&self) -> usize {
            self.inner.chunk_bytes()
        }
        fn max_channels(&self) -> u32 {
            self.inner.max_channels()
        }
        fn prepare_plan(
            &self,
            plan: &oxccl::core::Plan,
            es: usize,
            p: oxccl::core::Proto,
        ) -> Result<Option<oxccl::backend::PlanHandle>, oxccl::Error> {
            self.inner.prepare_plan(plan, es, p)
        }
    };
}
#[allow(unused_imports)] // only the test backends use it
pub(crate) use forward_plans_to_inner;
