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
//! host's scheduler held up moved a mean of 5 calls by up to 2.5× (run U of
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
//! | AllToAll, Send/Recv | 2·M·S | same |
//! | Gather, Scatter | 2·S·M/N (the root's S once, the blocks once) | same |
//!
//! Over the network transport (ranks on several hosts, or
//! `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`) the ceiling is one plain TCP
//! stream on rank 0's interface, measured by rank 0 alone in the same run,
//! and `floor` is busbw divided by it. The header also gives each of two
//! such streams run at once: every rank of a ring AllReduce sends and
//! receives at once, so where both directions share the cores (loopback)
//! that is the most its busbw can reach.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Duration;

use anyhow::{bail, Context};
pub use oxccl::config::parse_size;
use oxccl::core::testkit;
use oxccl::core::{with_dtype, Collective};
use oxccl::{BackendKind, Buffer, CollKind, Communicator, Config, DataType, Element, RedOp};
use serde::Serialize;

mod check;
mod external;
mod pick;
pub use external::Memory;
mod procs;
pub(crate) use procs::Meet;
pub(crate) mod plot;

/// Flags follow nccl-tests' letters.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "256K", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this factor each step.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 5)]
    iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    warmup: u32,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// Reduction op: sum, prod, max, min, avg, premulsum or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Data type (nccl-tests names: float, half, int32, ...) or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Root rank for rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: u32,
    /// Collective name, comma list, or all.
    #[arg(long, default_value = "all")]
    coll: String,
    /// Number of ranks (as threads of this process).
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Ranks as processes instead: launch N processes of one rank each
    /// (a comma list runs one sweep per N); rank 0 prints the table.
    #[arg(long)]
    procs: Option<String>,
    /// Be one rank of a sweep whose processes a launcher started
    /// (torchrun, mpirun, Slurm, or `--procs`): rank and rank count from
    /// their environment variables; rank 0 prints.
    #[arg(long)]
    from_env: bool,
    /// host, cuda or auto (CUDA when present, else host).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Algorithm filter, NCCL_ALGO syntax (e.g. `ring`, `^ring`, `allreduce:tree`).
    #[arg(long)]
    algo: Option<String>,
    /// Protocol filter, NCCL_PROTO syntax.
    #[arg(long)]
    proto: Option<String>,
    /// Channel count.
    #[arg(long)]
    channels: Option<u32>,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Measure the backend's copy ceiling and add a `floor` ratio column
    /// (see the module docs).
    #[arg(long)]
    baseline: bool,
    /// Plot busbw against size as SVG.
    #[arg(long)]
    svg: Option<PathBuf>,
    #[command(flatten)]
    nccl: crate::nccl_cols::NcclArgs,
    /// Instead of the table: the selector's pick against every algorithm
    /// forced, same run, per collective and size (out of place, first
    /// data type), with the worst ratio last.
    #[arg(long)]
    pick: bool,
    /// Memory the calls run on, a comma list: `alloc` (`comm.alloc`
    /// buffers, the typed entry points on the rank's stream) or `external`
    /// (CUDA memory the caller allocates with cudarc, `cuMemAllocAsync`,
    /// registered, through the raw entry points on a caller's stream).
    /// With both, every row runs on each, same run, the row's last column
    /// names it, and the worst external/alloc time ratio ends the table.
    #[arg(long, value_delimiter = ',', default_value = "alloc")]
    memory: Vec<Memory>,
}

/// One measured configuration, as the JSON report holds it.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub coll: String,
    pub dtype: String,
    pub op: String,
    pub bytes: usize,
    pub count: usize,
    pub algo: String,
    pub proto: String,
    pub channels: u32,
    /// The selector's predicted time (µs), where the model timed the choice.
    pub predicted_us: Option<f64>,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    pub in_place: bool,
    /// `alloc` or `external` (see `--memory`).
    pub memory: String,
    pub wrong: u64,
    /// Floor time / measured time (with `--baseline`).
    pub floor_ratio: Option<f64>,
    /// NCCL on the same buffers (with `--nccl`).
    #[serde(flatten)]
    pub nccl: crate::nccl_cols::NcclCols,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    machine: String,
    backend: String,
    nranks: u32,
    copy_gbps: Option<f64>,
    nccl: Option<String>,
    nccl_latency_us: Option<(f64, f64)>,
    results: &'a [Row],
}

