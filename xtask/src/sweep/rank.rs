//! One rank's share of a row: input upload, warm-up, the timed calls
//! behind an untimed lead-in, and the checked call, each phase behind a
//! barrier every rank reaches, failed or not.

use std::time::Duration;

use oxccl::{Communicator, Element};

use super::check;
use super::measure::Case;
use super::pools::RankBufs;
use super::procs::Meet;

/// What one rank's share of a row gave.
pub(crate) struct RankDone<T> {
    /// Median time of one of the `-n` timed calls.
    pub(crate) time: Duration,
    /// Every timed call, sorted (for `OXCCL_SWEEP_SPREAD`).
    pub(crate) laps: Vec<Duration>,
    /// The checked call's output (empty without `-c`).
    pub(crate) out: Vec<T>,
    /// Elements the checked call changed outside the output, and the first.
    pub(crate) outside: (u64, Option<String>),
}

/// One rank's share of [`measure`](super::measure::measure). Every rank reaches every barrier,
/// failed or not (a failed rank aborts the clique first, so peers'
/// pending calls fail promptly), and the first error is returned.
#[allow(clippy::too_many_arguments)] // reason: one rank's view of `measure`'s arguments; a struct would only rename them
pub(crate) fn rank_run<T: Element>(
    c: &Communicator,
    bufs: &RankBufs<T>,
    case: Case<'_>,
    input: &[T],
    barrier: &dyn Meet,
    nccl: &crate::nccl_cols::RowRun<'_, T>,
    run: &check::Runner<T>,
) -> anyhow::Result<RankDone<T>> {
    let (coll, op, in_place, a) = (case.coll, case.op, case.in_place, case.a);
    let n = c.nranks();
    let (ilen, olen) = (coll.input_len(n), coll.output_len(n));
    let (in_off, out_off) = if in_place {
        coll.in_place_offsets(c.rank())
    } else {
        (0, 0)
    };
    let (main, other) = (&bufs.main, &bufs.other);
    let mirror = bufs.mirror.as_ref().filter(|_| bufs.external);
    let view = check::RankView {
        mirror,
        send: main.slice(in_off..in_off + ilen),
        recv: if in_place {
            main.slice(out_off..out_off + olen)
        } else {
            other.slice(..olen)
        },
        out_buf: if in_place { main } else { other },
        out_at: out_off,
    };
    let (send, recv) = (view.send, view.recv);
    let call = || run(c, coll, &view, op);
    // Runs one phase unless an earlier one failed; a failure aborts the
    // clique so no peer waits for this rank until its deadline.
    let phase = |ok: &mut anyhow::Result<()>, f: &mut dyn FnMut() -> oxccl::Result<()>| {
        if ok.is_ok() {
            if let Err(e) = f() {
                c.abort();
                *ok = Err(e.into());
            }
        }
    };
    let mut ok: anyhow::Result<()> = Ok(());
    // Everything that may allocate (the timer's events, the input's
    // upload) is done before the barrier that lets any rank launch: a
    // rank allocating while a peer's kernel spins waiting for it can be
    // held up behind that kernel until the peer's deadline.
    let mut timer = None;
    phase(&mut ok, &mut || {
        send.copy_from_slice(input)?;
        if let Some(m) = mirror {
            m.push(c)?;
        }
        let mut t = c.timer()?;
        t.reserve(a.iters as usize)?;
        timer = Some(t);
        Ok(())
    });
    barrier.meet();
    phase(&mut ok, &mut || {
        for _ in 0..a.warmup {
            call()?;
        }
        c.synchronize()?;
        mirror.map_or(Ok(()), |m| m.synchronize())
    });
    barrier.meet();
    let mut t = Duration::ZERO;
    let mut laps = Vec::new();
    phase(&mut ok, &mut || {
        let Some(timer) = timer.as_mut() else {
            return Ok(());
        };
        // The lead-in: the host barrier releases the ranks some µs apart
        // and a collective cannot finish before its last rank joins, so a
        // timer started at once on an early rank counts the others'
        // lateness, divided by only -n calls. Started behind this untimed
        // call, each rank's timer starts when the call has released it (on
        // its stream, for CUDA): together wherever each rank waits for the
        // others. On the H200 (8 ranks, 8 B AllReduce, -n 5) `call_latency`
        // measured 24-26 µs per call timed at once and 21 µs behind a
        // lead-in; the sweep itself still reads 70-110 µs at -n 5 and 32-37
        // µs at -n 1000 against 15-18 µs in `call_latency`: the rest of
        // that gap is something else, not yet found.
        call()?;
        timer.start()?;
        for i in 0..a.iters {
            if i > 0 {
                timer.lap()?;
            }
            call()?;
        }
        timer.stop()?;
        laps = timer.laps().to_vec();
        laps.sort_unstable();
        t = super::measure::median_lap(&laps);
        Ok(())
    });
    nccl.rank(c, send, recv, input, barrier, ok.is_ok());
    let mut out = Vec::new();
    let mut outside = (0, None);
    if a.check != 0 {
        // Poison the output and the guard past it, restore the input (the
        // in-place iterations overwrote it), note everything outside the
        // output, then run once more.
        let watched = check::watched(&view, in_place);
        let before = check::prepared(&view, input, in_place);
        phase(&mut ok, &mut || {
            check::prepare(&view, input, in_place)?;
            mirror.map_or(Ok(()), |m| m.push(c))
        });
        barrier.meet();
        phase(&mut ok, &mut || {
            call()?;
            c.synchronize()?;
            if let Some(m) = mirror {
                m.pull()?;
            }
            out = recv.to_vec()?;
            let after = check::snapshot(&watched)?;
            outside = check::changed(c.rank(), &watched, &before, &after);
            Ok(())
        });
    }
    ok.map(|()| RankDone {
        time: t,
        laps,
        out,
        outside,
    })
}
