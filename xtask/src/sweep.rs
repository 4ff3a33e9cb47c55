//! `cargo xtask sweep`: the nccl-tests style performance sweep.
//!
//! For every collective, data type, op and size (from `-b` to `-e`, times
//! `-f` each step) it runs `-w` warm-up and `-n` timed iterations on every
//! rank, out of place then in place, and prints nccl-tests' table. Inputs
//! are small integers (`testkit::input`) so results are exact; with `-c 1`
//! one more call per row is checked: its output and a guard past it are
//! poisoned first, the output is compared with the sequential reference,
//! and the send buffer (out of place), the input outside the output (in
//! place) and the guard must be unchanged (`check`); `#wrong` counts both
//! kinds of fault and the sweep exits non-zero if any element is wrong. Reported time: the slowest
//! rank's median call of the `-n` timed iterations, each call a lap of a
//! backend timer (a CUDA event on the rank's stream between calls) started
//! behind one untimed lead-in call, so the skew with which the host barrier
//! releases the ranks is not counted (see `rank_run`). The median rather
//! than the mean: with more rank threads than host cores, one call the
//! host's scheduler held up moved a mean of 5 calls by up to 2.5× (the 2026-12-05 13:53 H100 run of
//! `docs/perf/LOG.md`); a median of laps keeps the calls that ran.
//! `OXCCL_SWEEP_SPREAD=1` prints that rank's min, quartiles and max on
//! stderr, one line per row, so a median can be read against its calls.
//!
//! Buffers are allocated once per data type, at the largest size any
//! collective of the sweep needs, and every row runs on views of them, so
//! no row allocates device memory (an allocation while peers' kernels spin
//! can stall them) and a row costs little beyond its calls. A rank that
//! fails still passes every barrier, and aborts the clique, so the others
//! fail promptly instead of waiting for it.
//!
//! With `--baseline`, the `floor` column is the HBM (or host memory) floor
//! ratio: `(floor bytes / C) / measured time`, where C is the copy
//! bandwidth measured in the same run counting read + write (twice the
//! printed copy ceiling, which counts each copied byte once), and the floor
//! bytes are what every rank must at least read and write in the busiest
//! memory, summed over the M ranks that share it (M = N with all ranks on
//! one GPU), for nccl-tests' size S (the larger buffer per rank):
//!
//! | collective | floor bytes (out of place) | in place |
//! | --- | --- | --- |
//! | AllReduce | 2·M·S (read S, write S) | same |
//! | Broadcast | (M+1)·S (root reads S, each writes S) | M·S (root writes nothing) |
//! | Reduce | (M+1)·S (each reads S, root writes S) | same |
//! | AllGather | M·(S/N + S) (each reads S/N, writes S) | M·S (writes the other N−1 blocks) |
//! | ReduceScatter | M·(S + S/N) (each reads S, writes S/N) | same |
//! | AllToAll | 2·M·S | 2·M·S·(N−1)/N (each rank's own block stays) |
//! | Send/Recv | 2·M·S | same |
//! | Gather, Scatter | 2·S·M/N (the root's S once, the blocks once) | 2·S·M/N·(N−1)/N (the root's own block stays) |
//!
//! Over the network transport (ranks on several hosts, or
//! `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`) the ceiling is one plain TCP
//! stream on rank 0's interface, measured by rank 0 alone in the same run,
//! and `floor` is busbw divided by it. The header also gives each of two
//! such streams run at once: every rank of a ring AllReduce sends and
//! receives at once, so where both directions share the cores (loopback)
//! that is the most its busbw can reach.
//!
//! With `--sm-free` the last column says, out of place / in place,
//! whether a row's calls ran with no SM: `yes` where this process's
//! backend launched no kernel for them and ran them as copy-engine copies
//! (`Communicator::launch_counts`, so a fallback to the kernel reads `no`),
//! `-` where the backend counts no launches (host). `--sm-free-only`
//! forces the copy-engine algorithm (`ce`) for every collective it serves.
//!
//! The modules, by job: `args` (the flags and what they expand to),
//! `launch`, `launcher` and `procs` (where the ranks come from: threads,
//! processes this sweep starts, or one rank of a launcher's, found without
//! `--from-env` too), `pools` (the buffers),
//! `measure` and `rank` (one row on every rank, and one rank's share),
//! `check` (the checked call and the comparison with the reference),
//! `output` (the table, the summary and the JSON report); `pick`,
//! `external` and `plot` serve one flag each.

use std::io::{IsTerminal, Write};

use anyhow::bail;
use oxccl::core::{with_dtype, Collective};
use oxccl::{CollKind, Communicator, DataType, RedOp};

mod args;
mod check;
mod external;
mod launch;
mod launcher;
mod measure;
mod output;
mod pick;
mod pools;
mod procs;
mod rank;

pub(crate) mod plot;
pub(crate) use check::check_sendrecv;
pub use external::Memory;
pub(crate) use procs::Meet;