/// `-o all`: the five built-ins and one (exact) PreMulSum, the testkit's
/// first six.
const ALL_OPS: &[RedOp] = testkit::OPS.split_at(6).0;

fn list<T: Copy>(
    spec: &str,
    all: &[T],
    parse: impl Fn(&str) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    if spec.eq_ignore_ascii_case("all") {
        return Ok(all.to_vec());
    }
    spec.split(',').map(|s| parse(s.trim())).collect()
}

pub fn run(a: SweepArgs) -> anyhow::Result<()> {
    if a.factor < 2 || a.min_bytes == 0 || a.min_bytes > a.max_bytes || a.iters == 0 {
        bail!(
            "need -f >= 2, 0 < -b <= -e and -n >= 1 (got -f {} -b {} -e {} -n {})",
            a.factor,
            a.min_bytes,
            a.max_bytes,
            a.iters
        );
    }
    let colls = list(&a.coll, &CollKind::ALL, |s| Ok(s.parse::<CollKind>()?))?;
    let dtypes = list(&a.dtype, &DataType::ALL, |s| Ok(s.parse::<DataType>()?))?;
    let ops = list(&a.op, ALL_OPS, |s| Ok(s.parse::<RedOp>()?))?;
    let mut config = Config::from_env()?;
    config.backend = a.backend.parse::<BackendKind>()?;
    if let Some(v) = &a.algo {
        config.algo = oxccl::config::parse_algo_filter("--algo", v)?;
    }
    if let Some(v) = &a.proto {
        config.proto = oxccl::config::parse_proto_filter("--proto", v)?;
    }
    if a.channels.is_some() {
        config.channels = a.channels;
    }
    let sizes: Vec<usize> = std::iter::successors(Some(a.min_bytes), |&s| s.checked_mul(a.factor))
        .take_while(|&s| s <= a.max_bytes)
        .collect();
    if a.pick && (a.procs.is_some() || a.from_env) {
        // Each variant makes fresh communicators, which a launched rank
        // cannot do alone: say so rather than print an empty table.
        bail!("--pick runs its ranks as threads of one process: use --ranks N, not --procs or --from-env");
    }
    if let Some(list) = &a.procs {
        return procs::launch(list);
    }
    if !a.from_env && a.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    if !a.from_env && a.root >= a.ranks {
        bail!(
            "root {} out of range for {} ranks (-r 0 to {})",
            a.root,
            a.ranks,
            a.ranks - 1
        );
    }
    if a.pick {
        let mut out = std::io::stdout().lock();
        writeln!(out, "# oxccl sweep --pick: machine {}", machine())?;
        pick::run(&a, &colls, dtypes[0], &sizes, &config, &mut out)?;
        return Ok(());
    }
    let comms = if a.from_env {
        if a.nccl.nccl {
            bail!("--nccl runs with ranks as threads only");
        }
        vec![oxccl::init_from_env_with(config).context("joining the launched ranks")?]
    } else {
        oxccl::init_all_with(a.ranks, config).context("creating communicators")?
    };
    let n = comms[0].nranks();
    if n == 0 || a.root >= n {
        bail!("root {} out of range for {n} ranks", a.root);
    }
    // Ranks as processes: rank 0 prints; the others only take part.
    let lead = comms[0].rank() == 0;
    let backend = comms[0].describe_backend();
    let machine = machine();
    let mut out: Box<dyn Write> = if lead {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::io::sink())
    };
    let form = if a.from_env { "processes" } else { "threads" };
    writeln!(
        out,
        "# oxccl sweep: {n} ranks as {form}, backend {backend}, machine {machine}"
    )?;
    writeln!(
        out,
        "# -b {} -e {} -f {} -n {} -w {} -c {} (time: slowest rank, median call)",
        a.min_bytes, a.max_bytes, a.factor, a.iters, a.warmup, a.check
    )?;
    // Over the network the ceiling is one TCP stream instead, and `floor`
    // is busbw over it. Rank 0 alone measures (the others print nothing
    // and wait in the first call), so nothing competes with it.
    let mut over_net = false;
    let copy_gbps = if !a.baseline {
        None
    } else if !lead {
        Some(f64::NAN)
    } else {
        let bytes = a.max_bytes.max(1 << 20);
        if let Some(bw) = comms[0].stream_bandwidth(bytes).transpose()? {
            over_net = true;
            writeln!(
                out,
                "# network ceiling: {bw:.2} GB/s (one TCP stream of {bytes} bytes on rank 0's interface, same run); floor = busbw / ceiling"
            )?;
            if let Some(two) = comms[0].duplex_bandwidth(bytes).transpose()? {
                writeln!(
                    out,
                    "# two streams at once: {two:.2} GB/s each ({:.1}% of one stream; a 2-rank ring AllReduce sends and receives at once, so where both share the cores this bounds its busbw)",
                    100.0 * two / bw
                )?;
            }
            Some(bw)
        } else {
            let bw = comms[0].copy_bandwidth(bytes)?;
            writeln!(
                out,
                "# copy ceiling: {bw:.2} GB/s (backend copy of {bytes} bytes, same run)"
            )?;
            Some(bw)
        }
    };
    let nccl = crate::nccl_cols::Baseline::open(&a.nccl, &comms, &mut out)?;
    let mem_ranks = comms[0].ranks_on_busiest_memory();
    let cases: Vec<(CollKind, DataType, RedOp)> = colls
        .iter()
        .flat_map(|&k| {
            let ops: Vec<RedOp> = if k.is_reduction() {
                ops.clone()
            } else {
                vec![RedOp::Sum]
            };
            dtypes
                .iter()
                .flat_map(move |&d| ops.clone().into_iter().map(move |o| (k, d, o)))
        })
        .collect();
    let bar = progress(
        lead && std::io::stdout().is_terminal(),
        (cases.len() * sizes.len()) as u64,
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut last_kind = None;
    let mut pools = Pools::default();
    for (kind, dt, op) in cases {
        if last_kind != Some(kind) {
            header(&mut out, kind, copy_gbps.is_some(), &nccl)?;
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
        for &size in &sizes {
            bar.inc(1);
            let Some(count) = count_for(kind, size, dt.size(), n) else {
                continue;
            };
            let root = if kind.has_root() { a.root } else { 0 };
            let coll = Collective::new(kind, count, root);
            for &memory in &a.memory {
                let mut pair = Vec::new();
                for in_place in [false, true] {
                    if kind == CollKind::SendRecv && in_place {
                        continue;
                    }
                    let m = with_dtype!(dt, T => {
                        let most = largest_elems(&colls, &sizes, dt.size(), n);
                        let pool = pools.get_for::<T>(&comms, most, memory)?;
                        let case = Case { coll: &coll, op, in_place, a: &a, nccl: &nccl };
                        measure::<T>(&comms, pool, case)
                    })?;
                    let time = m.time.as_secs_f64().max(1e-9);
                    let bytes = coll.bytes(n, dt.size());
                    let algbw = bytes as f64 / time / 1e9;
                    // Send/Recv groups do not go through the selector; the last
                    // choice would be an earlier collective's.
                    let choice = comms[0]
                        .last_choice()
                        .filter(|_| kind != CollKind::SendRecv);
                    pair.push(Row {
                        coll: kind.name().into(),
                        dtype: dt.name().into(),
                        op: op.name().into(),
                        bytes,
                        count,
                        algo: choice.map_or("p2p".into(), |c| c.algo.name().into()),
                        proto: choice.map_or("simple".into(), |c| c.proto.name().into()),
                        channels: choice.map_or(0, |c| c.channels),
                        predicted_us: choice.and_then(|c| c.predicted_us),
                        time_us: time * 1e6,
                        algbw_gbps: algbw,
                        busbw_gbps: algbw * kind.busbw_factor(n),
                        in_place,
                        memory: memory.name().into(),
                        wrong: m.wrong,
                        floor_ratio: copy_gbps.map(|c| {
                            if over_net {
                                return algbw * kind.busbw_factor(n) / c;
                            }
                            let fb = floor_bytes(kind, n, mem_ranks, bytes as f64, in_place);
                            // C counts read + write: twice the copy ceiling.
                            fb / (2.0 * c * 1e9) / time
                        }),
                        nccl: nccl.cols(
                            &m.nccl,
                            bytes,
                            kind.busbw_factor(n),
                            algbw * kind.busbw_factor(n),
                        ),
                    });
                    if let Some(first) = m.first_wrong {
                        bar.suspend(|| {
                        eprintln!(
                            "# WRONG {kind} {dt} {op} {size}B in_place={in_place} memory={}: {first}",
                            memory.name()
                        )
                    });
                    }
                }
                let mut line = format_row(&coll, dt, op, kind.is_reduction(), &pair, copy_gbps)
                    + &nccl.format(&pair);
                if a.memory != [Memory::Alloc] {
                    line += &format!("  {:>8}", memory.name());
                }
                bar.suspend(|| writeln!(out, "{line}"))?;
                rows.extend(pair);
            }
        }
    }
    bar.finish_and_clear();
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    // Starts at +0.0: an empty f64 sum is -0.0, printed as "-0.0000".
    let avg_bus =
        rows.iter().map(|r| r.busbw_gbps).fold(0.0, |x, y| x + y) / rows.len().max(1) as f64;
    writeln!(
        out,
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    )?;
    writeln!(out, "# Avg bus bandwidth    : {avg_bus:.4} ")?;
    if let Some(w) = external::worst_ratio(&rows) {
        writeln!(out, "# external / alloc time, worst row: {w}")?;
    }
    pools.release(&comms)?;
    if let Some(path) = a.json.as_ref().filter(|_| lead) {
        let rep = Report {
            machine,
            backend: comms[0].backend().name().into(),
            nranks: n,
            copy_gbps,
            nccl: nccl.describe(),
            nccl_latency_us: nccl.latency_us(),
            results: &rows,
        };
        std::fs::write(path, serde_json::to_string_pretty(&rep)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = a.svg.as_ref().filter(|_| lead) {
        plot::plot(path, &rows, n)?;
    }
    if wrong > 0 {
        bail!("{wrong} wrong elements");
    }
    Ok(())
}

/// Bytes every rank must at least read and write in the busiest memory,
/// summed over the `m` of the `n` ranks that share it, for nccl-tests'
/// size `s` (see the module docs; the formulas are per rank, times `m`).
pub fn floor_bytes(kind: CollKind, n: u32, m: u32, s: f64, in_place: bool) -> f64 {
    let (n, m) = (f64::from(n.max(1)), f64::from(m.clamp(1, n.max(1))));
    match kind {
        // Read the input, write the output.
        CollKind::AllReduce | CollKind::AllToAll | CollKind::SendRecv => 2.0 * m * s,
        // The root reads S once; every rank writes S (the root not in place).
        CollKind::Broadcast if in_place => s + (m - 1.0) * s,
        CollKind::Broadcast => s + m * s,
        // Every rank reads S; the root writes S.
        CollKind::Reduce => m * s + s,
        // Each reads its S/N block and writes S (in place: the other blocks).
        CollKind::AllGather if in_place => m * (s / n + s * (n - 1.0) / n),
        CollKind::AllGather => m * (s / n + s),
        // Each reads S and writes its S/N block.
        CollKind::ReduceScatter => m * (s + s / n),
        // The root's S is read (Scatter) or written (Gather) once and each
        // block written or read once: 2·S over the whole clique, M/N of it here.
        CollKind::Gather | CollKind::Scatter => 2.0 * s * m / n,
    }
}

/// The most elements one rank's buffer needs over the sweep: the larger of
/// input and output of every collective at the largest size.
fn largest_elems(colls: &[CollKind], sizes: &[usize], es: usize, n: u32) -> usize {
    let top = sizes.iter().copied().max().unwrap_or(0);
    colls
        .iter()
        .filter_map(|&k| {
            let count = count_for(k, top, es, n)?;
            let c = Collective::new(k, count, 0);
            Some(c.input_len(n).max(c.output_len(n)))
        })
        .max()
        .unwrap_or(0)
}

/// Per data type, every rank's two buffers (main and out-of-place output),
/// allocated once at the sweep's largest size plus the check's guard.
#[derive(Default)]
struct Pools(
    std::collections::HashMap<DataType, Box<dyn std::any::Any>>,
    /// The mirrors' registrations, by communicator index: ended before
    /// their memory is dropped.
    Vec<(usize, oxccl::Registration)>,
);

/// One rank's sweep buffers: the call's input (and in place its output)
/// lies in `main`, an out-of-place output in `other`; with `--memory
/// external` the calls run on `mirror`'s copies of both instead.
pub(crate) struct RankBufs<T: Element> {
    main: Buffer<T>,
    other: Buffer<T>,
    mirror: Option<external::Mirror>,
    /// Whether this row's calls run on `mirror`.
    external: bool,
}

/// One data type's buffers, by rank.
type Pool<T> = Vec<Option<RankBufs<T>>>;

impl Pools {
    /// [`Pools::get`] for calls on `memory`: external memory mirrors the
    /// buffers (allocated and registered on first use).
    fn get_for<T: Element>(
        &mut self,
        comms: &[Communicator],
        elems: usize,
        memory: Memory,
    ) -> anyhow::Result<&mut Pool<T>> {
        let pool = self.get::<T>(comms, elems)?;
        let external = memory == Memory::External;
        let mut regs = Vec::new();
        for (i, (c, slot)) in comms.iter().zip(pool.iter_mut()).enumerate() {
            let b = slot.as_mut().context("sweep buffers missing")?;
            if external && b.mirror.is_none() {
                let at = [b.main.full().addr(), b.other.full().addr()];
                let bytes = b.main.len() * T::DTYPE.size();
                let (m, r) = external::Mirror::new(c, at, bytes)?;
                b.mirror = Some(m);
                regs.extend(r.into_iter().map(|r| (i, r)));
            }
            b.external = external;
        }
        self.1.extend(regs);
        self.get::<T>(comms, elems)
    }

    /// Ends every mirror's registrations (their calls are complete: each
    /// row synchronizes).
    fn release(&mut self, comms: &[Communicator]) -> anyhow::Result<()> {
        for (i, r) in self.1.drain(..) {
            comms[i].deregister(r)?;
        }
        Ok(())
    }

    fn get<T: Element>(
        &mut self,
        comms: &[Communicator],
        elems: usize,
    ) -> anyhow::Result<&mut Pool<T>> {
        if !self.0.contains_key(&T::DTYPE) {
            // Drop other types' buffers first: only one type runs at a time.
            self.release(comms)?;
            self.0.clear();
            let pool: Pool<T> = comms
                .iter()
                .map(|c| {
                    // Room for the check's guard past the largest output.
                    let len = elems + check::GUARD;
                    Ok(Some(RankBufs {
                        main: c.alloc::<T>(len)?,
                        other: c.alloc::<T>(len)?,
                        mirror: None,
                        external: false,
                    }))
                })
                .collect::<oxccl::Result<_>>()?;
            self.0.insert(T::DTYPE, Box::new(pool));
        }
        self.0
            .get_mut(&T::DTYPE)
            .and_then(|b| b.downcast_mut::<Pool<T>>())
            .context("sweep buffer pool of the wrong type")
    }
}

/// Elements per rank for a row of `size` bytes (nccl-tests' size is the
/// larger buffer), or `None` when it rounds to zero.
fn count_for(kind: CollKind, size: usize, es: usize, n: u32) -> Option<usize> {
    Some(size / count_for_least(kind, es, n)).filter(|&c| c > 0)
}

/// The fewest bytes (nccl-tests' size) that make a call of `kind`: one
/// element, per rank where the size is the whole output.
fn count_for_least(kind: CollKind, es: usize, n: u32) -> usize {
    match kind {
        CollKind::AllGather
        | CollKind::Gather
        | CollKind::ReduceScatter
        | CollKind::Scatter
        | CollKind::AllToAll => es * n as usize,
        _ => es,
    }
}

fn progress(show: bool, total: u64) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed}") {
        bar.set_style(style);
    }
    bar
}

