//! `sweep --pick`: the selector's pick against every algorithm forced, in
//! the same run, per collective and size, so anyone can check the
//! selector on their machine. For each variant (the selector's own
//! choice, then each algorithm alone through the algorithm filter, the
//! selector still choosing its protocol and channels) a fresh set of
//! communicators runs every collective and size of the sweep out of
//! place, checked, timed as the median of 5 measurements up to 4 MiB (one
//! above); the table prints, per (collective, size), the pick's
//! time, the best forced algorithm's and their ratio, and the worst
//! ratio last. Where the fastest forced variant ran the very configuration
//! the selector picked (same algorithm, protocol, FIFO or direct, and
//! channels), the pick is the best by identity: its ratio is 1, and the two
//! timings of that one configuration are printed beside it as the run's
//! noise (at launch-bound sizes 8 ranks' threads scatter by ±30% between
//! two runs of 10 calls, which a plain time ratio would blame on the
//! selector). At launch-bound sizes a point whose first pass puts the pick
//! more than 10% behind a different configuration is measured again head
//! to head: the pick and that variant on fresh communicators, in
//! alternation, 9 measurements each, and the row shows those medians (and
//! the first pass's) — the minimum over ~7 forced variants of a few noisy
//! measurements each is otherwise biased low against the one pick.
//! A forced algorithm the backend cannot run at some point is
//! skipped there with its reason (listed after the table); the pick
//! failing or a wrong element fails the run, after the table.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{bail, Context};
use oxccl::core::{gen, with_dtype, Algo, Collective};
use oxccl::{CollKind, Communicator, Config, DataType, RedOp};
use oxccl_topo::consts::is_direct;

use super::args::{count_for, largest_elems, SweepArgs};
use super::measure::{measure, Case};
use super::pools::Pools;

/// What one variant measured for one (collective, size).
#[derive(Clone, Debug)]
struct Timed {
    us: f64,
    /// The choice the facade reported (`algo proto (fifo) channels`).
    choice: String,
}

/// Makes a fresh set of communicators for one variant's configuration.
pub(crate) type MakeComms<'a> = dyn Fn(&Config) -> oxccl::Result<Vec<Communicator>> + 'a;

/// Runs the comparison and prints its table; returns the worst ratio.
pub(crate) fn run(
    a: &SweepArgs,
    colls: &[CollKind],
    dt: DataType,
    sizes: &[usize],
    config: &Config,
    out: &mut impl Write,
) -> anyhow::Result<f64> {
    let make = |cfg: &Config| oxccl::init_all_with(a.ranks(), cfg.clone());
    Ok(run_on(a, colls, dt, sizes, config, &make, out)?.0)
}

/// [`run`] on communicators from `make`. A forced algorithm that fails
/// (refused by the backend, no plan for this shape) is skipped with its
/// reason and the sweep goes on with fresh communicators (the failure
/// aborted the old ones); the pick failing, or any wrong element, fails
/// the run after the table. Returns the worst ratio and how many points
/// were measured.
pub(crate) fn run_on(
    a: &SweepArgs,
    colls: &[CollKind],
    dt: DataType,
    sizes: &[usize],
    config: &Config,
    make: &MakeComms<'_>,
    out: &mut impl Write,
) -> anyhow::Result<(f64, usize)> {
    let colls: Vec<CollKind> = colls
        .iter()
        .copied()
        .filter(|&k| k != CollKind::SendRecv)
        .collect();
    let mut variants: Vec<(Option<Algo>, Config)> = vec![(None, config.clone())];
    for algo in Algo::ALL {
        if colls
            .iter()
            .any(|&k| gen::supports(algo, k) && config.algo.allows(k, algo))
        {
            let mut c = config.clone();
            c.algo = oxccl::config::parse_algo_filter("--pick", algo.name())?;
            variants.push((Some(algo), c));
        }
    }
    let pass = Pass {
        a,
        colls: &colls,
        dt,
        sizes,
        make,
        most: largest_elems(&colls, sizes, dt.size(), a.ranks()),
    };
    let mut points = pass.first(&variants);
    let rechecked = pass.recheck(&mut points, &variants, config);
    let worst = pass.table(&points, &rechecked, out)?;
    if points.failed > 0 {
        bail!(
            "{} points failed (the pick, or wrong elements): see the skipped lines",
            points.failed
        );
    }
    Ok((worst, points.got.len()))
}

