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

use crate::consts::Constants;
use crate::error::Result;
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
/// on top of `selector`'s constants, for the placement `selector` models
/// (it should be the machine the sweep ran on). Points with wrong results,
/// or naming an unknown collective/algorithm/protocol, are skipped.
pub fn fit(selector: &Selector, sweep: &Sweep) -> Constants {
    let base = Constants {
        fitted: Vec::new(),
        ..selector.constants().clone()
    };
    let model = selector.clone().with_constants(base.clone());
    let mut groups: std::collections::BTreeMap<(Algo, Proto), Vec<(f64, f64)>> = Default::default();
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
        let Some(p0) = model.predict(kind, algo, proto, r.channels, 0, sweep.nranks) else {
            continue;
        };
        // Time above the model's latency, keyed by size: small sizes give
        // the latency correction, large ones the per-byte cost.
        groups
            .entry((algo, proto))
            .or_default()
            .push((r.bytes as f64, r.time_us - p0));
    }
    let mut out = base;
    for ((algo, proto), pts) in groups {
        let max_b = pts.iter().map(|p| p.0).fold(0.0, f64::max);
        let lat_add =
            median(pts.iter().filter(|p| p.0 <= 4096.0).map(|p| p.1).collect()).unwrap_or(0.0);
        // Per-byte cost measured on the large sizes, against the model's.
        let measured: Vec<f64> = pts
            .iter()
            .filter(|p| p.0 >= max_b / 16.0 && p.0 > 4096.0)
            .map(|p| (p.1 - lat_add) / p.0)
            .collect();
        let bw_mul = match (median(measured), model_slope(&model, sweep, algo, proto)) {
            (Some(m), Some(pred)) if m > 0.0 && pred > 0.0 => pred / m,
            _ => 1.0,
        };
        out.fitted.push((algo, proto, lat_add, bw_mul));
    }
    out
}

/// The model's per-byte cost (µs/byte) for the first collective the sweep
/// measured with (algo, proto), at the sweep's largest size.
fn model_slope(model: &Selector, sweep: &Sweep, algo: Algo, proto: Proto) -> Option<f64> {
    let r = sweep
        .results
        .iter()
        .filter(|r| {
            r.algo.parse::<Algo>().ok() == Some(algo)
                && r.proto.parse::<Proto>().ok() == Some(proto)
        })
        .max_by_key(|r| r.bytes)?;
    let kind: CollKind = r.coll.parse().ok()?;
    let p0 = model.predict(kind, algo, proto, r.channels, 0, sweep.nranks)?;
    let p = model.predict(
        kind,
        algo,
        proto,
        r.channels,
        r.bytes as usize,
        sweep.nranks,
    )?;
    Some((p - p0) / (r.bytes.max(1) as f64))
}
