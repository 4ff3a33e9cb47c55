//! What the sweep prints and writes: nccl-tests' table (headers and
//! rows), the summary lines, the JSON report and the floor ratio's bytes.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use oxccl::core::Collective;
use oxccl::{CollKind, DataType, RedOp};
use serde::Serialize;

use super::external;

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
    /// Whether the row's calls launched no kernel and ran as copy-engine
    /// copies (`None`: the backend counts no launches).
    pub sm_free: Option<bool>,
    /// NCCL on the same buffers (with `--nccl`).
    #[serde(flatten)]
    pub nccl: crate::nccl_cols::NcclCols,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report<'a> {
    pub(crate) machine: String,
    pub(crate) backend: String,
    pub(crate) nranks: u32,
    pub(crate) copy_gbps: Option<f64>,
    pub(crate) nccl: Option<String>,
    pub(crate) nccl_latency_us: Option<(f64, f64)>,
    pub(crate) results: &'a [Row],
}

/// Bytes every rank must at least read and write in the busiest memory,
/// summed over the `m` of the `n` ranks that share it, for nccl-tests'
/// size `s` (see the module docs; the formulas are per rank, times `m`).
pub fn floor_bytes(kind: CollKind, n: u32, m: u32, s: f64, in_place: bool) -> f64 {
    let (n, m) = (f64::from(n.max(1)), f64::from(m.clamp(1, n.max(1))));
    match kind {
        // Read the input, write the output.
        CollKind::AllReduce | CollKind::SendRecv => 2.0 * m * s,
        // In place each rank's own block is already where it belongs.
        CollKind::AllToAll if in_place => 2.0 * m * s * (n - 1.0) / n,
        CollKind::AllToAll => 2.0 * m * s,
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
        // block written or read once: 2·S over the whole clique, M/N of it
        // here. In place the root's own block is already in place.
        CollKind::Gather | CollKind::Scatter if in_place => 2.0 * s * m / n * (n - 1.0) / n,
        CollKind::Gather | CollKind::Scatter => 2.0 * s * m / n,
    }
}

pub(crate) fn progress(show: bool, total: u64) -> indicatif::ProgressBar {
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

pub(crate) fn header(
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

pub(crate) fn format_row(
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

/// The `--sm-free` column of a table line: `yes`, `no` or `-` for each
/// of its rows (out of place / in place).
pub(crate) fn sm_free_cell(pair: &[Row]) -> String {
    let cells: Vec<&str> = pair
        .iter()
        .map(|r| match r.sm_free {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        })
        .collect();
    format!("  {:>7}", cells.join("/"))
}

/// `hostname, N cores, CPU model`.
pub(crate) fn machine() -> String {
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

/// The summary after the table, as nccl-tests prints it, plus the worst
/// external/alloc ratio where both memories ran; returns the wrong
/// elements of every row.
pub(crate) fn summary(out: &mut dyn Write, rows: &[Row]) -> anyhow::Result<u64> {
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
    if let Some(w) = external::worst_ratio(rows) {
        writeln!(out, "# external / alloc time, worst row: {w}")?;
    }
    Ok(wrong)
}

/// Writes the JSON report to `path`.
pub(crate) fn write_json(path: &Path, rep: &Report<'_>) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(rep)?)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // In place the root's own block (Gather, Scatter) and each rank's
        // own block (AllToAll) stay put: 7/8 of the traffic.
        assert_eq!(floor_bytes(CollKind::Gather, 8, 8, s, true), 1.75 * s);
        assert_eq!(floor_bytes(CollKind::Scatter, 8, 8, s, true), 1.75 * s);
        assert_eq!(floor_bytes(CollKind::AllToAll, 8, 8, s, true), 14.0 * s);
        assert_eq!(floor_bytes(CollKind::AllToAll, 8, 8, s, false), 16.0 * s);
        // Two GPUs of four ranks each: the busiest memory holds half.
        assert_eq!(floor_bytes(CollKind::AllReduce, 8, 4, s, false), 8.0 * s);
    }
}