/// What the passes measured: per (collective index, size, forced
/// algorithm or the pick), and what did not run.
#[derive(Default)]
struct Points {
    got: BTreeMap<(usize, usize, Option<Algo>), Timed>,
    /// (what, why) of every point that did not run or ran wrong.
    skipped: Vec<(String, String)>,
    /// Points that fail the run: the pick's, or wrong elements.
    failed: usize,
}

/// The axes every pass of the comparison shares.
struct Pass<'a> {
    a: &'a SweepArgs,
    colls: &'a [CollKind],
    dt: DataType,
    sizes: &'a [usize],
    make: &'a MakeComms<'a>,
    /// The largest buffer any point needs, in elements.
    most: usize,
}

impl Pass<'_> {
    /// The collective of `kind` at `size`, where it has one element.
    fn coll(&self, kind: CollKind, size: usize) -> Option<Collective> {
        let count = count_for(kind, size, self.dt.size(), self.a.ranks())?;
        let root = if kind.has_root() { self.a.root } else { 0 };
        Some(Collective::new(kind, count, root))
    }

    /// Every variant at every point, each variant on its own
    /// communicators (fresh again after a failure aborted them).
    fn first(&self, variants: &[(Option<Algo>, Config)]) -> Points {
        let (a, dt) = (self.a, self.dt);
        let mut p = Points::default();
        for (algo, cfg) in variants {
            let name = algo.map_or("pick".into(), |x| format!("forced {x}"));
            // Made on first use and again after a failure aborted them.
            let mut comms: Option<(Vec<Communicator>, Pools)> = None;
            for (ki, &kind) in self.colls.iter().enumerate() {
                if algo.is_some_and(|x| !gen::supports(x, kind)) {
                    continue;
                }
                for &size in self.sizes {
                    let Some(coll) = self.coll(kind, size) else {
                        continue;
                    };
                    let what = format!("{name} {kind} {size} B");
                    let point = (|| -> anyhow::Result<Timed> {
                        if comms.is_none() {
                            comms = Some((
                                (self.make)(cfg).context("creating communicators")?,
                                Pools::default(),
                            ));
                        }
                        let Some((comms, pools)) = comms.as_mut() else {
                            bail!("no communicators");
                        };
                        let mut times = Vec::new();
                        let mut choice = String::new();
                        for _ in 0..reps(size) {
                            let (us, c) = once(a, comms, pools, &coll, dt, self.most)?;
                            times.push(us);
                            choice = c;
                        }
                        Ok(Timed {
                            us: oxccl_bench::median(times),
                            choice,
                        })
                    })();
                    match point {
                        Ok(t) => {
                            // As it goes, so a run cut short still leaves its points.
                            eprintln!("# {what}: {:.2} us ({})", t.us, t.choice);
                            p.got.insert((ki, size, *algo), t);
                        }
                        Err(e) => {
                            let why = format!("{e:#}");
                            eprintln!("# {what}: skipped: {why}");
                            // The pick must run, and nothing may be wrong.
                            if algo.is_none() || why.contains("wrong elements") {
                                p.failed += 1;
                            }
                            p.skipped.push((what, why));
                            comms = None;
                        }
                    }
                }
            }
        }
        p
    }

    /// Head to head where the first pass blames the selector: the pick and
    /// the best forced variant, fresh communicators each, measured in
    /// alternation so that drift of the machine falls on both alike.
    /// Returns the first pass's (pick, best) times of the points rechecked.
    fn recheck(
        &self,
        p: &mut Points,
        variants: &[(Option<Algo>, Config)],
        config: &Config,
    ) -> BTreeMap<(usize, usize), (f64, f64)> {
        let mut rechecked = BTreeMap::new();
        for (ki, &kind) in self.colls.iter().enumerate() {
            for &size in self.sizes {
                let Some(coll) = self.coll(kind, size) else {
                    continue;
                };
                // Each contender once: after a recheck the next best may lead.
                let mut done: Vec<Algo> = Vec::new();
                while let (Some(pick), Some((algo, best))) =
                    (p.got.get(&(ki, size, None)), best_of(&p.got, ki, size))
                {
                    if size > SMALL || ratio(pick, best).0 <= RECHECK_ABOVE || done.contains(&algo)
                    {
                        break;
                    }
                    done.push(algo);
                    let Some((_, forced_cfg)) = variants.iter().find(|(x, _)| *x == Some(algo))
                    else {
                        break;
                    };
                    let first = (pick.us, best.us);
                    let cfgs = [config, forced_cfg];
                    match head_to_head(self.a, self.make, cfgs, &coll, self.dt, self.most) {
                        Ok([p2, b2]) => {
                            eprintln!(
                                "# recheck {kind} {size} B: pick {:.2} us ({}) against forced {algo} {:.2} us ({}), alternated",
                                p2.us, p2.choice, b2.us, b2.choice
                            );
                            rechecked.entry((ki, size)).or_insert(first);
                            p.got.insert((ki, size, None), p2);
                            p.got.insert((ki, size, Some(algo)), b2);
                        }
                        Err(e) => {
                            p.skipped
                                .push((format!("recheck {kind} {size} B"), format!("{e:#}")));
                            break;
                        }
                    }
                }
            }
        }
        rechecked
    }

    /// Prints the table, the worst ratio, the noise line and the skipped
    /// points; returns the worst ratio.
    fn table(
        &self,
        p: &Points,
        rechecked: &BTreeMap<(usize, usize), (f64, f64)>,
        out: &mut impl Write,
    ) -> anyhow::Result<f64> {
        let (n, dt) = (self.a.ranks(), self.dt);
        writeln!(
            out,
            "# pick against best forced: {n} ranks, {dt}, out of place, time per call (us)"
        )?;
        writeln!(
            out,
            "# {:<13} {:>10} {:>28} {:>10} {:>28} {:>10} {:>7}  remeasured",
            "collective", "bytes", "pick", "time", "best forced", "time", "ratio"
        )?;
        let mut worst: f64 = 0.0;
        // Time ratios of one configuration measured twice (pick and forced).
        let mut noise: Vec<f64> = Vec::new();
        for (ki, &kind) in self.colls.iter().enumerate() {
            for &size in self.sizes {
                let Some(pick) = p.got.get(&(ki, size, None)) else {
                    continue;
                };
                let Some((_, best)) = best_of(&p.got, ki, size) else {
                    continue;
                };
                let (ratio, remeasured) = ratio(pick, best);
                let note = match (remeasured, rechecked.get(&(ki, size))) {
                    (Some(raw), _) => {
                        noise.push(raw);
                        format!("same ({raw:.3})")
                    }
                    (None, Some((p1, b1))) => {
                        format!("rechecked (first pass {p1:.2} / {b1:.2})")
                    }
                    (None, None) => String::new(),
                };
                worst = worst.max(ratio);
                writeln!(
                    out,
                    "  {:<13} {:>10} {:>28} {:>10.2} {:>28} {:>10.2} {:>7.3}  {}",
                    kind.name(),
                    size,
                    pick.choice,
                    pick.us,
                    best.choice,
                    best.us,
                    ratio,
                    note
                )?;
            }
        }
        writeln!(out, "# worst pick / best: {worst:.3}")?;
        if let (Some(lo), Some(hi)) = (
            noise.iter().copied().reduce(f64::min),
            noise.iter().copied().reduce(f64::max),
        ) {
            writeln!(
                out,
                "# {} points where the best forced variant is the pick's configuration: \
                 its two timings differ by {lo:.3}-{hi:.3}x (the run's noise)",
                noise.len()
            )?;
        }
        for (what, why) in &p.skipped {
            writeln!(out, "# skipped {what}: {why}")?;
        }
        Ok(worst)
    }
}

