//! The sweep's `--nccl` columns: NCCL (the machine's `libnccl.so.2`, with
//! `NCCL_NVLS_ENABLE=0`) run on the very buffers oxccl just used, right
//! after oxccl's timed iterations of each row, timed the same way (events
//! between each of `-n` calls after `-w` warm-ups, slowest rank, median
//! call).
//!
//! NCCL needs one GPU per rank. Where it cannot run (several ranks on one
//! GPU, host backend, no library) every row prints `n/a` and the reason is
//! printed once in the header; a row whose NCCL call fails prints `n/a` and
//! the reason on stderr, and the sweep goes on. With `-c 1` NCCL's result
//! is checked like oxccl's (`nccl_wrong`), so a mis-mapped argument cannot
//! pass for a fast baseline.

use std::cell::Cell;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use oxccl::core::{testkit, Collective};
use oxccl::{BackendKind, CollKind, Communicator, Element, RedOp, Slice};
use oxccl_bench::nccl::{self, Nccl, NcclCall, NcclWhy};
use serde::Serialize;

/// The sweep's `--nccl` flag.
#[derive(Debug, clap::Args)]
pub struct NcclArgs {
    /// Also run NCCL (system libnccl.so.2, or OXCCL_NCCL_LIB) on the same
    /// buffers: NCCL time, busbw and oxccl/NCCL busbw ratio columns, a
    /// second SVG curve, JSON fields; one rank per GPU only.
    #[arg(long)]
    pub nccl: bool,
}

/// NCCL's figures for one row (JSON fields; absent without `--nccl`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct NcclCols {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_time_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_busbw_gbps: Option<f64>,
    /// oxccl busbw / NCCL busbw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_wrong: Option<u64>,
}

/// What one row measured of NCCL.
#[derive(Debug, Default)]
pub struct RowMeasure {
    time: Option<Duration>,
    wrong: Option<u64>,
}

#[derive(Debug)]
enum State {
    Off,
    /// Asked for, but it cannot run here: the reason.
    NotHere(String),
    On(Nccl),
}

/// NCCL for the whole sweep.
#[derive(Debug)]
pub struct Baseline {
    state: State,
    deadline: Duration,
    latency: Option<nccl::Latency>,
    /// Set once a failure aborted the communicators: later rows are n/a.
    dead: Mutex<Option<String>>,
}

fn devices_of(comms: &[Communicator]) -> anyhow::Result<Vec<i32>> {
    comms
        .iter()
        .map(|c| {
            let probe = c.alloc::<u8>(1)?;
            Ok(nccl::device_of(probe.full().addr())?)
        })
        .collect()
}

impl Baseline {
    /// Opens NCCL for `comms` when `--nccl` was given, printing its version
    /// and 8 B AllReduce latency (or why it is n/a) as header lines.
    /// Refuses (an error) only what the user must change: a
    /// `NCCL_NVLS_ENABLE` other than 0.
    pub fn open(
        args: &NcclArgs,
        comms: &[Communicator],
        out: &mut impl Write,
    ) -> anyhow::Result<Baseline> {
        let deadline = comms
            .first()
            .map_or(Duration::from_secs(60), |c| c.config().deadline);
        let mut b = Baseline {
            state: State::Off,
            deadline,
            latency: None,
            dead: Mutex::new(None),
        };
        if !args.nccl {
            return Ok(b);
        }
        // Refused wherever it would run: the user must change it.
        nccl::nvls_check(std::env::var_os(nccl::NVLS_ENV).as_deref())?;
        b.state = if comms.first().map(|c| c.backend()) != Some(BackendKind::Cuda) {
            State::NotHere("NCCL runs on the CUDA backend only".into())
        } else {
            let devices = devices_of(comms)?;
            match Nccl::new(&devices, deadline) {
                Ok(n) => State::On(n),
                Err(e) if nccl::why(&e) == Some(NcclWhy::Nvls) => return Err(e.into()),
                Err(e) => State::NotHere(e.to_string()),
            }
        };
        match &b.state {
            State::On(n) => {
                writeln!(
                    out,
                    "# NCCL {} on the same buffers, {} ranks on {} GPUs, NCCL_NVLS_ENABLE=0",
                    n.version(),
                    n.nranks(),
                    n.nranks()
                )?;
                match n.allreduce_latency() {
                    Ok(l) => {
                        writeln!(
                            out,
                            "# NCCL 8 B float allreduce latency: eager {:.2} us/call, graph {:.2} us/call",
                            l.eager_us, l.graph_us
                        )?;
                        b.latency = Some(l);
                    }
                    Err(e) => writeln!(out, "# NCCL latency: n/a ({e})")?,
                }
            }
            State::NotHere(why) => writeln!(out, "# NCCL columns: n/a ({why})")?,
            State::Off => {}
        }
        Ok(b)
    }

