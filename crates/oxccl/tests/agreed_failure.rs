//! A rank whose call fails after every rank agreed on it (its launch, or
//! joining the caller's stream, fails on that rank alone) leaves its peers
//! in the call's data waits: it fails the communicator naming itself, so
//! the peers fail at once with `PeerFailed` naming it and the reason,
//! instead of waiting for their deadline. The failures are injected by a
//! wrapper around the host backend.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::on_ranks;

use oxccl::backend::{Backend, BackendKind, Launch, RawBuf, RawStream};
use oxccl::core::{CollKind, DataType};
use oxccl::{Communicator, Config, Error, RawColl, RedOp};

/// What fails on rank [`FLAKY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inject {
    Launch,
    Stream,
}

const FLAKY: u32 = 1;

/// The host backend, but rank [`FLAKY`]'s launches or stream joins fail.
/// A failing launch waits until every other rank is inside its own, so
/// its peers are in their data waits (without the call check nothing
/// else orders them).
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn Backend>,
    inject: Inject,
    nranks: u32,
    entered: AtomicU32,
}

fn injected(rank: u32) -> Error {
    Error::Backend(format!("injected failure on rank {rank}"))
}

impl Backend for Flaky {
    common::forward_to_inner!();
    common::forward_plans_to_inner!();
    fn describe(&self) -> String {
        format!("{} with injected failures", self.inner.describe())
    }
    fn blocking(&self) -> bool {
        self.inner.blocking()
    }
    fn registered_external(&self) -> bool {
        self.inner.registered_external()
    }
    fn host_addressable(&self) -> bool {
        self.inner.host_addressable()
    }
    fn check_external(&self, rank: u32, buf: RawBuf) -> Result<(), Error> {
        self.inner.check_external(rank, buf)
    }
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        if self.inject == Inject::Launch && launch.rank == FLAKY {
            let guard = Instant::now() + Duration::from_secs(60);
            while self.entered.load(Ordering::Acquire) < self.nranks - 1 && Instant::now() < guard {
                std::thread::sleep(Duration::from_millis(1));
            }
            return Err(injected(launch.rank));
        }
        self.entered.fetch_add(1, Ordering::Release);
        // SAFETY: passed on under the caller's contract.
        unsafe { self.inner.execute(launch) }
    }
    unsafe fn follow_stream(&self, rank: u32, stream: RawStream) -> Result<(), Error> {
        if self.inject == Inject::Stream && rank == FLAKY {
            return Err(injected(rank));
        }
        // SAFETY: as above.
        unsafe { self.inner.follow_stream(rank, stream) }
    }
    fn abort(&self, why: &str) {
        self.inner.abort(why)
    }
    fn failure(&self) -> Option<Error> {
        self.inner.failure()
    }
}

/// `n` ranks on the flaky host backend whose waits end by an answer: a
/// `PeerFailed` can only come from the failing rank's report (a wait to
/// the deadline, a minute, would be a deadline error).
/// `checked`: with the call check (the failure is then posted on its
/// board, as across processes), or without (the clique's own note).
fn flaky(n: u32, inject: Inject, checked: bool) -> Vec<Communicator> {
    let config = Config::builder()
        .backend(BackendKind::Host)
        .deadline(Duration::from_secs(60))
        .check_calls(checked)
        .build()
        .unwrap();
    let inner = oxccl::backend::host::create(&config.backend_options(n)).unwrap();
    let backend = Arc::new(Flaky {
        inner,
        inject,
        nranks: n,
        entered: AtomicU32::new(0),
    });
    oxccl::init_all_on(n, backend, config).unwrap()
}

/// Every rank but [`FLAKY`] got `PeerFailed` blaming it with its reason;
/// it got its own error.
fn blame_the_flaky_rank(errors: Vec<Error>) {
    for (r, e) in errors.into_iter().enumerate() {
        if r as u32 == FLAKY {
            assert_eq!(e, injected(FLAKY), "rank {r}");
            continue;
        }
        assert_eq!(e.blamed_rank(), Some(FLAKY), "rank {r}: {e}");
        let text = e.to_string();
        assert!(
            text.contains("injected failure on rank 1"),
            "rank {r}: {text}"
        );
        assert!(text.contains("peer rank 1 failed"), "rank {r}: {text}");
    }
}