/// The best forced variant measured at (collective index, size), with its
/// algorithm.
fn best_of(
    got: &BTreeMap<(usize, usize, Option<Algo>), Timed>,
    ki: usize,
    size: usize,
) -> Option<(Algo, &Timed)> {
    got.iter()
        .filter_map(|((k, s, a), t)| ((*k, *s) == (ki, size)).then_some((*a)?).map(|a| (a, t)))
        .min_by(|x, y| x.1.us.total_cmp(&y.1.us))
}

/// One measurement (`-w` + `-n` calls, checked, out of place) of `coll` on
/// `comms`: the time per call in µs and the choice the facade reported
/// (`algo proto (fifo) channels`). Wrong elements are an error.
fn once(
    a: &SweepArgs,
    comms: &[Communicator],
    pools: &mut Pools,
    coll: &Collective,
    dt: DataType,
    most: usize,
) -> anyhow::Result<(f64, String)> {
    let none = crate::nccl_cols::NcclArgs { nccl: false };
    let nccl = crate::nccl_cols::Baseline::open(&none, comms, &mut Vec::new())?;
    let m = with_dtype!(dt, T => {
        let pool = pools.get::<T>(comms, most)?;
        let case = Case { coll, op: RedOp::Sum, in_place: false, a, nccl: &nccl };
        measure::<T>(comms, pool, case)
    })?;
    if m.wrong > 0 {
        bail!(
            "{} wrong elements: {}",
            m.wrong,
            m.first_wrong.unwrap_or_default()
        );
    }
    let choice = comms[0].last_choice().map_or(String::new(), |c| {
        let fifo = if is_direct(c.algo) && !c.is_direct() {
            " (fifo)"
        } else {
            ""
        };
        // A pick of copies only names it: it leaves every SM to compute.
        let sm = if c.sm_free() { " (sm-free)" } else { "" };
        format!("{} {}{fifo} {}ch{sm}", c.algo, c.proto, c.channels)
    });
    Ok((m.time.as_secs_f64() * 1e6, choice))
}

