//! `sweep --pick`: the selector's pick against every algorithm forced, in
//! the same run, per collective and size, so anyone can check the
//! selector on their machine. For each variant (the selector's own
//! choice, then each algorithm alone through the algorithm filter, the
//! selector still choosing its protocol and channels) a fresh set of
//! communicators runs every collective and size of the sweep out of
//! place, checked; the table prints, per (collective, size), the pick's
//! time, the best forced algorithm's and their ratio, and the worst
//! ratio last.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{bail, Context};
use oxccl::core::{gen, with_dtype, Algo, Collective};
use oxccl::{CollKind, Config, DataType, RedOp};
use oxccl_topo::consts::is_direct;

use super::{count_for, largest_elems, measure, Pools, SweepArgs};

/// What one variant measured for one (collective, size).
#[derive(Clone, Debug)]
struct Timed {
    us: f64,
    /// The choice the facade reported (`algo proto (fifo) channels`).
    choice: String,
}

/// Runs the comparison and prints its table; returns the worst ratio.
pub(crate) fn run(
    a: &SweepArgs,
    colls: &[CollKind],
    dt: DataType,
    sizes: &[usize],
    config: &Config,
    out: &mut impl Write,
) -> anyhow::Result<f64> {
    let n = a.ranks;
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
    let mut got: BTreeMap<(usize, usize, Option<Algo>), Timed> = BTreeMap::new();
    let none = crate::nccl_cols::NcclArgs { nccl: false };
    for (algo, cfg) in &variants {
        let comms = oxccl::init_all_with(n, cfg.clone()).context("creating communicators")?;
        let nccl = crate::nccl_cols::Baseline::open(&none, &comms, out)?;
        let mut pools = Pools::default();
        for (ki, &kind) in colls.iter().enumerate() {
            if algo.is_some_and(|x| !gen::supports(x, kind)) {
                continue;
            }
            for &size in sizes {
                let Some(count) = count_for(kind, size, dt.size(), n) else {
                    continue;
                };
                let coll = Collective::new(kind, count, if kind.has_root() { a.root } else { 0 });
                let m = with_dtype!(dt, T => {
                    let most = largest_elems(&colls, sizes, dt.size(), n);
                    let pool = pools.get::<T>(&comms, most)?;
                    measure::<T>(&comms, pool, &coll, RedOp::Sum, false, a, &nccl)
                })?;
                if m.wrong > 0 {
                    bail!(
                        "{kind} {size} B with {}: {} wrong elements",
                        algo.map_or("the pick".into(), |x| x.name().to_string()),
                        m.wrong
                    );
                }
                let choice = comms[0].last_choice().map_or(String::new(), |c| {
                    let fifo = if is_direct(c.algo) && !c.is_direct() {
                        " (fifo)"
                    } else {
                        ""
                    };
                    format!("{} {}{fifo} {}ch", c.algo, c.proto, c.channels)
                });
                let us = m.time.as_secs_f64() * 1e6;
                // As it goes, so a run cut short still leaves its points.
                eprintln!(
                    "# {} {kind} {size} B: {us:.2} us ({choice})",
                    algo.map_or("pick".into(), |x| format!("forced {x}"))
                );
                got.insert((ki, size, *algo), Timed { us, choice });
            }
        }
    }
    writeln!(
        out,
        "# pick against best forced: {n} ranks, {dt}, out of place, time per call (us)"
    )?;
    writeln!(
        out,
        "# {:<13} {:>10} {:>28} {:>10} {:>28} {:>10} {:>7}",
        "collective", "bytes", "pick", "time", "best forced", "time", "ratio"
    )?;
    let mut worst: f64 = 0.0;
    for (ki, &kind) in colls.iter().enumerate() {
        for &size in sizes {
            let Some(pick) = got.get(&(ki, size, None)) else {
                continue;
            };
            let best = got
                .iter()
                .filter(|((k, s, a), _)| (*k, *s) == (ki, size) && a.is_some())
                .min_by(|x, y| x.1.us.total_cmp(&y.1.us));
            let Some((_, best)) = best else { continue };
            let ratio = pick.us / best.us.max(1e-9);
            worst = worst.max(ratio);
            writeln!(
                out,
                "  {:<13} {:>10} {:>28} {:>10.2} {:>28} {:>10.2} {:>7.3}",
                kind.name(),
                size,
                pick.choice,
                pick.us,
                best.choice,
                best.us,
                ratio
            )?;
        }
    }
    writeln!(out, "# worst pick / best: {worst:.3}")?;
    Ok(worst)
}
