//! One row's measurement on every rank: warm-up, timed calls and the
//! checked call (see [`rank::rank_run`] for one rank's share), the slowest
//! rank's median time, and the check's verdict over all ranks.

use std::sync::Barrier;
use std::time::Duration;

use std::io::Write;

use anyhow::Context;
use oxccl::core::testkit;
use oxccl::core::Collective;
use oxccl::{CollKind, Communicator, Element, RedOp};

use super::args::SweepArgs;
use super::pools::{Pool, RankBufs};
use super::{check, procs, rank};

/// One measurement: what runs (collective, op, layout), under which flags,
/// with which NCCL baseline beside it.
#[derive(Clone, Copy)]
pub(crate) struct Case<'a> {
    pub(crate) coll: &'a Collective,
    pub(crate) op: RedOp,
    pub(crate) in_place: bool,
    pub(crate) a: &'a SweepArgs,
    pub(crate) nccl: &'a crate::nccl_cols::Baseline,
}

/// What one configuration measured.
pub(crate) struct Measured {
    pub(crate) time: Duration,
    pub(crate) wrong: u64,
    pub(crate) first_wrong: Option<String>,
    pub(crate) nccl: crate::nccl_cols::RowMeasure,
}

/// Runs warm-up, timed iterations and (with `-c`) a checked call on every
/// rank, on views of `pool`; returns the slowest rank's mean time per call
/// and the check: wrong output elements plus elements changed outside the
/// outputs (see `check`).
pub(crate) fn measure<T: Element>(
    comms: &[Communicator],
    pool: &mut Pool<T>,
    case: Case<'_>,
) -> anyhow::Result<Measured> {
    measure_with(comms, pool, case, &check::run_collective::<T>)
}

/// [`measure`] with every call made by `run` (tests pass faulty ones).
pub(crate) fn measure_with<T: Element>(
    comms: &[Communicator],
    pool: &mut Pool<T>,
    case: Case<'_>,
    run: &check::Runner<T>,
) -> anyhow::Result<Measured> {
    if case.a.from_env {
        return procs::measure_rank(&comms[0], pool, case, run);
    }
    let (coll, op, a, nccl) = (case.coll, case.op, case.a, case.nccl);
    let n = comms.len() as u32;
    let barrier = Barrier::new(comms.len());
    let nrow = nccl.row::<T>(coll, op, n, a.warmup, a.iters, a.check != 0);
    type RankOut<T> = (anyhow::Result<rank::RankDone<T>>, Vec<T>, RankBufs<T>);
    let results: Vec<anyhow::Result<RankOut<T>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(pool.iter_mut())
            .map(|(c, slot)| {
                let bufs = slot.take();
                let (barrier, nrow) = (&barrier, &nrow);
                s.spawn(move || {
                    let bufs = bufs.context("sweep buffers missing")?;
                    // Inputs are made on the rank threads, in parallel.
                    let input = testkit::input::<T>(coll, n, c.rank(), op, 1);
                    let r = rank::rank_run(c, &bufs, case, &input, barrier, nrow, run);
                    Ok((r, input, bufs))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("rank thread panicked")))
            })
            .collect()
    });
    let mut time = Duration::ZERO;
    let mut slowest = Vec::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut outside = (0, None);
    let mut errs: Vec<anyhow::Error> = Vec::new();
    for (slot, r) in pool.iter_mut().zip(results) {
        match r {
            Ok((res, input, bufs)) => {
                *slot = Some(bufs);
                inputs.push(input);
                match res {
                    Ok(done) => {
                        if done.time >= time {
                            slowest = done.laps;
                        }
                        time = time.max(done.time);
                        outputs.push(done.out);
                        outside.0 += done.outside.0;
                        outside.1 = outside.1.or(done.outside.1);
                    }
                    Err(e) => errs.push(e),
                }
            }
            Err(e) => errs.push(e),
        }
    }
    if let Some(e) = root_cause(errs) {
        return Err(e);
    }
    print_spread(coll, case.in_place, &slowest);
    let (wrong, first_wrong) = if a.check == 0 {
        (0, None)
    } else if coll.kind == CollKind::SendRecv {
        check::check_sendrecv(&inputs, &outputs)
    } else {
        check::compare_parallel(coll, &inputs, &outputs, op)
    };
    let (wrong, first_wrong) = (wrong + outside.0, first_wrong.or(outside.1));
    Ok(Measured {
        time,
        wrong,
        first_wrong,
        nccl: nrow.finish(&inputs),
    })
}