pub use args::SweepArgs;
pub use output::{floor_bytes, Row};

use args::{count_for, count_for_least, largest_elems, Plan};
use measure::{Case, Measured};
use pools::Pools;

pub fn run(mut a: SweepArgs) -> anyhow::Result<()> {
    let plan = Plan::new(&a)?;
    launch::resolve(&mut a, |k| std::env::var(k).ok())?;
    args::check_ranks(&a, a.procs.is_some() || a.from_env)?;
    if let Some(list) = &a.procs {
        return procs::launch(list);
    }
    args::check_threads(&a)?;
    if a.pick {
        let mut out = std::io::stdout().lock();
        writeln!(out, "# oxccl sweep --pick: machine {}", output::machine())?;
        let (colls, dt, sizes) = (&plan.colls, plan.dtypes[0], &plan.sizes);
        pick::run(&a, colls, dt, sizes, &plan.config, &mut out)?;
        return Ok(());
    }
    let comms = launch::join(&a, plan.config.clone())?;
    let n = comms[0].nranks();
    if n == 0 || a.root >= n {
        bail!("root {} out of range for {n} ranks", a.root);
    }
    // Ranks as processes: rank 0 prints; the others only take part.
    let lead = comms[0].rank() == 0;
    let machine = output::machine();
    let mut out: Box<dyn Write> = if lead {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::io::sink())
    };
    let form = if a.from_env { "processes" } else { "threads" };
    writeln!(
        out,
        "# oxccl sweep: {n} ranks as {form}, backend {}, machine {machine}",
        comms[0].describe_backend()
    )?;
    writeln!(
        out,
        "# -b {} -e {} -f {} -n {} -w {} -c {} (time: slowest rank, median call)",
        a.min_bytes, a.max_bytes, a.factor, a.iters, a.warmup, a.check
    )?;
    // Which observation is on, so figures taken with and without it
    // (NCCL_NVTX_DISABLE=1, --trace) say which they are.
    let trace = match &plan.config.trace {
        Some(t) => format!("trace to {} ({} calls per rank)", t.path.display(), t.calls),
        None => "no trace".into(),
    };
    writeln!(out, "# tools: {}, {trace}", oxccl::observe::tools_summary())?;
    let ceiling = measure::ceiling(&a, &comms[0], lead, &mut out)?;
    let nccl = crate::nccl_cols::Baseline::open(&a.nccl, &comms, &mut out)?;
    let table = Table {
        a: &a,
        plan: &plan,
        comms: &comms,
        n,
        ceiling,
        nccl: &nccl,
        mem_ranks: comms[0].ranks_on_busiest_memory(),
    };
    let mut pools = Pools::default();
    let rows = table.rows(&mut out, &mut pools, lead)?;
    let wrong = output::summary(&mut out, &rows)?;
    pools.release(&comms)?;
    if let Some(path) = a.json.as_ref().filter(|_| lead) {
        let rep = output::Report {
            machine,
            backend: comms[0].backend().name().into(),
            nranks: n,
            copy_gbps: ceiling.gbps,
            nccl: nccl.describe(),
            nccl_latency_us: nccl.latency_us(),
            results: &rows,
        };
        output::write_json(path, &rep)?;
    }
    if let Some(path) = a.svg.as_ref().filter(|_| lead) {
        plot::plot(path, &rows, n)?;
    }
    if wrong > 0 {
        bail!("{wrong} wrong elements");
    }
    Ok(())
}

/// One sweep's table: its flags and axes, its ranks, the ceiling the
/// floor ratio divides by and the NCCL baseline beside it.
struct Table<'a> {
    a: &'a SweepArgs,
    plan: &'a Plan,
    comms: &'a [Communicator],
    n: u32,
    ceiling: measure::Ceiling,
    nccl: &'a crate::nccl_cols::Baseline,
    /// Ranks on the busiest memory (the floor ratio's M).
    mem_ranks: u32,
}

