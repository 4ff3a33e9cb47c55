//! `cargo xtask topo`: a machine's topology (live, from NCCL XML or a
//! preset), the rings and trees chosen on it, and with `--explain` the
//! model's predicted time per algorithm and protocol.

use anyhow::Context as _;
use oxccl_core::{Algo, CollKind, Proto};
use oxccl_topo::policy::{Launcher, Policy};
use oxccl_topo::search::{children, double_binary_tree};
use oxccl_topo::select::Selector;
use oxccl_topo::Topology;

#[derive(Debug, clap::Args)]
pub struct TopoArgs {
    /// Read an NCCL topology XML file instead of detecting.
    #[arg(long, conflicts_with = "preset")]
    pub file: Option<String>,
    /// Use a built-in machine (dgx1, dgx-a100, hgx-h100, hgx-h200, hgx-b200,
    /// pcie-8gpu, nvlink-bridge, single-gpu).
    #[arg(long)]
    pub preset: Option<String>,
    /// Hosts (presets only).
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Ranks per GPU (several ranks on one GPU).
    #[arg(long, default_value_t = 1)]
    pub ranks_per_gpu: u32,
    /// Write the topology as NCCL XML.
    #[arg(long)]
    pub dump: Option<String>,
    /// Table of predicted times for this collective (e.g. allreduce), as
    /// the communicator's selector sees them on buffers from `comm.alloc`.
    #[arg(long)]
    pub explain: Option<String>,
    /// With `--explain`: on plain buffers (not registered), where only
    /// FIFO plans run.
    #[arg(long, requires = "explain")]
    pub plain: bool,
    /// With `--explain`: each rank a process of its own (the CUDA
    /// backend's process cliques), not threads of one process.
    #[arg(long, requires = "explain")]
    pub processes: bool,
}

/// SMs assumed for a GPU whose topology does not say (an NCCL XML file
/// or a preset): an H100's and an H200's.
const DEFAULT_SMS: u32 = 132;

/// The channel cap the CUDA backend gives each rank: its share of the
/// GPU's SMs (one block per channel), 1 to 32; the SM count, and whether
/// the topology gave it.
pub fn channel_cap(t: &Topology, per_gpu: u32) -> (u32, u32, bool) {
    let sms = t
        .gpus()
        .first()
        .and_then(|&g| t.nodes[g].gpu.as_ref())
        .and_then(|g| g.attrs.get("sm_count"))
        .and_then(|s| s.parse::<u32>().ok());
    let n = sms.unwrap_or(DEFAULT_SMS);
    (
        oxccl_topo::policy::gpu_channel_cap(n, per_gpu),
        n,
        sms.is_some(),
    )
}

/// Loads the topology the flags name; without one, this machine (sysfs,
/// NVML and the CUDA driver, or the file `OXCCL_TOPO_FILE` names).
pub fn load(file: Option<&str>, preset: Option<&str>, nodes: u32) -> anyhow::Result<Topology> {
    Ok(match (file, preset) {
        (Some(f), _) => Topology::from_xml_file(f).with_context(|| format!("reading {f}"))?,
        (None, Some(p)) => Topology::preset(p, nodes)?,
        (None, None) => oxccl::detect_topology(),
    })
}

/// Rank r → GPU index, `per_gpu` ranks on each GPU (one rank when there is
/// no GPU at all).
pub fn placement(t: &Topology, per_gpu: u32) -> Vec<usize> {
    let n = t.gpus().len().max(1);
    (0..n * per_gpu.max(1) as usize)
        .map(|r| r / per_gpu.max(1) as usize)
        .collect()
}

/// Human size: 8 B, 64 KiB, 1 GiB.
pub fn human(b: usize) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.0} {}", U[i])
}