/// With `OXCCL_SWEEP_SPREAD` set, the slowest rank's calls (sorted) on
/// stderr: min, quartiles, max, so a row's median can be read against the
/// calls it came from (stdout keeps nccl-tests' format).
pub(crate) fn print_spread(coll: &Collective, in_place: bool, sorted: &[Duration]) {
    if std::env::var_os("OXCCL_SWEEP_SPREAD").is_none() || sorted.is_empty() {
        return;
    }
    let at = |q: usize| sorted[(sorted.len() - 1) * q / 4].as_secs_f64() * 1e6;
    eprintln!(
        "# spread {} count {}{}: slowest rank's {} calls (µs): min {:.2} q1 {:.2} median {:.2} q3 {:.2} max {:.2}",
        coll.kind,
        coll.count,
        if in_place { " in place" } else { "" },
        sorted.len(),
        at(0),
        at(1),
        median_lap(sorted).as_secs_f64() * 1e6,
        at(3),
        at(4)
    );
}

/// The median of one rank's laps (the upper middle one of an even count).
pub(crate) fn median_lap(laps: &[Duration]) -> Duration {
    let mut v = laps.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The error that explains a failed row: one rank's own failure rather
/// than the aborts it caused on the others (a failed rank aborts the
/// clique, so every peer reports `Aborted`/`Failed`, rank 0 usually first).
pub(crate) fn root_cause(errs: Vec<anyhow::Error>) -> Option<anyhow::Error> {
    let consequence = |e: &anyhow::Error| {
        matches!(
            e.downcast_ref::<oxccl::Error>(),
            Some(oxccl::Error::Aborted(_) | oxccl::Error::Failed { .. })
        ) || e
            .downcast_ref::<oxccl::Error>()
            .and_then(oxccl::Error::wait_fault)
            .is_some_and(|f| f.cause != oxccl_core::FaultCause::Deadline)
    };
    let i = errs.iter().position(|e| !consequence(e)).unwrap_or(0);
    errs.into_iter().nth(i)
}

/// The ceiling the `floor` column divides by (with `--baseline`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ceiling {
    /// GB/s: the backend's copy, or over the network one TCP stream;
    /// NaN on ranks other than 0 (they print nothing); `None` without
    /// `--baseline`.
    pub gbps: Option<f64>,
    /// Whether `gbps` is a TCP stream's (then `floor` is busbw over it).
    pub over_net: bool,
}

/// Measures the ceiling and prints it in the header. Over the network the
/// ceiling is one TCP stream instead, and `floor` is busbw over it. Rank 0
/// alone measures (the others print nothing and wait in the first call),
/// so nothing competes with it.
pub(crate) fn ceiling(
    a: &SweepArgs,
    c: &Communicator,
    lead: bool,
    out: &mut dyn Write,
) -> anyhow::Result<Ceiling> {
    let mut over_net = false;
    let gbps = if !a.baseline {
        None
    } else if !lead {
        Some(f64::NAN)
    } else {
        let bytes = a.max_bytes.max(1 << 20);
        if let Some(bw) = c.stream_bandwidth(bytes).transpose()? {
            over_net = true;
            writeln!(
                out,
                "# network ceiling: {bw:.2} GB/s (one TCP stream of {bytes} bytes on rank 0's interface, same run); floor = busbw / ceiling"
            )?;
            if let Some(two) = c.duplex_bandwidth(bytes).transpose()? {
                writeln!(
                    out,
                    "# two streams at once: {two:.2} GB/s each ({:.1}% of one stream; a 2-rank ring AllReduce sends and receives at once, so where both share the cores this bounds its busbw)",
                    100.0 * two / bw
                )?;
            }
            Some(bw)
        } else {
            let bw = c.copy_bandwidth(bytes)?;
            writeln!(
                out,
                "# copy ceiling: {bw:.2} GB/s (backend copy of {bytes} bytes, same run)"
            )?;
            Some(bw)
        }
    };
    Ok(Ceiling { gbps, over_net })
}

#[cfg(test)]
mod tests {
    use oxccl::{BackendKind, Config};

    use super::super::check::{run_collective, RankView, Runner};
    use super::super::pools::Pools;
    use super::*;