impl Table<'_> {
    /// Every row of the sweep, printed as it is measured (a header before
    /// each collective).
    fn rows(
        &self,
        out: &mut Box<dyn Write>,
        pools: &mut Pools,
        lead: bool,
    ) -> anyhow::Result<Vec<Row>> {
        let (a, n, sizes) = (self.a, self.n, &self.plan.sizes);
        let cases = self.plan.cases();
        let bar = output::progress(
            lead && std::io::stdout().is_terminal(),
            (cases.len() * sizes.len()) as u64,
        );
        let mut rows: Vec<Row> = Vec::new();
        let mut last_kind = None;
        for (kind, dt, op) in cases {
            if last_kind != Some(kind) {
                output::header(out, kind, self.ceiling.gbps.is_some(), self.nccl)?;
                if a.sm_free || a.sm_free_only {
                    writeln!(
                        out,
                        "# last column smfree: out-of-place/in-place calls that launched no kernel (copy engines only)"
                    )?;
                }
                last_kind = Some(kind);
            }
            if sizes
                .iter()
                .all(|&s| count_for(kind, s, dt.size(), n).is_none())
            {
                // nccl-tests prints nothing here either; say why instead.
                let least = count_for_least(kind, dt.size(), n);
                writeln!(
                    out,
                    "# no {kind} {dt} row: -e {} B is less than one element per rank ({least} B on {n} ranks)",
                    a.max_bytes
                )?;
            }
            for &size in sizes {
                bar.inc(1);
                let Some(count) = count_for(kind, size, dt.size(), n) else {
                    continue;
                };
                let root = if kind.has_root() { a.root } else { 0 };
                let coll = Collective::new(kind, count, root);
                for &memory in &a.memory {
                    let pair = self.pair(pools, &coll, (dt, op, size), memory, &bar)?;
                    let copy = self.ceiling.gbps;
                    let mut line =
                        output::format_row(&coll, dt, op, kind.is_reduction(), &pair, copy)
                            + &self.nccl.format(&pair);
                    if a.memory != [Memory::Alloc] {
                        line += &format!("  {:>8}", memory.name());
                    }
                    if a.sm_free || a.sm_free_only {
                        line += &output::sm_free_cell(&pair);
                    }
                    bar.suspend(|| writeln!(out, "{line}"))?;
                    rows.extend(pair);
                }
            }
        }
        bar.finish_and_clear();
        Ok(rows)
    }

    /// One table line's rows: out of place, then in place (Send/Recv has
    /// no in-place form), on `memory`, for nccl-tests' size `size`.
    fn pair(
        &self,
        pools: &mut Pools,
        coll: &Collective,
        (dt, op, size): (DataType, RedOp, usize),
        memory: Memory,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<Vec<Row>> {
        let (a, comms, n, kind) = (self.a, self.comms, self.n, coll.kind);
        let mut pair = Vec::new();
        for in_place in [false, true] {
            if kind == CollKind::SendRecv && in_place {
                continue;
            }
            let counts = || comms.first().and_then(|c| c.launch_counts());
            let before = counts();
            let m = with_dtype!(dt, T => {
                let most = largest_elems(&self.plan.colls, &self.plan.sizes, dt.size(), n);
                let pool = pools.get_for::<T>(comms, most, memory)?;
                let case = Case { coll, op, in_place, a, nccl: self.nccl };
                measure::measure::<T>(comms, pool, case)
            })?;
            if let Some(first) = &m.first_wrong {
                bar.suspend(|| {
                    eprintln!(
                        "# WRONG {kind} {dt} {op} {size}B in_place={in_place} memory={}: {first}",
                        memory.name()
                    )
                });
            }
            // SM-free: the row's calls launched no kernel and ran as
            // copy-engine copies (counted by this process's backend).
            let sm_free = before
                .zip(counts())
                .map(|(b, a)| a.kernels == b.kernels && a.copy_engine_calls > b.copy_engine_calls);
            let mut row = self.row(coll, dt, op, in_place, memory, m);
            row.sm_free = sm_free;
            pair.push(row);
        }
        Ok(pair)
    }

    /// The row `m` measured, with its rates, the selector's choice and
    /// the floor ratio.
    fn row(
        &self,
        coll: &Collective,
        dt: DataType,
        op: RedOp,
        in_place: bool,
        memory: Memory,
        m: Measured,
    ) -> Row {
        let (n, kind) = (self.n, coll.kind);
        let time = m.time.as_secs_f64().max(1e-9);
        let bytes = coll.bytes(n, dt.size());
        let algbw = bytes as f64 / time / 1e9;
        let busbw = algbw * kind.busbw_factor(n);
        // Send/Recv groups do not go through the selector; the last
        // choice would be an earlier collective's.
        let choice = self.comms[0]
            .last_choice()
            .filter(|_| kind != CollKind::SendRecv);
        Row {
            coll: kind.name().into(),
            dtype: dt.name().into(),
            op: op.name().into(),
            bytes,
            count: coll.count,
            algo: choice.map_or("p2p".into(), |c| c.algo.name().into()),
            proto: choice.map_or("simple".into(), |c| c.proto.name().into()),
            channels: choice.map_or(0, |c| c.channels),
            predicted_us: choice.and_then(|c| c.predicted_us),
            time_us: time * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: busbw,
            in_place,
            memory: memory.name().into(),
            wrong: m.wrong,
            floor_ratio: self.ceiling.gbps.map(|c| {
                if self.ceiling.over_net {
                    return busbw / c;
                }
                let fb = floor_bytes(kind, n, self.mem_ranks, bytes as f64, in_place);
                // C counts read + write: twice the copy ceiling.
                fb / (2.0 * c * 1e9) / time
            }),
            nccl: self.nccl.cols(&m.nccl, bytes, kind.busbw_factor(n), busbw),
            sm_free: None,
        }
    }
}