fn header(
    out: &mut impl Write,
    kind: CollKind,
    ratio: bool,
    nccl: &crate::nccl_cols::Baseline,
) -> std::io::Result<()> {
    let extra = if ratio { "   ratio" } else { "" };
    writeln!(out, "#\n# Collective: {kind}")?;
    writeln!(
        out,
        "#{:>62}{:>34}{extra}{:>34}{extra}{}",
        "",
        "out-of-place",
        "in-place",
        nccl.head(1)
    )?;
    writeln!(
        out,
        "#{:>11} {:>12} {:>9} {:>9} {:>6}  {}  {}{}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        cols(ratio),
        cols(ratio),
        nccl.head(2)
    )?;
    writeln!(
        out,
        "#{:>11} {:>12} {:>9} {:>9} {:>6}  {:>9} {:>7} {:>7} {:>6}{}  {:>9} {:>7} {:>7} {:>6}{}{}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        if ratio { "        " } else { "" },
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        if ratio { "        " } else { "" },
        nccl.head(3)
    )
}

fn cols(ratio: bool) -> String {
    format!(
        "{:>9} {:>7} {:>7} {:>6}{}",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        if ratio { "   floor" } else { "" }
    )
}

fn format_row(
    coll: &Collective,
    dt: DataType,
    op: RedOp,
    red: bool,
    pair: &[Row],
    copy: Option<f64>,
) -> String {
    let root = if coll.kind.has_root() {
        coll.root as i64
    } else {
        -1
    };
    let opname = if red { op.name() } else { "none" };
    let mut s = format!(
        "{:>12} {:>12} {:>9} {:>9} {:>6}",
        pair.first().map_or(0, |r| r.bytes),
        coll.count,
        dt.name(),
        opname,
        root
    );
    for r in pair {
        s += &format!(
            "  {:>9.2} {:>7.2} {:>7.2} {:>6}",
            r.time_us, r.algbw_gbps, r.busbw_gbps, r.wrong
        );
        if copy.is_some() {
            s += &format!(" {:>6.1}%", 100.0 * r.floor_ratio.unwrap_or(0.0));
        }
    }
    if pair.len() == 1 {
        s += &format!("  {:>9} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A");
    }
    s
}

