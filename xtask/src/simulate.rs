//! `cargo xtask simulate`: predicted time and bus bandwidth at scale, from
//! the cost model, for ring, tree, double binary tree and the pick.

use oxccl_core::{Algo, CollKind, Proto};
use oxccl_topo::select::Selector;
use oxccl_topo::{NetPlacement, Policy, Topology, Transport};
use plotters::prelude::*;

use crate::topo::{channel_cap, human, placement};

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Built-in machine to repeat on every host.
    #[arg(long, default_value = "hgx-h100")]
    pub preset: String,
    /// Host counts, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64,128,256,512,1024"
    )]
    pub nodes: Vec<u32>,
    /// Collective.
    #[arg(long, default_value = "allreduce")]
    pub coll: String,
    /// Ranks per GPU.
    #[arg(long, default_value_t = 1)]
    pub ranks_per_gpu: u32,
    /// Protocols the pick may use, comma separated (ll128 is modelled, but
    /// no backend runs it yet).
    #[arg(long, value_delimiter = ',', default_value = "simple,ll")]
    pub protos: Vec<String>,
    /// Instead of the preset: ranks as processes over a network of this
    /// many GB/s per host (the host backend's model, `Policy::network`),
    /// `--ranks-per-gpu` of them per host; one rank per host is also what
    /// ranks of one machine forced onto the network are. Compare with
    /// `xtask sweep --procs N` over the transport (its `--baseline` is one
    /// TCP stream's GB/s).
    #[arg(long)]
    pub net: Option<f64>,
    /// With `--net`: one network hop's latency in µs (default: the model's
    /// NET constant).
    #[arg(long)]
    pub net_hop_us: Option<f64>,
    /// Also plot busbw against size (one line per host count, the pick) and
    /// small-message time against ranks (ring, trees, pick) to this SVG.
    #[arg(long)]
    pub svg: Option<String>,
}

/// Columns named as `NCCL_ALGO` names them (`Algo::name`): `btree` is the
/// binary tree, `tree` NCCL's double binary tree.
const COLUMNS: [(&str, Option<Algo>); 4] = [
    (Algo::Ring.name(), Some(Algo::Ring)),
    (Algo::BinaryTree.name(), Some(Algo::BinaryTree)),
    (Algo::DoubleBinaryTree.name(), Some(Algo::DoubleBinaryTree)),
    ("pick", None),
];

/// `algo`'s time as the selector would run it alone: its better protocol
/// and the channel count the selector's own rule gives it (the pick's rule,
/// so the pick is never slower than a column).
fn best(
    sel: &Selector,
    kind: CollKind,
    algo: Algo,
    protos: &[Proto],
    bytes: usize,
    n: u32,
) -> Option<f64> {
    let pairs: Vec<(Algo, Proto)> = protos.iter().map(|&p| (algo, p)).collect();
    sel.choose_among(kind, bytes, n, &pairs)
        .and_then(|c| c.predicted_us)
}

pub fn run(a: SimulateArgs) -> anyhow::Result<()> {
    let kind: CollKind = a.coll.parse()?;
    let protos: Vec<Proto> = a
        .protos
        .iter()
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    let sizes: Vec<usize> = (0..=31).map(|i| 8usize << i).collect();
    let mut curves: Vec<(u32, Vec<(f64, f64)>)> = Vec::new();
    let mut small: Vec<(u32, [Option<f64>; 4])> = Vec::new();
    for &nodes in &a.nodes {
        let (sel, what, n) = match a.net {
            Some(bw) => (
                net_selector(nodes, a.ranks_per_gpu, bw, a.net_hop_us),
                format!("processes over a {bw} GB/s network"),
                nodes.max(1) * a.ranks_per_gpu.max(1),
            ),
            None => {
                let t = Topology::preset(&a.preset, nodes)?;
                let ranks = placement(&t, a.ranks_per_gpu);
                let n = ranks.len() as u32;
                (
                    gpu_selector(&t, &ranks, a.ranks_per_gpu),
                    a.preset.clone(),
                    n,
                )
            }
        };
        println!("\n{what} × {nodes} host(s), {n} ranks, {kind}: time µs / busbw GB/s");
        print!("{:>9}", "size");
        for (name, _) in COLUMNS {
            print!(" {:>20}", name);
        }
        println!("  pick");
        let mut curve = Vec::new();
        for (i, &b) in sizes.iter().enumerate() {
            let pick = sel.choose(kind, b, n, &Algo::ALL, &protos);
            let cell = |t: Option<f64>| match t {
                Some(t) => format!(
                    "{t:>10.1} /{:>7.1}",
                    b as f64 / (t * 1000.0) * kind.busbw_factor(n)
                ),
                None => format!("{:>20}", "-"),
            };
            let times: Vec<Option<f64>> = COLUMNS
                .iter()
                .map(|(_, algo)| match algo {
                    Some(algo) => best(&sel, kind, *algo, &protos, b, n),
                    None => pick.predicted_us,
                })
                .collect();
            if i == 0 {
                small.push((n, [times[0], times[1], times[2], times[3]]));
            }
            curve.push((
                b as f64,
                b as f64 / (pick.us() * 1000.0) * kind.busbw_factor(n),
            ));
            // Print every other size to keep the table readable.
            if i % 2 == 0 || i == sizes.len() - 1 {
                print!("{:>9}", human(b));
                for t in &times {
                    print!(" {}", cell(*t));
                }
                println!("  {}/{}/{}ch", pick.algo, pick.proto, pick.channels);
            }
        }
        curves.push((nodes, curve));
    }
    println!("\n8-byte {kind} time (µs) by ranks: ring grows linearly, trees logarithmically");
    println!(
        "{:>7} {:>10} {:>10} {:>10} {:>10}",
        "ranks", COLUMNS[0].0, COLUMNS[1].0, COLUMNS[2].0, COLUMNS[3].0
    );
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    for (n, t) in &small {
        println!(
            "{:>7} {:>10} {:>10} {:>10} {:>10}",
            n,
            f(t[0]),
            f(t[1]),
            f(t[2]),
            f(t[3])
        );
    }
    if let Some(path) = &a.svg {
        plot(path, &a.preset, kind, &curves, &small)?;
        println!("\nwrote {path}");
    }
    Ok(())
}