    fn shown(&self) -> bool {
        !matches!(self.state, State::Off)
    }

    /// For the JSON report: NCCL's version or why it is n/a.
    pub fn describe(&self) -> Option<String> {
        match &self.state {
            State::Off => None,
            State::NotHere(why) => Some(format!("n/a: {why}")),
            State::On(n) => Some(format!("NCCL {}", n.version())),
        }
    }

    /// For the JSON report: NCCL's 8 B AllReduce latency (eager, graph) in µs.
    pub fn latency_us(&self) -> Option<(f64, f64)> {
        self.latency.map(|l| (l.eager_us, l.graph_us))
    }

    /// Header text appended to the sweep's column lines 1..=3.
    pub fn head(&self, line: usize) -> String {
        if !self.shown() {
            return String::new();
        }
        let one = match line {
            1 => format!("{:>26}", "nccl"),
            2 => format!("  {:>9} {:>7} {:>7}", "time", "busbw", "ox/nc"),
            _ => format!("  {:>9} {:>7} {:>7}", "(us)", "(GB/s)", ""),
        };
        if line == 1 {
            format!("  {one} (out-of-place, in-place)")
        } else {
            format!("{one}{one}")
        }
    }

    /// NCCL's columns for a printed row (out of place, then in place).
    pub fn format(&self, pair: &[super::sweep::Row]) -> String {
        if !self.shown() {
            return String::new();
        }
        let mut s = String::new();
        for r in pair {
            let c = &r.nccl;
            match (c.nccl_time_us, c.nccl_busbw_gbps, c.nccl_ratio) {
                (Some(t), Some(bw), Some(x)) => s += &format!("  {t:>9.2} {bw:>7.2} {x:>7.3}"),
                _ => s += &format!("  {:>9} {:>7} {:>7}", "n/a", "n/a", "n/a"),
            }
        }
        s
    }

    /// The JSON fields of one row, from what `measure` got and oxccl's busbw.
    pub fn cols(&self, m: &RowMeasure, bytes: usize, factor: f64, oxccl_busbw: f64) -> NcclCols {
        let Some(t) = m.time else {
            return NcclCols::default();
        };
        let algbw = bytes as f64 / t.as_secs_f64().max(1e-12) / 1e9;
        let busbw = algbw * factor;
        NcclCols {
            nccl_time_us: Some(t.as_secs_f64() * 1e6),
            nccl_busbw_gbps: Some(busbw),
            nccl_ratio: Some(oxccl_busbw / busbw.max(1e-12)),
            nccl_wrong: m.wrong,
        }
    }

    /// A row's NCCL run on every rank's thread (see [`RowRun::rank`]).
    pub fn row<'a, T: Element>(
        &'a self,
        coll: &'a Collective,
        op: RedOp,
        nranks: u32,
        warmup: u32,
        iters: u32,
        check: bool,
    ) -> RowRun<'a, T> {
        RowRun {
            base: self,
            coll,
            op,
            warmup,
            iters,
            check,
            out: Mutex::new((0..nranks).map(|_| None).collect()),
        }
    }

    fn fail(&self, why: String) {
        let mut d = self.dead.lock().unwrap_or_else(|p| p.into_inner());
        if d.is_none() {
            eprintln!("# NCCL n/a from here on: {why}");
            *d = Some(why);
        }
    }
}

type RankResult<T> = Option<Result<(Duration, Vec<T>), String>>;

