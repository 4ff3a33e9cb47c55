//! Calibration: fit the model's constants to a measured sweep.
//!
//! The sweep (`cargo xtask sweep --json FILE`) writes one JSON object with
//! `nranks` and `results`, each result naming its collective, algorithm,
//! protocol, channel count, size and time. For each (algorithm, protocol)
//! we take the latency as the median time of the small sizes (≤ 4 KiB) and
//! the per-byte cost as the median slope of the large ones (the top four
//! octaves), compare both with the model's prediction for the same call,
//! and store the difference (latency) and ratio (bandwidth) as fitted
//! corrections in [`Constants::fitted`].

use oxccl_core::{Algo, CollKind, Proto};
use serde::Deserialize;

use std::collections::BTreeSet;

use crate::consts::Constants;
use crate::error::Result;
use crate::graph::Topology;
use crate::select::Selector;

/// A sweep file. Unknown fields are ignored.
#[derive(Clone, Debug, Deserialize)]
pub struct Sweep {
    #[serde(default)]
    pub machine: String,
    #[serde(default)]
    pub backend: String,
    pub nranks: u32,
    pub results: Vec<SweepResult>,
    /// (collective, algorithm) pairs the selector must not pick on this
    /// machine, each with why (see [`Constants::avoid`]).
    #[serde(default)]
    pub avoid: Vec<Avoid>,
}

/// A variant the selector must not pick, and why.
#[derive(Clone, Debug, Deserialize)]
pub struct Avoid {
    pub coll: String,
    pub algo: String,
    #[serde(default)]
    pub why: String,
}

/// One measured point.
#[derive(Clone, Debug, Deserialize)]
pub struct SweepResult {
    pub coll: String,
    pub bytes: u64,
    pub algo: String,
    pub proto: String,
    #[serde(default = "one")]
    pub channels: u32,
    pub time_us: f64,
    #[serde(default)]
    pub wrong: u64,
}

fn one() -> u32 {
    1
}

/// Parses sweep JSON.
pub fn parse_sweep(text: &str) -> Result<Sweep> {
    Ok(serde_json::from_str(text)?)
}

/// Reads a sweep JSON file.
pub fn load_sweep(path: impl AsRef<std::path::Path>) -> Result<Sweep> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| crate::TopoError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_sweep(&text)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Some(v[v.len() / 2])
}

/// Fits corrections for every (algorithm, protocol) the sweep measured,
/// and for every (collective, algorithm, protocol), on top of `selector`'s
/// constants, for the placement `selector` models (it should be the
/// machine the sweep ran on). The bandwidth multiplier is the median, over
/// the large points, of the model's per-byte cost for the point's
/// collective over the measured one; chain and trees, if unmeasured, take
/// the ring's correction. Points with wrong results, or naming
/// an unknown collective/algorithm/protocol, are skipped; the sweep's
/// `avoid` entries are copied into [`Constants::avoid`].
pub fn fit(selector: &Selector, sweep: &Sweep) -> Constants {
    let base = Constants {
        fitted: Vec::new(),
        fitted_coll: Vec::new(),
        avoid: Vec::new(),
        ..selector.constants().clone()
    };
    let model = selector.clone().with_constants(base.clone());
    let mut points: Vec<Point> = Vec::new();
    for r in sweep
        .results
        .iter()
        .filter(|r| r.wrong == 0 && r.time_us > 0.0)
    {
        let (Ok(kind), Ok(algo), Ok(proto)) = (
            r.coll.parse::<CollKind>(),
            r.algo.parse::<Algo>(),
            r.proto.parse::<Proto>(),
        ) else {
            continue;
        };
        let predict = |b: usize| model.predict(kind, algo, proto, r.channels, b, sweep.nranks);
        let (Some(p0), Some(p)) = (predict(0), predict(r.bytes as usize)) else {
            continue;
        };
        points.push(Point {
            kind,
            algo,
            proto,
            bytes: r.bytes as f64,
            // Time above the model's latency: small sizes give the latency
            // correction, large ones the per-byte cost.
            excess: r.time_us - p0,
            model_slope: (p - p0) / (r.bytes.max(1) as f64),
        });
    }
    let mut out = base;
    let pairs: BTreeSet<(Algo, Proto)> = points.iter().map(|p| (p.algo, p.proto)).collect();
    for (algo, proto) in pairs {
        let (lat, bw) = fit_group(points.iter().filter(|p| (p.algo, p.proto) == (algo, proto)));
        out.fitted.push((algo, proto, lat, bw));
    }
    let triples: BTreeSet<(CollKind, Algo, Proto)> =
        points.iter().map(|p| (p.kind, p.algo, p.proto)).collect();
    for (kind, algo, proto) in triples {
        let (lat, bw) = fit_group(
            points
                .iter()
                .filter(|p| (p.kind, p.algo, p.proto) == (kind, algo, proto)),
        );
        out.fitted_coll.push((kind, algo, proto, lat, bw));
    }
    // Chain and trees go through FIFOs as the ring does; unmeasured,
    // they take its correction.
    out.ring_correction_for_unfitted(&[Algo::Chain, Algo::BinaryTree, Algo::DoubleBinaryTree]);
    out.avoid = sweep
        .avoid
        .iter()
        .filter_map(|a| Some((a.coll.parse().ok()?, a.algo.parse().ok()?)))
        .collect();
    out
}