    /// One row of `kind` (1000 elements of f32, Sum, root 1) on 3 host
    /// ranks, every call made by `run`, checked: (wrong, first). The real
    /// collective runs the same row on the same buffers first (and must
    /// pass), so a faulty call finds the right result already there, as it
    /// does in a sweep that repeats rows.
    fn row(kind: CollKind, in_place: bool, run: &Runner<f32>) -> (u64, Option<String>) {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: SweepArgs,
        }
        let a = <Cli as clap::Parser>::parse_from(["sweep", "-n", "1", "-w", "1"]).a;
        let config = Config {
            backend: BackendKind::Host,
            ..Config::default()
        };
        let comms = oxccl::init_all_with(3, config).unwrap();
        let nccl = crate::nccl_cols::Baseline::open(&a.nccl, &comms, &mut Vec::new()).unwrap();
        let coll = Collective::new(kind, 1000, 1);
        let mut pools = Pools::default();
        let pool = pools.get::<f32>(&comms, 3000).unwrap();
        let mut go = |run: &Runner<f32>| {
            let case = Case {
                coll: &coll,
                op: RedOp::Sum,
                in_place,
                a: &a,
                nccl: &nccl,
            };
            measure_with::<f32>(&comms, pool, case, run).unwrap()
        };
        let real = go(&run_collective::<f32>);
        assert_eq!(real.wrong, 0, "{kind}: {:?}", real.first_wrong);
        let m = go(run);
        (m.wrong, m.first_wrong)
    }

    /// Every collective, Send/Recv included.
    const KINDS: [CollKind; 9] = CollKind::ALL;

    fn in_place_forms(kind: CollKind) -> &'static [bool] {
        if kind == CollKind::SendRecv {
            &[false]
        } else {
            &[false, true]
        }
    }

    /// The real collective passes the check, so what follows tests faults,
    /// not the check's own noise.
    #[test]
    fn the_real_collectives_pass_the_check() {
        for kind in KINDS {
            for &in_place in in_place_forms(kind) {
                let (wrong, first) = row(kind, in_place, &run_collective::<f32>);
                assert_eq!(wrong, 0, "{kind} in_place={in_place}: {first:?}");
            }
        }
    }

    /// A collective that does nothing leaves poisoned (or, in place,
    /// unreduced) outputs: reported wrong, in place or not.
    #[test]
    fn a_collective_that_does_nothing_is_reported_wrong() {
        for kind in KINDS {
            for &in_place in in_place_forms(kind) {
                let (wrong, first) = row(kind, in_place, &|_, _, _, _| Ok(()));
                assert!(wrong > 0, "{kind} in_place={in_place}: a no-op passed");
                assert!(first.is_some());
            }
        }
    }

    /// Right outputs, then one element written just past the output on
    /// every rank: reported, naming the guard.
    #[test]
    fn a_collective_that_writes_past_its_output_is_reported_wrong() {
        let past = |c: &Communicator, coll: &Collective, v: &RankView<'_, f32>, op| {
            run_collective(c, coll, v, op)?;
            let end = v.out_at + v.recv.len();
            v.out_buf.slice(end..end + 1).copy_from_slice(&[7.0])
        };
        for kind in KINDS {
            for &in_place in in_place_forms(kind) {
                let (wrong, first) = row(kind, in_place, &past);
                assert_eq!(wrong, 3, "{kind} in_place={in_place}: one per rank");
                let first = first.unwrap();
                assert!(first.contains("past the output"), "{first}");
                assert!(first.contains("element 0"), "{first}");
            }
        }
    }

    /// Right outputs, then the send buffer of an out-of-place call zeroed:
    /// reported, naming the send buffer.
    #[test]
    fn a_collective_that_clobbers_its_send_buffer_is_reported_wrong() {
        let clobber = |c: &Communicator, coll: &Collective, v: &RankView<'_, f32>, op| {
            run_collective(c, coll, v, op)?;
            v.send.copy_from_slice(&vec![0.0; v.send.len()])
        };
        for kind in KINDS {
            let (wrong, first) = row(kind, false, &clobber);
            assert!(wrong > 0, "{kind}: a clobbered send buffer passed");
            let first = first.unwrap();
            assert!(first.contains("send buffer"), "{kind}: {first}");
        }
    }

    #[test]
    fn a_failed_row_reports_the_rank_that_failed_not_the_aborts() {
        let aborted =
            || anyhow::Error::from(oxccl::Error::Aborted("rank 0: another rank failed".into()));
        let fault = |cause| oxccl_core::WaitFault {
            cause,
            rank: 5,
            peer: 2,
            channel: 0,
            step: 1,
            awaited: oxccl_core::Awaited::Signal,
            waited: std::time::Duration::from_secs(1),
            absent: Vec::new(),
        };
        let stopped = || {
            let mut f = fault(oxccl_core::FaultCause::PeerFailed);
            f.rank = 3;
            anyhow::Error::from(oxccl::Error::Wait(f))
        };
        let cause =
            anyhow::Error::from(oxccl::Error::Wait(fault(oxccl_core::FaultCause::Deadline)));
        let got = root_cause(vec![aborted(), stopped(), cause, aborted()]).unwrap();
        assert!(got.to_string().contains("rank 5"), "{got}");
        // Only consequences: the first of them.
        let got = root_cause(vec![aborted(), aborted()]).unwrap();
        assert!(got.to_string().contains("aborted"), "{got}");
        assert!(root_cause(Vec::new()).is_none());
    }

    #[test]
    fn one_stalled_call_does_not_move_the_reported_time() {
        let us = Duration::from_micros;
        assert_eq!(
            median_lap(&[us(100), us(250), us(101), us(99), us(102)]),
            us(101)
        );
        assert_eq!(median_lap(&[us(7)]), us(7));
        assert_eq!(median_lap(&[]), Duration::ZERO);
    }
}