/// The CUDA communicator's selector of FIFO plans for `ranks` on `t`
/// (`Policy::gpu`: its channel cap, and the built-in calibration where
/// ranks share a GPU), as `xtask topo --explain --plain` tables it.
fn gpu_selector(t: &Topology, ranks: &[usize], per_gpu: u32) -> Selector {
    Policy::gpu(t, ranks, channel_cap(t, per_gpu).0)
        .selector(false, Algo::Ring, Transport::Fifo)
        .clone()
}

/// The host backend's selector for `nodes` hosts of `per_host` rank
/// processes each over a network of `bw` GB/s (four channels, the
/// transport's default).
fn net_selector(nodes: u32, per_host: u32, bw: f64, hop_us: Option<f64>) -> Selector {
    let host_of: Vec<u32> = (0..nodes.max(1))
        .flat_map(|h| std::iter::repeat_n(h, per_host.max(1) as usize))
        .collect();
    let p = NetPlacement {
        host_of,
        bw,
        hop_us,
        device: None,
    };
    Policy::network(&p, oxccl_topo::policy::NET_CHANNELS_TO_FILL as u32)
        .selector(false, Algo::Ring, Transport::Fifo)
        .clone()
}

fn plot(
    path: &str,
    preset: &str,
    kind: CollKind,
    curves: &[(u32, Vec<(f64, f64)>)],
    small: &[(u32, [Option<f64>; 4])],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let max_bw = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let mut ch = ChartBuilder::on(&left)
        .caption(
            format!("{preset}: predicted {kind} busbw (pick)"),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((8f64..(16u64 << 30) as f64).log_scale(), 0f64..max_bw * 1.1)?;
    ch.configure_mesh()
        .x_desc("bytes")
        .y_desc("busbw GB/s")
        .x_label_formatter(&|v| human(*v as usize))
        .draw()?;
    for (i, (nodes, c)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        ch.draw_series(LineSeries::new(c.iter().copied(), color))?
            .label(format!("{nodes} host(s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    ch.configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    let max_n = small.iter().map(|s| s.0).max().unwrap_or(1).max(2) as f64;
    let max_t = small
        .iter()
        .flat_map(|s| s.1.iter().flatten().copied())
        .fold(1.0, f64::max);
    let mut ch = ChartBuilder::on(&right)
        .caption(format!("{preset}: 8-byte {kind} time"), ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (1f64..max_n * 1.2).log_scale(),
            (1f64..max_t * 1.5).log_scale(),
        )?;
    ch.configure_mesh().x_desc("ranks").y_desc("µs").draw()?;
    for (k, (name, _)) in COLUMNS.iter().enumerate() {
        let color = Palette99::pick(k + 3).to_rgba();
        let pts: Vec<(f64, f64)> = small
            .iter()
            .filter_map(|s| Some((f64::from(s.0), s.1[k]?)))
            .collect();
        ch.draw_series(LineSeries::new(pts, color))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    ch.configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pick is never slower than a column (both follow the selector's
    /// rule), on presets across hosts and on ranks sharing one GPU (the
    /// calibrated policy).
    #[test]
    fn the_pick_is_each_rows_minimum() {
        let protos = [Proto::Simple, Proto::LL];
        for (preset, nodes, per_gpu) in [
            ("hgx-h100", 64, 1),
            ("pcie-8gpu", 2, 1),
            ("single-gpu", 1, 8),
        ] {
            let t = Topology::preset(preset, nodes).unwrap();
            let ranks = placement(&t, per_gpu);
            let n = ranks.len() as u32;
            let sel = gpu_selector(&t, &ranks, per_gpu);
            for kind in [
                CollKind::AllReduce,
                CollKind::AllGather,
                CollKind::Broadcast,
            ] {
                for b in (0..=31).map(|i| 8usize << i) {
                    let pick = sel.choose(kind, b, n, &Algo::ALL, &protos).us();
                    for (_, algo) in COLUMNS {
                        if let Some(t) = algo.and_then(|a| best(&sel, kind, a, &protos, b, n)) {
                            assert!(
                                pick <= t * (1.0 + 1e-9),
                                "{preset} {kind} {b} B: pick {pick} > {algo:?} {t}"
                            );
                        }
                    }
                }
            }
        }
    }
}