/// The two configurations `cfgs` on fresh communicators each, measured in
/// alternation [`RECHECK_ROUNDS`] times: their medians.
fn head_to_head(
    a: &SweepArgs,
    make: &MakeComms<'_>,
    cfgs: [&Config; 2],
    coll: &Collective,
    dt: DataType,
    most: usize,
) -> anyhow::Result<[Timed; 2]> {
    let mut sides = Vec::new();
    for cfg in cfgs {
        sides.push((
            make(cfg).context("creating communicators")?,
            Pools::default(),
        ));
    }
    let mut times = [Vec::new(), Vec::new()];
    let mut choices = [String::new(), String::new()];
    for _ in 0..RECHECK_ROUNDS {
        for (i, (comms, pools)) in sides.iter_mut().enumerate() {
            let (us, c) = once(a, comms, pools, coll, dt, most)?;
            times[i].push(us);
            choices[i] = c;
        }
    }
    let [t0, t1] = times;
    let [c0, c1] = choices;
    Ok([
        Timed {
            us: oxccl_bench::median(t0),
            choice: c0,
        },
        Timed {
            us: oxccl_bench::median(t1),
            choice: c1,
        },
    ])
}

/// A launch-bound point whose first pass puts the pick more than this far
/// behind a different configuration is measured again head to head.
const RECHECK_ABOVE: f64 = 1.10;

/// Alternated measurements of each side in a recheck (medians compared).
const RECHECK_ROUNDS: usize = 9;

/// Sizes up to this many bytes are launch-bound, where one measurement of
/// `-n` calls scatters by ±30% between runs on 8 ranks' threads.
const SMALL: usize = 4 << 20;