#[test]
fn a_launch_failing_on_one_rank_fails_its_peers_naming_it() {
    for checked in [true, false] {
        let comms = flaky(3, Inject::Launch, checked);
        // Allocated first: a rank must not find the clique failed there.
        let bufs: Vec<_> = comms
            .iter()
            .map(|c| c.alloc::<f32>(1024).unwrap())
            .collect();
        let mut handle = comms[2].completion().unwrap();
        let errors: Vec<Error> = std::thread::scope(|s| {
            let mut handles = Vec::new();
            for (c, b) in comms.iter().zip(bufs) {
                handles.push(s.spawn(move || c.all_reduce_in_place(&b, RedOp::Sum).unwrap_err()));
            }
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        blame_the_flaky_rank(errors);
        // The communicator's failure says the same to a later caller, and
        // to a completion handle taken before.
        let polled = handle.is_done().unwrap_err();
        assert_eq!(
            polled.blamed_rank(),
            Some(FLAKY),
            "checked {checked}: {polled}"
        );
        let later = comms[0].async_error().unwrap();
        assert_eq!(
            later.blamed_rank(),
            Some(FLAKY),
            "checked {checked}: {later}"
        );
        assert!(
            later.to_string().contains("allreduce(sum) of 1024 x float"),
            "{later}"
        );
        // A later call on a survivor is refused, still naming the rank.
        let again = comms[0].alloc::<f32>(16).unwrap_err();
        assert_eq!(
            again.blamed_rank(),
            Some(FLAKY),
            "checked {checked}: {again}"
        );
    }
}

/// An in-place raw AllReduce of `data`.
fn in_place(data: &mut [f32]) -> RawColl {
    RawColl {
        kind: CollKind::AllReduce,
        send: data.as_ptr().cast(),
        recv: data.as_mut_ptr().cast(),
        count: data.len(),
        dtype: DataType::F32,
        op: RedOp::Sum,
        root: 0,
    }
}

#[test]
fn a_stream_join_failing_after_a_group_agreed_fails_its_peers_naming_it() {
    let comms = flaky(3, Inject::Stream, true);
    let errors = on_ranks(&comms, |c| {
        let (mut a, mut b) = (vec![1.0f32; 256], vec![1.0f32; 64]);
        // Two collectives: a group of one runs as the lone call (below).
        let mut g = oxccl::Group::new();
        // SAFETY: host memory of this thread, alive until the group ends
        // (the host backend ignores the stream).
        unsafe { g.collective_raw(c, in_place(&mut a), RawStream(7)) }.unwrap();
        // SAFETY: as above.
        unsafe { g.collective_raw(c, in_place(&mut b), RawStream(7)) }.unwrap();
        g.end().unwrap_err()
    });
    blame_the_flaky_rank(errors);
}

/// A group of one collective is the lone call: its stream is joined
/// before the call is published, so a failing join is posted as a
/// refusal in its place, and the peers fail at once naming the rank.
#[test]
fn a_stream_join_failing_in_a_group_of_one_fails_its_peers_naming_it() {
    let comms = flaky(3, Inject::Stream, true);
    let errors = on_ranks(&comms, |c| {
        let mut data = vec![1.0f32; 256];
        let mut g = oxccl::Group::new();
        // SAFETY: host memory of this thread, alive until the group ends
        // (the host backend ignores the stream).
        unsafe { g.collective_raw(c, in_place(&mut data), RawStream(7)) }.unwrap();
        g.end().unwrap_err()
    });
    for (r, e) in errors.into_iter().enumerate() {
        if r as u32 == FLAKY {
            assert_eq!(e, injected(FLAKY), "rank {r}");
        } else {
            assert_eq!(e.blamed_rank(), Some(FLAKY), "rank {r}: {e}");
        }
    }
}