pub fn run(a: TopoArgs) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OXCCL_DEBUG")
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let t = load(a.file.as_deref(), a.preset.as_deref(), a.nodes)?;
    let source = match (&a.file, &a.preset) {
        (Some(f), _) => format!("file {f}"),
        (None, Some(p)) => format!("preset {p} × {} host(s)", a.nodes),
        (None, None) => "this machine".to_string(),
    };
    println!("Topology of {source}");
    print!("{}", t.summary());
    println!();
    let hosts = t.nhosts().max(1);
    // Hosts are alike in presets; show the first and say so.
    print!("{}", t.matrix_report(0));
    if hosts > 1 {
        println!(
            "(hosts 1..{} are laid out like host0; between hosts every path is NET)",
            hosts - 1
        );
    }
    if let Some(path) = &a.dump {
        t.to_xml_file(path)?;
        println!("\nwrote {path}");
    }
    if t.gpus().is_empty() {
        println!("\n0 GPUs: no rings or trees to choose (set OXCCL_DEBUG=WARN to see what detection missed)");
        return Ok(());
    }
    let ranks = placement(&t, a.ranks_per_gpu);
    let nranks = ranks.len() as u32;
    let sel = Selector::new(&t, &ranks);
    let rs = sel.ring_set();
    println!(
        "\nRings ({} rank(s) on {} host(s)): {} distinct, {:.1} GB/s each, {:.1} GB/s in all, {}",
        nranks,
        sel.shape().nnodes,
        rs.rings.len(),
        rs.bw_per_ring,
        rs.total_bw(),
        if rs.nvlink_only {
            "NVLink hops only"
        } else {
            "PCIe/SYS hops used"
        }
    );
    for (c, r) in sel.rings().iter().take(rs.rings.len().max(1)).enumerate() {
        let shown: Vec<String> = r.iter().take(32).map(u32::to_string).collect();
        let more = if r.len() > 32 { " ..." } else { "" };
        println!("  ring {c}: {}{more}", shown.join(" "));
    }
    let chain: Vec<String> = sel.rings()[0]
        .iter()
        .take(sel.shape().ranks_per_node as usize)
        .map(u32::to_string)
        .collect();
    println!("Trees: inside a host the chain {}", chain.join(" → "));
    let nn = sel.shape().nnodes as usize;
    if nn > 1 {
        let [t0, t1] = double_binary_tree(nn);
        for (k, tree) in [t0, t1].iter().enumerate() {
            let ch = children(tree);
            let root = tree.iter().position(Option::is_none).unwrap_or(0);
            let show: Vec<String> = (0..nn.min(16))
                .map(|h| format!("{h}→{}", tree[h].map_or("root".into(), |p| p.to_string())))
                .collect();
            println!(
                "  tree {k} across hosts (root {root}, {} leaves): {}{}",
                ch.iter().filter(|c| c.is_empty()).count(),
                show.join(" "),
                if nn > 16 { " ..." } else { "" }
            );
        }
    } else {
        println!("  one host: the double binary tree is that chain");
    }
    if let Some(coll) = &a.explain {
        let kind: CollKind = coll.parse()?;
        let (cap, sms, known) = channel_cap(&t, a.ranks_per_gpu);
        let launcher = if a.processes {
            Launcher::ProcessPerRank
        } else {
            Launcher::OneProcess
        };
        let policy = Policy::gpu_launched(&t, &ranks, cap, launcher);
        print!("{}", explain(&policy, kind, nranks, !a.plain));
        println!(
            "(channel cap {cap} per rank: {} SMs / {} {} per GPU{}; {} buffers{})",
            sms,
            a.ranks_per_gpu.max(1),
            if a.processes {
                "rank process(es)"
            } else {
                "rank thread(s)"
            },
            if known { "" } else { ", SM count assumed" },
            if a.plain {
                "plain"
            } else {
                "registered (comm.alloc)"
            },
            if a.plain {
                ""
            } else {
                "; --plain for FIFO plans only"
            }
        );
    }
    Ok(())
}

/// The protocols backends run (LL128 is modelled, run by none).
const RUNNABLE: [Proto; 2] = [Proto::Simple, Proto::LL];

