//! The sweep's arguments: nccl-tests' flags, what they expand to (the
//! collectives, data types, ops and sizes of the rows, the library
//! configuration) and the element counts each size gives.

use std::path::PathBuf;

use anyhow::bail;
pub use oxccl::config::parse_size;
use oxccl::core::testkit;
use oxccl::core::Collective;
use oxccl::{BackendKind, CollKind, Config, DataType, RedOp};

use super::external::Memory;

/// `-c`: 0 (no check) or 1 (check one call per size); anything else is
/// refused rather than read as a check.
fn parse_check(v: &str) -> Result<u32, String> {
    match v.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        _ => Err("takes 0 (do not check the results) or 1 (check one call per size)".into()),
    }
}

/// Flags follow nccl-tests' letters.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub(crate) min_bytes: usize,
    /// Largest size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "256K", value_parser = parse_size)]
    pub(crate) max_bytes: usize,
    /// Multiply the size by this factor each step.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub(crate) factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 5)]
    pub(crate) iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub(crate) warmup: u32,
    /// Check results (1) or not (0); nothing else is taken.
    #[arg(short = 'c', long = "check", default_value_t = 1, value_parser = parse_check)]
    pub(crate) check: u32,
    /// Reduction op: sum, prod, max, min, avg, premulsum or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub(crate) op: String,
    /// Data type (nccl-tests names: float, half, int32, ...) or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub(crate) dtype: String,
    /// Root rank for rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub(crate) root: u32,
    /// Collective name, comma list, or all.
    #[arg(long, default_value = "all")]
    pub(crate) coll: String,
    /// Number of ranks, as threads of this process [default: 4]. Where a
    /// launcher's variables say this process is one rank of several
    /// (torchrun's RANK/WORLD_SIZE, mpirun's OMPI_COMM_WORLD_RANK/SIZE,
    /// PMI_RANK/PMI_SIZE, a Slurm step's SLURM_PROCID/SLURM_NTASKS), the
    /// sweep joins them as with --from-env, and --ranks is an error unless
    /// --no-launcher is given too.
    #[arg(long)]
    pub(crate) ranks: Option<u32>,
    /// Ranks as processes instead: launch N processes of one rank each
    /// (a comma list runs one sweep per N); rank 0 prints the table.
    #[arg(long)]
    pub(crate) procs: Option<String>,
    /// Be one rank of a sweep whose processes a launcher started
    /// (torchrun, mpirun, PMI, Slurm, or `--procs`): rank and rank count
    /// from their environment variables; rank 0 prints. Implied where a
    /// launcher's rank and size variables are set and agree; where they are
    /// partial or conflict the sweep stops and names them.
    #[arg(long, conflicts_with = "no_launcher")]
    pub(crate) from_env: bool,
    /// Ignore launcher variables: run --ranks threads (or --procs) in
    /// this process even where a launcher's variables are set, partial or
    /// not.
    #[arg(long)]
    pub(crate) no_launcher: bool,
    /// host, cuda or auto (CUDA when present, else host).
    #[arg(long, default_value = "auto")]
    pub(crate) backend: String,
    /// Algorithm filter, NCCL_ALGO syntax (e.g. `ring`, `^ring`, `allreduce:tree`).
    #[arg(long)]
    pub(crate) algo: Option<String>,
    /// Protocol filter, NCCL_PROTO syntax.
    #[arg(long)]
    pub(crate) proto: Option<String>,
    /// Channel count (at least 1; leave it out for the selector's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) channels: Option<u32>,
    /// Deterministic reductions (as `OXCCL_DETERMINISTIC=1`): reductions
    /// run only plans that reduce in rank order.
    #[arg(long)]
    pub(crate) deterministic: bool,
    /// Write the results as JSON.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Measure the backend's copy ceiling and add a `floor` ratio column
    /// (see the module docs).
    #[arg(long)]
    pub(crate) baseline: bool,
    /// Plot busbw against size as SVG.
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) nccl: crate::nccl_cols::NcclArgs,
    /// Instead of the table: the selector's pick against every algorithm
    /// forced, same run, per collective and size (out of place, first
    /// data type), with the worst ratio last.
    #[arg(long)]
    pub(crate) pick: bool,
    /// Memory the calls run on, a comma list: `alloc` (`comm.alloc`
    /// buffers, the typed entry points on the rank's stream) or `external`
    /// (CUDA memory the caller allocates with cudarc, `cuMemAllocAsync`,
    /// registered, through the raw entry points on a caller's stream).
    /// With both, every row runs on each, same run, the row's last column
    /// names it, and the worst external/alloc time ratio ends the table.
    #[arg(long, value_delimiter = ',', default_value = "alloc")]
    pub(crate) memory: Vec<Memory>,
    /// Add a column saying, per row (out of place / in place), whether its
    /// calls ran with no SM: `yes` where the backend launched no kernel
    /// and ran them as copy-engine copies (the `ce` algorithm on CUDA),
    /// `no` where it launched kernels, `-` where the backend does not
    /// count launches (host). JSON rows get `sm_free` either way.
    #[arg(long)]
    pub(crate) sm_free: bool,
    /// Force the SM-free algorithm (`ce`) for every collective it serves
    /// (Broadcast, AllGather, Gather, Scatter, AllToAll), the others
    /// keeping the selector's pick; implies `--sm-free`.
    #[arg(long, conflicts_with = "algo")]
    pub(crate) sm_free_only: bool,
    /// Write a step trace (Chrome trace JSON: every rank's calls and, on
    /// the host backend, every plan step) here, as `OXCCL_TRACE` does.
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Calls per rank the trace records (`OXCCL_TRACE_CALLS`).
    #[arg(long, requires = "trace")]
    pub(crate) trace_calls: Option<usize>,
}

