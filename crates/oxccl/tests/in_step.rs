//! A backend whose launches go in step (CUDA with more ranks on a GPU than
//! hardware queues: a launch returns once every rank of the GPU launched
//! the call). One thread driving every communicator in a group must still
//! complete: the group's end launches each communicator on a thread of its
//! own. Without that, the first launch would wait for ranks the same
//! thread has not reached yet.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod common;

use oxccl::backend::null::NullBackend;
use oxccl::backend::{Backend, Launch};
use oxccl::{Config, Error, RedOp};

/// The null backend, with launches that wait (at most `WAIT`) until every
/// rank has launched as many times.
#[derive(Debug)]
struct InStep {
    inner: NullBackend,
    launched: Mutex<Vec<u64>>,
    moved: Condvar,
}

const WAIT: Duration = Duration::from_secs(5);

impl Backend for InStep {
    common::forward_to_inner!();
    common::forward_plans_to_inner!();
    fn describe(&self) -> String {
        "null, launches in step".into()
    }
    fn blocking(&self) -> bool {
        false
    }
    fn launches_in_step(&self) -> bool {
        true
    }
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        let end = Instant::now() + WAIT;
        let mut l = self.launched.lock().unwrap();
        let r = launch.rank as usize;
        l[r] += 1;
        let mine = l[r];
        self.moved.notify_all();
        while l.iter().any(|&n| n < mine) {
            let now = Instant::now();
            if now >= end {
                return Err(Error::Backend(format!(
                    "rank {r}: launch {mine} waited {WAIT:?} for the other ranks' launches"
                )));
            }
            l = self.moved.wait_timeout(l, end - now).unwrap().0;
        }
        Ok(())
    }
    fn abort(&self, _why: &str) {}
    fn failure(&self) -> Option<Error> {
        None
    }
}

#[test]
fn one_thread_drives_in_step_communicators_through_a_group() {
    const N: u32 = 6;
    let backend = Arc::new(InStep {
        inner: NullBackend::new(4, 1 << 16),
        launched: Mutex::new(vec![0; N as usize]),
        moved: Condvar::new(),
    });
    let comms = oxccl::init_all_on(N, backend, Config::default()).unwrap();
    let bufs: Vec<_> = comms
        .iter()
        .map(|c| (c.alloc::<f32>(1024).unwrap(), c.alloc::<f32>(1024).unwrap()))
        .collect();
    for call in 0..3 {
        oxccl::group(|g| {
            for (c, (s, r)) in comms.iter().zip(&bufs) {
                g.all_reduce(c, s, r, RedOp::Sum)?;
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("group {call}: {e}"));
    }
}