/// One row's NCCL run, shared by the rank threads.
#[derive(Debug)]
pub struct RowRun<'a, T> {
    base: &'a Baseline,
    coll: &'a Collective,
    op: RedOp,
    warmup: u32,
    iters: u32,
    check: bool,
    out: Mutex<Vec<RankResult<T>>>,
}

impl<T: Element> RowRun<'_, T> {
    fn nccl(&self) -> Option<&Nccl> {
        match &self.base.state {
            State::On(n) if self.base.dead.lock().map_or(true, |d| d.is_none()) => Some(n),
            _ => None,
        }
    }

    /// Rank `c`'s NCCL run on `send`/`recv` (the row's views), after
    /// oxccl's timed calls; `ok`: whether this rank's oxccl phases
    /// succeeded. Passes `barrier` exactly once whenever NCCL is on,
    /// failed or not, like the sweep's own phases.
    pub fn rank(
        &self,
        c: &Communicator,
        send: Slice<'_, T>,
        recv: Slice<'_, T>,
        input: &[T],
        barrier: &dyn crate::sweep::Meet,
        ok: bool,
    ) {
        let Some(n) = self.nccl() else { return };
        let passed = Cell::new(false);
        let ready = || {
            barrier.meet();
            passed.set(true);
        };
        let r = if ok {
            self.run(n, c, send, recv, input, ready)
        } else {
            Err("oxccl failed on this rank".into())
        };
        if !passed.get() {
            barrier.meet();
        }
        if let Err(e) = &r {
            if ok {
                n.abort_all();
                self.base.fail(format!("rank {}: {e}", c.rank()));
            }
        }
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = out.get_mut(c.rank() as usize) {
            *slot = Some(r);
        }
    }

    fn run(
        &self,
        n: &Nccl,
        c: &Communicator,
        send: Slice<'_, T>,
        recv: Slice<'_, T>,
        input: &[T],
        ready: impl FnOnce(),
    ) -> Result<(Duration, Vec<T>), String> {
        let s = |e: &dyn std::fmt::Display| e.to_string();
        let rk = n.rank(c.rank()).map_err(|e| s(&e))?;
        let call = NcclCall {
            kind: self.coll.kind,
            count: self.coll.count,
            dtype: T::DTYPE,
            op: self.op,
            root: self.coll.root,
        };
        let dl = self.base.deadline;
        // oxccl's calls on these buffers are done before NCCL's start.
        c.synchronize().map_err(|e| s(&e))?;
        // SAFETY: `send` and `recv` are this rank's views of the row's
        // lengths (or NCCL's in-place layout), on its GPU, alive for this
        // function; `time` and `wait` return after NCCL's work finished.
        let t = unsafe {
            rk.time(
                &call,
                send.addr(),
                recv.addr(),
                self.warmup,
                self.iters,
                dl,
                ready,
            )
        }
        .map_err(|e| s(&e))?;
        let mut got = Vec::new();
        if self.check {
            send.copy_from_slice(input).map_err(|e| s(&e))?;
            // SAFETY: as above.
            unsafe { rk.enqueue(&call, send.addr(), recv.addr()) }.map_err(|e| s(&e))?;
            rk.wait(dl).map_err(|e| s(&e))?;
            got = recv.to_vec().map_err(|e| s(&e))?;
        }
        Ok((t, got))
    }

    /// The row's NCCL figures: slowest rank's time, and with `-c` the
    /// check of every rank's output against `inputs`.
    pub fn finish(self, inputs: &[Vec<T>]) -> RowMeasure {
        let out = self.out.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut time = Duration::ZERO;
        let mut outputs = Vec::new();
        for r in out {
            match r {
                Some(Ok((t, o))) => {
                    time = time.max(t);
                    outputs.push(o);
                }
                _ => return RowMeasure::default(),
            }
        }
        let wrong = self.check.then(|| {
            let (w, first) = if self.coll.kind == CollKind::SendRecv {
                super::sweep::check_sendrecv(inputs, &outputs)
            } else {
                testkit::compare(self.coll, inputs, &outputs, self.op)
            };
            if let Some(f) = first {
                eprintln!("# NCCL WRONG {} {}: {f}", self.coll.kind, T::DTYPE);
            }
            w
        });
        RowMeasure {
            time: Some(time),
            wrong,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Row;

    fn base(state: State) -> Baseline {
        Baseline {
            state,
            deadline: Duration::from_secs(1),
            latency: None,
            dead: Mutex::new(None),
        }
    }

    fn row(busbw: f64, nccl: NcclCols) -> Row {
        Row {
            coll: "allreduce".into(),
            dtype: "float".into(),
            op: "sum".into(),
            bytes: 1 << 20,
            count: 1 << 18,
            algo: "ring".into(),
            proto: "simple".into(),
            channels: 1,
            predicted_us: None,
            time_us: 1.0,
            algbw_gbps: busbw,
            busbw_gbps: busbw,
            in_place: false,
            memory: "alloc".into(),
            wrong: 0,
            floor_ratio: None,
            sm_free: None,
            nccl,
        }
    }

    #[test]
    fn columns_give_nccl_busbw_and_the_oxccl_over_nccl_ratio() {
        let b = base(State::NotHere("test".into()));
        let m = RowMeasure {
            time: Some(Duration::from_millis(1)),
            wrong: Some(0),
        };
        // 2e6 bytes in 1 ms: 2 GB/s algbw, busbw ×1.5 = 3 GB/s; oxccl at 6.
        let c = b.cols(&m, 2_000_000, 1.5, 6.0);
        assert!((c.nccl_busbw_gbps.unwrap() - 3.0).abs() < 1e-9);
        assert!((c.nccl_ratio.unwrap() - 2.0).abs() < 1e-9);
        assert!((c.nccl_time_us.unwrap() - 1000.0).abs() < 1e-6);
        assert_eq!(c.nccl_wrong, Some(0));
        // No NCCL time: no fields, and the row prints n/a.
        let none = b.cols(&RowMeasure::default(), 2_000_000, 1.5, 6.0);
        assert!(none.nccl_time_us.is_none() && none.nccl_ratio.is_none());
        let line = b.format(&[row(6.0, none)]);
        assert_eq!(line.matches("n/a").count(), 3, "{line}");
        let shown = b.format(&[row(6.0, c)]);
        assert!(shown.contains("2.000") && !shown.contains("n/a"), "{shown}");
    }

    #[test]
    fn without_the_flag_nothing_is_added() {
        let b = base(State::Off);
        assert_eq!(b.head(1), "");
        assert_eq!(b.format(&[row(1.0, NcclCols::default())]), "");
        assert_eq!(b.describe(), None);
        let json = serde_json::to_string(&row(1.0, NcclCols::default())).unwrap();
        assert!(!json.contains("nccl"), "{json}");
        let na = base(State::NotHere(
            "NCCL refuses several ranks on one GPU".into(),
        ));
        assert_eq!(
            na.describe().as_deref(),
            Some("n/a: NCCL refuses several ranks on one GPU")
        );
        assert!(na.head(2).contains("ox/nc"));
    }

    #[test]
    fn the_svg_gets_a_second_curve_for_nccl() {
        let b = base(State::NotHere("test".into()));
        let m = RowMeasure {
            time: Some(Duration::from_micros(100)),
            wrong: None,
        };
        let rows: Vec<Row> = (0..3)
            .map(|i| {
                let mut r = row(10.0 + f64::from(i), b.cols(&m, 1 << 20, 2.0, 10.0));
                r.bytes = 1 << (10 + 2 * i);
                r
            })
            .collect();
        let path = std::env::temp_dir().join(format!("oxccl-nccl-{}.svg", std::process::id()));
        crate::sweep::plot::plot(&path, &rows, 2).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains("allreduce (NCCL)"), "no NCCL curve");
    }

    #[test]
    fn shared_gpus_are_n_a_not_an_error() {
        // What `open` does with the placement of 2 ranks on one GPU.
        let e = Nccl::new(&[0, 0], Duration::from_secs(1)).unwrap_err();
        assert_eq!(nccl::why(&e), Some(NcclWhy::SharedGpu));
        assert!(e.to_string().contains("one GPU"), "{e}");
    }
}