/// One measurement: what runs (collective, op, layout), under which flags,
/// with which NCCL baseline beside it.
#[derive(Clone, Copy)]
struct Case<'a> {
    coll: &'a Collective,
    op: RedOp,
    in_place: bool,
    a: &'a SweepArgs,
    nccl: &'a crate::nccl_cols::Baseline,
}

/// What one configuration measured.
struct Measured {
    time: Duration,
    wrong: u64,
    first_wrong: Option<String>,
    nccl: crate::nccl_cols::RowMeasure,
}

/// Runs warm-up, timed iterations and (with `-c`) a checked call on every
/// rank, on views of `pool`; returns the slowest rank's mean time per call
/// and the check: wrong output elements plus elements changed outside the
/// outputs (see `check`).
fn measure<T: Element>(
    comms: &[Communicator],
    pool: &mut Pool<T>,
    case: Case<'_>,
) -> anyhow::Result<Measured> {
    measure_with(comms, pool, case, &check::run_collective::<T>)
}

/// [`measure`] with every call made by `run` (tests pass faulty ones).
fn measure_with<T: Element>(
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
    type RankOut<T> = (anyhow::Result<RankDone<T>>, Vec<T>, RankBufs<T>);
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
                    let r = rank_run(c, &bufs, case, &input, barrier, nrow, run);
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
        check_sendrecv(&inputs, &outputs)
    } else {
        compare_parallel(coll, &inputs, &outputs, op)
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
fn print_spread(coll: &Collective, in_place: bool, sorted: &[Duration]) {
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
fn median_lap(laps: &[Duration]) -> Duration {
    let mut v = laps.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The error that explains a failed row: one rank's own failure rather
/// than the aborts it caused on the others (a failed rank aborts the
/// clique, so every peer reports `Aborted`/`Failed`, rank 0 usually first).
fn root_cause(errs: Vec<anyhow::Error>) -> Option<anyhow::Error> {
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

/// `testkit::compare`, split over the CPU's cores for the element-wise
/// collectives (AllReduce, Broadcast, Reduce: output element i depends only
/// on input element i, so each range is a smaller call of the same kind);
/// others are compared whole. At 1 GiB per rank the serial compare would
/// dominate the sweep.
fn compare_parallel<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
    op: RedOp,
) -> (u64, Option<String>) {
    let elementwise = matches!(
        coll.kind,
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let short = outputs.iter().any(|o| o.len() < coll.count);
    if !elementwise || threads < 2 || coll.count < (1 << 20) || short {
        return testkit::compare(coll, inputs, outputs, op);
    }
    let step = coll.count.div_ceil(threads);
    let parts: Vec<(u64, Option<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..coll.count)
            .step_by(step)
            .map(|lo| {
                let hi = (lo + step).min(coll.count);
                s.spawn(move || {
                    let part = Collective::new(coll.kind, hi - lo, coll.root);
                    let ins: Vec<Vec<T>> = inputs.iter().map(|v| v[lo..hi].to_vec()).collect();
                    let outs: Vec<Vec<T>> = outputs.iter().map(|v| v[lo..hi].to_vec()).collect();
                    let (w, first) = testkit::compare(&part, &ins, &outs, op);
                    (w, first.map(|f| format!("{f} (in elements {lo}..{hi})")))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or((1, Some("compare thread panicked".into())))
            })
            .collect()
    });
    let wrong = parts.iter().map(|p| p.0).sum();
    (wrong, parts.into_iter().find_map(|p| p.1))
}

/// Expected: each rank holds its predecessor's input.
pub(crate) fn check_sendrecv<T: Element>(
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
) -> (u64, Option<String>) {
    let n = inputs.len();
    let mut found = (0, None);
    for (r, got) in outputs.iter().enumerate() {
        let exp = &inputs[(r + n - 1) % n];
        check::bit_diffs(exp, got, &mut found, |i, e, g| {
            format!("rank {r} element {i}: expected {e:?}, got {g:?}")
        });
    }
    found
}

/// What one rank's share of a row gave.
struct RankDone<T> {
    /// Median time of one of the `-n` timed calls.
    time: Duration,
    /// Every timed call, sorted (for `OXCCL_SWEEP_SPREAD`).
    laps: Vec<Duration>,
    /// The checked call's output (empty without `-c`).
    out: Vec<T>,
    /// Elements the checked call changed outside the output, and the first.
    outside: (u64, Option<String>),
}

/// One rank's share of [`measure`]. Every rank reaches every barrier,
/// failed or not (a failed rank aborts the clique first, so peers'
/// pending calls fail promptly), and the first error is returned.
#[allow(clippy::too_many_arguments)] // reason: one rank's view of `measure`'s arguments; a struct would only rename them
fn rank_run<T: Element>(
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
        t = median_lap(&laps);
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

/// `hostname, N cores, CPU model`.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {cpu}")
}

#[cfg(test)]
mod tests {
    use super::check::{run_collective, RankView, Runner};
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

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("3X").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn floor_bytes_follow_the_documented_table() {
        let s = 1024.0;
        // All ranks on one memory: AllReduce's HBM floor is 2·N·S.
        assert_eq!(
            floor_bytes(CollKind::AllReduce, 8, 8, s, false),
            2.0 * 8.0 * s
        );
        assert_eq!(floor_bytes(CollKind::Broadcast, 8, 8, s, false), 9.0 * s);
        assert_eq!(floor_bytes(CollKind::Broadcast, 8, 8, s, true), 8.0 * s);
        assert_eq!(floor_bytes(CollKind::Reduce, 8, 8, s, false), 9.0 * s);
        assert_eq!(floor_bytes(CollKind::AllGather, 8, 8, s, false), 9.0 * s);
        assert_eq!(floor_bytes(CollKind::AllGather, 8, 8, s, true), 8.0 * s);
        assert_eq!(floor_bytes(CollKind::ReduceScatter, 8, 8, s, true), 9.0 * s);
        assert_eq!(floor_bytes(CollKind::Gather, 8, 8, s, false), 2.0 * s);
        // Two GPUs of four ranks each: the busiest memory holds half.
        assert_eq!(floor_bytes(CollKind::AllReduce, 8, 4, s, false), 8.0 * s);
    }

    #[test]
    fn one_allocation_covers_every_row() {
        let sizes = [8, 64, 1 << 20];
        let colls = [CollKind::AllReduce, CollKind::AllGather, CollKind::AllToAll];
        // 1 MiB of f32: 262144 elements; AllGather's output and AllToAll's
        // buffers are that size too (count = S / (4·n) per block).
        assert_eq!(largest_elems(&colls, &sizes, 4, 4), 1 << 18);
    }

    #[test]
    fn counts_follow_nccl_tests_sizes() {
        assert_eq!(count_for(CollKind::AllReduce, 64, 4, 4), Some(16));
        assert_eq!(count_for(CollKind::AllGather, 64, 4, 4), Some(4));
        assert_eq!(count_for(CollKind::AllGather, 8, 4, 4), None);
    }
}