/// How many measurements (each `-w` + `-n` calls, checked) a point's
/// median takes: 5 at launch-bound sizes, where the minimum over ~6 forced
/// variants of single noisy measurements would otherwise beat the pick by
/// chance; 1 above, where two runs agree within 1%.
fn reps(size: usize) -> usize {
    if size <= SMALL {
        5
    } else {
        1
    }
}

/// The pick's time over the best forced variant's, and where both ran the
/// same configuration, 1 with their raw ratio (the noise) beside it.
fn ratio(pick: &Timed, best: &Timed) -> (f64, Option<f64>) {
    let raw = pick.us / best.us.max(1e-9);
    if !pick.choice.is_empty() && pick.choice == best.choice {
        (1.0, Some(raw))
    } else {
        (raw, None)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use oxccl::backend::null::NullBackend;

    use super::*;

    /// Only the same configuration is forgiven its time: a different
    /// algorithm, protocol or channel count 1.5x slower is a 1.5 ratio.
    #[test]
    fn only_the_picks_own_configuration_counts_as_the_best() {
        let t = |us: f64, choice: &str| Timed {
            us,
            choice: choice.into(),
        };
        let pick = t(30.0, "allpairs simple 1ch");
        assert_eq!(
            ratio(&pick, &t(20.0, "allpairs simple 1ch")),
            (1.0, Some(1.5))
        );
        assert_eq!(ratio(&pick, &t(20.0, "allpairs simple 4ch")), (1.5, None));
        assert_eq!(ratio(&pick, &t(20.0, "ring simple 1ch")), (1.5, None));
        assert_eq!(ratio(&pick, &t(20.0, "allpairs ll 1ch")), (1.5, None));
        // A facade that reports no choice is never matched.
        assert_eq!(ratio(&t(30.0, ""), &t(20.0, "")), (1.5, None));
    }

    #[test]
    fn repetitions() {
        assert_eq!((reps(4096), reps(SMALL), reps(SMALL + 1)), (5, 5, 1));
    }

    /// A backend that runs a single channel cannot run the double binary
    /// tree (two channels a plan channel): that variant is skipped with
    /// its reason, and the variants after it (one-shot, two-shot) still
    /// run on fresh communicators; the table and the worst ratio come out.
    #[test]
    fn a_forced_algorithm_the_backend_refuses_is_skipped_not_fatal() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: SweepArgs,
        }
        let args = [
            "sweep", "--pick", "-n", "2", "-w", "1", "-c", "0", "--ranks", "2",
        ];
        let a = <Cli as clap::Parser>::parse_from(args).a;
        let config = Config {
            topology: Some(oxccl_topo::Topology::preset("single-gpu", 1).unwrap()),
            ..Config::default()
        };
        let make = |cfg: &Config| {
            oxccl::init_all_on(2, Arc::new(NullBackend::new(1, 1 << 17)), cfg.clone())
        };
        let mut out = Vec::new();
        let colls = [CollKind::AllReduce, CollKind::Broadcast, CollKind::AllToAll];
        let (worst, points) = run_on(
            &a,
            &colls,
            DataType::F32,
            &[4096, 1 << 20],
            &config,
            &make,
            &mut out,
        )
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(worst > 0.0, "{out}");
        // Every point but the tree's ran, the forced variants after the
        // tree's included: the pick 3 × 2; AllReduce ring, chain, btree,
        // oneshot, twoshot, ll1 (the FIFO one-shot on a backend without
        // the path); Broadcast ring, chain, btree, allpairs, ce; AllToAll
        // ring, allpairs, ce; each at 2 sizes.
        assert_eq!(points, 6 + 2 * (6 + 5 + 3), "{out}");
        let skipped: Vec<&str> = out.lines().filter(|l| l.starts_with("# skipped")).collect();
        assert_eq!(skipped.len(), 2, "{out}");
        for l in skipped {
            assert!(l.contains("forced tree allreduce"), "{l}");
            assert!(l.contains("at most 1 channels"), "{l}");
        }
        // One row per (collective, size).
        let rows = out.lines().filter(|l| l.starts_with("  ")).count();
        assert_eq!(rows, 6, "{out}");
    }
}