/// `--explain`: per size, each algorithm's predicted time as the
/// communicator's policy would run it on `registered` buffers or not (its
/// better runnable protocol, `S`imple or `L`L, its transport and the
/// channel count the policy gives it), so the starred pick is its row's
/// minimum and what the communicator picks; one column per algorithm that
/// serves `kind`, under 120 columns.
fn explain(policy: &Policy, kind: CollKind, nranks: u32, registered: bool) -> String {
    use std::fmt::Write as _;
    // The policy's best among one algorithm, or `None` where the model
    // times none of its plans (the policy then falls back to the ring).
    let alone = |a: Algo, b: usize| {
        let c = policy.best(kind, b, registered, &[a], &RUNNABLE);
        (c.algo == a && c.predicted_us.is_some()).then_some(c)
    };
    let algos: Vec<Algo> = Algo::ALL
        .into_iter()
        .filter(|&a| alone(a, 1024).is_some())
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nPredicted {kind} time (µs) on {nranks} ranks, each algorithm as the communicator \
         runs it (S simple, L ll, D direct; its channel count); * the pick"
    );
    let _ = write!(out, "{:>9}", "size");
    for a in &algos {
        let _ = write!(out, " {:>10}", a.name());
    }
    let _ = writeln!(out, "  {:>26} {:>10}", "pick", "busbw GB/s");
    let mut b = 8usize;
    while b <= 16 << 30 {
        let pick = policy.best(kind, b, registered, &algos, &RUNNABLE);
        let _ = write!(out, "{:>9}", human(b));
        for &a in &algos {
            let cell = alone(a, b).map_or("-".to_string(), |c| {
                let p = match (c.is_direct(), c.proto) {
                    (true, _) => 'D',
                    (false, Proto::LL) => 'L',
                    (false, _) => 'S',
                };
                let mark = if a == pick.algo { '*' } else { ' ' };
                format!("{:.1}{p}{mark}", c.us())
            });
            let _ = write!(out, " {cell:>10}");
        }
        let busbw = b as f64 / (pick.us() * 1000.0) * kind.busbw_factor(nranks);
        let how = if pick.is_direct() { "direct" } else { "fifo" };
        let _ = writeln!(
            out,
            "  {:>26} {:>10.1}",
            format!("{}/{}/{}ch/{how}", pick.algo, pick.proto, pick.channels),
            busbw
        );
        b *= 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row fits 120 columns and its starred cell is its minimum and
    /// the pick's own time, for every collective on two machines.
    #[test]
    fn explain_stars_each_rows_minimum_within_120_columns() {
        let cases = [
            ("hgx-h100", 1, 1, false),
            ("hgx-h100", 4, 1, true),
            ("pcie-8gpu", 1, 1, false),
            // Ranks sharing a GPU: the calibrated policy, both buffers.
            ("single-gpu", 1, 8, true),
            ("single-gpu", 1, 8, false),
            ("single-gpu", 1, 128, true),
        ];
        for (preset, nodes, per_gpu, registered) in cases {
            let t = Topology::preset(preset, nodes).unwrap();
            let ranks = placement(&t, per_gpu);
            let policy = Policy::gpu(&t, &ranks, channel_cap(&t, per_gpu).0);
            for kind in CollKind::ALL {
                let text = explain(&policy, kind, ranks.len() as u32, registered);
                let mut rows = 0;
                for line in text.lines().skip(3) {
                    assert!(line.chars().count() <= 120, "{kind}: {line}");
                    let cells: Vec<(f64, bool)> = line
                        .split_whitespace()
                        .filter(|w| w.ends_with(['S', 'L', 'D', '*']))
                        .filter_map(|w| {
                            let star = w.ends_with('*');
                            let w = w.trim_end_matches('*');
                            Some((w[..w.len() - 1].parse().ok()?, star))
                        })
                        .collect();
                    let starred: Vec<f64> = cells.iter().filter(|c| c.1).map(|c| c.0).collect();
                    assert_eq!(starred.len(), 1, "{preset} {kind}: {line}");
                    let min = cells.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
                    assert_eq!(starred[0], min, "{preset} {kind}: {line}");
                    rows += 1;
                }
                assert_eq!(rows, 32, "{preset} {kind}:\n{text}");
            }
        }
    }
}
