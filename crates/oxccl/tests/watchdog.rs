//! A call a backend enqueues (CUDA) and that does not complete warns on
//! stderr, from the clique's watchdog thread, naming the communicator, the
//! call and the rank that never launched it, first after
//! `wait_warn.first` and then every period. The backend here enqueues
//! nothing: a launch completes once every rank has launched as many
//! times, as a kernel waiting on its peers' flags would. In a test binary
//! of its own: the watchdog's thread speaks through the global
//! subscriber.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::Capture;

use oxccl::backend::null::NullBackend;
use oxccl::backend::{Backend, Completion, Launch};
use oxccl::{Config, Error, RedOp};

/// The null backend, enqueueing: a rank's launches complete when every
/// rank has launched at least as many times.
#[derive(Debug)]
struct Enqueues {
    inner: NullBackend,
    launched: Arc<Mutex<Vec<u64>>>,
}

#[derive(Debug)]
struct UntilAll {
    launched: Arc<Mutex<Vec<u64>>>,
    upto: u64,
}

impl Completion for UntilAll {
    fn is_done(&mut self) -> Result<bool, Error> {
        Ok(self
            .launched
            .lock()
            .unwrap()
            .iter()
            .all(|&n| n >= self.upto))
    }
    fn wait(&mut self) -> Result<(), Error> {
        while !self.is_done()? {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

impl Backend for Enqueues {
    common::forward_to_inner!();
    common::forward_plans_to_inner!();
    fn describe(&self) -> String {
        "null, enqueueing".into()
    }
    fn blocking(&self) -> bool {
        false
    }
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        self.launched.lock().unwrap()[launch.rank as usize] += 1;
        Ok(())
    }
    fn completion(&self, rank: u32) -> Result<Box<dyn Completion>, Error> {
        let upto = self.launched.lock().unwrap()[rank as usize];
        Ok(Box::new(UntilAll {
            launched: self.launched.clone(),
            upto,
        }))
    }
    fn abort(&self, _why: &str) {}
    fn failure(&self) -> Option<Error> {
        None
    }
}

/// Waits until `cap` holds `n` watchdog lines (a bound only against a
/// hang: the test fails if they never come).
fn lines(cap: &Capture, n: usize) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let found: Vec<String> = cap
            .text()
            .lines()
            .filter(|l| l.contains("has not completed"))
            .map(str::to_string)
            .collect();
        if found.len() >= n {
            return found;
        }
        assert!(
            Instant::now() < end,
            "no watchdog warning in {:?}",
            cap.text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_enqueued_call_a_rank_never_launches_warns_naming_it_and_the_call() {
    let (cap, subscriber) = Capture::subscriber(tracing::Level::WARN);
    tracing::subscriber::set_global_default(subscriber).unwrap();
    const N: u32 = 3;
    let launched = Arc::new(Mutex::new(vec![0; N as usize]));
    let backend = Arc::new(Enqueues {
        inner: NullBackend::new(4, 1 << 16),
        launched: launched.clone(),
    });
    // Unchecked, ranks launch without waiting for each other: the wait
    // is the "kernel's" alone.
    let config = Config::builder()
        .check_calls(false)
        .wait_warnings(Duration::from_millis(30), Duration::from_millis(30))
        .build()
        .unwrap();
    let comms = oxccl::init_all_on(N, backend, config).unwrap();
    let bufs: Vec<_> = comms
        .iter()
        .map(|c| c.alloc::<f32>(1024).unwrap())
        .collect();
    // Ranks 0 and 2 launch; rank 1 never does (until two warnings came).
    for r in [0, 2] {
        comms[r].all_reduce_in_place(&bufs[r], RedOp::Sum).unwrap();
    }
    let warned = lines(&cap, 4);
    let mine = warned
        .iter()
        .find(|l| l.contains("rank 0 of communicator"))
        .unwrap_or_else(|| panic!("rank 0 did not warn: {warned:?}"));
    assert!(mine.contains(" WARN "), "{mine}");
    assert!(
        mine.contains("call #1 (allreduce(sum) of 1024 x float)"),
        "{mine}"
    );
    assert!(mine.contains("rank 1 has not launched it"), "{mine}");
    assert!(!mine.contains("rank 2 has not"), "{mine}");
    // Warned again every period, by both waiting ranks, never by rank 1.
    assert!(
        warned.iter().filter(|l| l.contains("rank 0 of")).count() >= 2
            || warned.iter().filter(|l| l.contains("rank 2 of")).count() >= 2,
        "{warned:?}"
    );
    assert!(
        !warned.iter().any(|l| l.contains("rank 1 of")),
        "{warned:?}"
    );
    // Once rank 1 launches, the call completes and the warnings stop:
    // the watchdog is done with the launches (nothing pending to name).
    comms[1].all_reduce_in_place(&bufs[1], RedOp::Sum).unwrap();
    assert_eq!(*launched.lock().unwrap(), vec![1, 1, 1]);
}