/// One measured point against the uncorrected model.
struct Point {
    kind: CollKind,
    algo: Algo,
    proto: Proto,
    bytes: f64,
    excess: f64,
    model_slope: f64,
}

/// (latency added, bandwidth multiplier) of one group of points: the
/// median excess of the small sizes (≤ 4 KiB), and the median ratio of
/// model to measured per-byte cost over the top four octaves.
fn fit_group<'a>(pts: impl Iterator<Item = &'a Point> + Clone) -> (f64, f64) {
    let max_b = pts.clone().map(|p| p.bytes).fold(0.0, f64::max);
    let lat_add = median(
        pts.clone()
            .filter(|p| p.bytes <= 4096.0)
            .map(|p| p.excess)
            .collect(),
    )
    .unwrap_or(0.0);
    let ratios = pts
        .filter(|p| p.bytes >= max_b / 16.0 && p.bytes > 4096.0)
        .filter_map(|p| {
            let measured = (p.excess - lat_add) / p.bytes;
            (measured > 0.0 && p.model_slope > 0.0).then(|| p.model_slope / measured)
        })
        .collect();
    (lat_add, median(ratios).unwrap_or(1.0))
}

/// The sweep of the built-in calibration: 8 ranks sharing one H200 on
/// registered buffers (`comm.alloc`), measured 2026-12-02; each point
/// names its source. See the file's `provenance`.
pub const H200_SHARED_GPU: &str = include_str!("../calib/h200-1gpu-8ranks.json");

/// The built-in calibration sweep that fits the placement `ranks_to_gpus`
/// on `topo`, if any: today one, for two or more ranks sharing one H200
/// (PCI device 0x2335), the only machine measured. Several GPUs, or other
/// models, keep the uncalibrated model.
pub fn builtin_for(topo: &Topology, ranks_to_gpus: &[usize]) -> Option<Sweep> {
    let gpus = topo.gpus();
    let first = *ranks_to_gpus.first()?;
    let shared = ranks_to_gpus.len() >= 2 && ranks_to_gpus.iter().all(|&g| g == first);
    let h200 = gpus
        .get(first)
        .and_then(|&g| topo.nodes[g].attrs.int("device"))
        == Some(H200_DEVICE_ID);
    if !(shared && h200 && gpus.len() == 1) {
        return None;
    }
    match parse_sweep(H200_SHARED_GPU) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("built-in H200 calibration unreadable ({e}); using the plain model");
            None
        }
    }
}

/// PCI device id of the H200 (see [`crate::consts::GPUS`]).
const H200_DEVICE_ID: i64 = 0x2335;