/// The `NCCL_ALGO` filter of `--sm-free-only`: the copy-engine algorithm
/// for each collective it serves (`broadcast:ce;allgather:ce;...`).
pub(crate) fn sm_free_filter() -> String {
    CollKind::ALL
        .iter()
        .filter(|&&k| oxccl::core::gen::supports(oxccl::Algo::CopyEngine, k))
        .map(|k| format!("{}:{}", k.name(), oxccl::Algo::CopyEngine.name()))
        .collect::<Vec<_>>()
        .join(";")
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

impl SweepArgs {
    /// Ranks as threads: `--ranks`, 4 by default.
    pub(crate) fn ranks(&self) -> u32 {
        self.ranks.unwrap_or(4)
    }
}

/// What the flags expand to: the rows' axes and the library's settings.
pub(crate) struct Plan {
    pub colls: Vec<CollKind>,
    pub dtypes: Vec<DataType>,
    pub ops: Vec<RedOp>,
    /// `-b` to `-e`, times `-f` each step.
    pub sizes: Vec<usize>,
    pub config: Config,
}

impl Plan {
    /// Checks the size flags and reads the lists; the configuration is
    /// the environment's with the backend, algorithm, protocol and channel
    /// flags on top.
    pub(crate) fn new(a: &SweepArgs) -> anyhow::Result<Plan> {
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
        if a.sm_free_only {
            config.algo = oxccl::config::parse_algo_filter("--sm-free-only", &sm_free_filter())?;
        }
        if let Some(v) = &a.proto {
            config.proto = oxccl::config::parse_proto_filter("--proto", v)?;
        }
        if a.channels.is_some() {
            config.channels = a.channels;
        }
        if let Some(path) = &a.trace {
            let calls = a
                .trace_calls
                .or(config.trace.as_ref().map(|t| t.calls))
                .unwrap_or(oxccl::config::DEFAULT_TRACE_CALLS);
            if calls == 0 {
                bail!("--trace-calls must be at least 1");
            }
            config.trace = Some(oxccl::config::TraceSettings {
                path: path.clone(),
                calls,
            });
        }
        if a.deterministic {
            config.deterministic = true;
        }
        let sizes: Vec<usize> =
            std::iter::successors(Some(a.min_bytes), |&s| s.checked_mul(a.factor))
                .take_while(|&s| s <= a.max_bytes)
                .collect();
        Ok(Plan {
            colls,
            dtypes,
            ops,
            sizes,
            config,
        })
    }

    /// Every (collective, data type, op) of the sweep, in the table's
    /// order; collectives that reduce nothing run once per type, as Sum.
    pub(crate) fn cases(&self) -> Vec<(CollKind, DataType, RedOp)> {
        let (ops, dtypes) = (&self.ops, &self.dtypes);
        self.colls
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
            .collect()
    }
}

/// The rank flags that need no communicator: `--pick` needs threads, and
/// threads need a rank count and a root among them.
pub(crate) fn check_ranks(a: &SweepArgs, procs_or_env: bool) -> anyhow::Result<()> {
    if a.pick && procs_or_env {
        // Each variant makes fresh communicators, which a launched rank
        // cannot do alone: say so rather than print an empty table.
        bail!("--pick runs its ranks as threads of one process: use --ranks N, not --procs or --from-env");
    }
    Ok(())
}

/// [`check_ranks`] for ranks as threads of this process.
pub(crate) fn check_threads(a: &SweepArgs) -> anyhow::Result<()> {
    if !a.from_env && a.ranks() == 0 {
        bail!("--ranks must be at least 1");
    }
    if !a.from_env && a.root >= a.ranks() {
        bail!(
            "root {} out of range for {} ranks (-r 0 to {})",
            a.root,
            a.ranks(),
            a.ranks() - 1
        );
    }
    Ok(())
}

/// Elements per rank for a row of `size` bytes (nccl-tests' size is the
/// larger buffer), or `None` when it rounds to zero.
pub(crate) fn count_for(kind: CollKind, size: usize, es: usize, n: u32) -> Option<usize> {
    Some(size / count_for_least(kind, es, n)).filter(|&c| c > 0)
}

/// The fewest bytes (nccl-tests' size) that make a call of `kind`: one
/// element, per rank where the size is the whole output.
pub(crate) fn count_for_least(kind: CollKind, es: usize, n: u32) -> usize {
    match kind {
        CollKind::AllGather
        | CollKind::Gather
        | CollKind::ReduceScatter
        | CollKind::Scatter
        | CollKind::AllToAll => es * n as usize,
        _ => es,
    }
}

/// The most elements one rank's buffer needs over the sweep: the larger of
/// input and output of every collective at the largest size.
pub(crate) fn largest_elems(colls: &[CollKind], sizes: &[usize], es: usize, n: u32) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn zero_channels_is_refused() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            sweep: SweepArgs,
        }
        let parse = |v: &str| <Cli as clap::Parser>::try_parse_from(["sweep", "--channels", v]);
        let e = parse("0").err().expect("--channels 0 parsed");
        assert!(e.to_string().contains("--channels"), "{e}");
        assert_eq!(parse("2").map(|c| c.sweep.channels).ok(), Some(Some(2)));
    }

    #[test]
    fn check_takes_only_0_or_1() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            sweep: SweepArgs,
        }
        let parse = |v: &str| <Cli as clap::Parser>::try_parse_from(["sweep", "-c", v]);
        for bad in ["2", "10", "yes", ""] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("-c {bad:?} parsed"));
            let e = e.to_string();
            assert!(
                e.contains("--check") && e.contains("0 (do not check"),
                "{e}"
            );
        }
        assert_eq!(parse("0").map(|c| c.sweep.check).ok(), Some(0));
        assert_eq!(parse("1").map(|c| c.sweep.check).ok(), Some(1));
    }

    #[test]
    fn sm_free_only_forces_copy_engines_where_served() {
        let f = super::sm_free_filter();
        assert_eq!(
            f,
            "broadcast:ce;allgather:ce;alltoall:ce;gather:ce;scatter:ce"
        );
        let filter = oxccl::config::parse_algo_filter("--sm-free-only", &f).unwrap();
        for k in oxccl::CollKind::ALL {
            let served = oxccl::core::gen::supports(oxccl::Algo::CopyEngine, k);
            assert_eq!(filter.allows(k, oxccl::Algo::Ring), !served, "{k}");
            assert!(filter.allows(k, oxccl::Algo::CopyEngine) || !served, "{k}");
        }
    }
}
