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
//!
//! One-shot, two-shot and all-pairs have two variants: the direct plans
//! run on registered buffers and the FIFO ones otherwise (or on
//! registered buffers under a FIFO protocol). A point's `registered`
//! flag says which it timed; [`fit`] fits the registered view and
//! [`fit_fifo`] the FIFO one. Ring, chain and trees run one plan either
//! way, so their points count in both.
//!
//! The model's latencies (NCCL's) are in-kernel ones: a call also pays its
//! launch. A sweep may give that floor (`launch_floor_us`, an empty plan's
//! per-call time in the same run); every (algorithm, protocol) the sweep
//! did not time at small sizes then takes it as its latency correction,
//! so that an algorithm measured small (whose time includes the launch)
//! is not beaten by an unmeasured one that is charged none.

use oxccl_core::{Algo, CollKind, Proto};
use serde::Deserialize;

use std::collections::BTreeSet;

use crate::consts::{is_direct, Constants};
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
    /// (collective, algorithm) pairs the selector must not pick, each with
    /// why (see [`Constants::avoid`]); an entry naming a direct algorithm
    /// describes its registered plan.
    #[serde(default)]
    pub avoid: Vec<Avoid>,
    /// Per-call time, µs, of an empty plan in the same run: the launch
    /// every call pays and the model's latencies leave out. Absent: no
    /// latency correction for what the sweep did not time at small sizes.
    #[serde(default)]
    pub launch_floor_us: Option<f64>,
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
    /// Whether the call ran on registered buffers, so one-shot, two-shot
    /// and all-pairs ran their direct plans; `false` for their FIFO
    /// variants. Absent: registered, as the sweep's buffers (`comm.alloc`)
    /// are. Ring, chain and trees run one plan either way.
    #[serde(default = "yes")]
    pub registered: bool,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
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

/// Fits corrections for calls on registered buffers: for every (algorithm,
/// protocol) the sweep measured, and for every (collective, algorithm,
/// protocol), on top of `selector`'s constants, for the placement
/// `selector` models (it should be the machine the sweep ran on). Points
/// timing FIFO variants of the direct algorithms (`registered: false`) are
/// left to [`fit_fifo`]. The bandwidth multiplier is the median, over the
/// large points, of the model's per-byte cost for the point's collective
/// over the measured one; chain and trees, if unmeasured, take the ring's
/// correction. With a launch floor (see the module doc), a latency or
/// bandwidth the points do not give is the floor or the model's (the
/// ring's, for chain and trees), and every (algorithm, protocol) gets a
/// correction. Points with wrong results, or naming an unknown
/// collective/algorithm/protocol, are skipped; the sweep's `avoid` entries
/// are copied into [`Constants::avoid`].
pub fn fit(selector: &Selector, sweep: &Sweep) -> Constants {
    fit_view(
        selector.constants().clone(),
        selector,
        sweep,
        View::Registered,
    )
}

/// Fits corrections for calls that run the FIFO variants of the direct
/// algorithms, as [`fit`] does for registered ones, from the points that
/// time FIFO plans: every ring, chain and tree point, and the direct
/// algorithms' points with `registered: false`. `selector`'s constants
/// are used with [`Constants::direct_fifo_free`] off, as FIFO variants go
/// through FIFOs. A direct algorithm, or a part of its correction (its
/// latency, its bandwidth), that no FIFO point measured takes the ring's
/// of the same protocol (and collective), as [`Constants::for_fifo`]
/// gives it: a FIFO moves each byte as a ring step does. Avoid entries
/// naming direct algorithms describe their registered plans and are
/// dropped.
pub fn fit_fifo(selector: &Selector, sweep: &Sweep) -> Constants {
    let consts = Constants {
        direct_fifo_free: false,
        ..selector.constants().clone()
    };
    fit_view(consts, selector, sweep, View::Fifo)
}

/// Which plans a fit describes.
#[derive(Clone, Copy, PartialEq)]
enum View {
    /// Direct plans for one-shot, two-shot and all-pairs.
    Registered,
    /// FIFO variants of every algorithm.
    Fifo,
}

impl View {
    /// Whether a point of `algo` measured on (un)registered buffers
    /// describes this view's plan of it.
    fn covers(self, algo: Algo, registered: bool) -> bool {
        !is_direct(algo) || registered == (self == View::Registered)
    }

    /// Whether this view's plan of `algo` goes through FIFOs as the ring's
    /// does, so a part its points do not give is the ring's.
    fn ring_like(self, algo: Algo) -> bool {
        !is_direct(algo) || self == View::Fifo
    }
}

fn fit_view(consts: Constants, selector: &Selector, sweep: &Sweep, view: View) -> Constants {
    let base = Constants {
        fitted: Vec::new(),
        fitted_coll: Vec::new(),
        avoid: Vec::new(),
        ..consts
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
        if !view.covers(algo, r.registered) {
            continue;
        }
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
    let floor = sweep.launch_floor_us.filter(|f| f.is_finite() && *f > 0.0);
    // A latency no small point gives: the launch floor, else the model's.
    let lat0 = floor.unwrap_or(0.0);
    let mut out = base;
    // The ring first: the other FIFO plans fall back on its parts.
    let mut pairs: Vec<(Algo, Proto)> = points
        .iter()
        .map(|p| (p.algo, p.proto))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    pairs.sort_by_key(|&(a, _)| a != Algo::Ring);
    for (algo, proto) in pairs {
        let (lat, bw) = fit_group(
            points.iter().filter(|p| (p.algo, p.proto) == (algo, proto)),
            lat0,
        );
        // A part the points do not give: the ring's where this plan is
        // ring-like and the ring was measured, else the floor's latency
        // and the model's bandwidth.
        let (lat_else, bw_else) = out
            .fitted
            .iter()
            .find(|f| (f.0, f.1) == (Algo::Ring, proto))
            .filter(|_| view.ring_like(algo))
            .map_or((lat0, 1.0), |f| (f.2, f.3));
        out.fitted
            .push((algo, proto, lat.unwrap_or(lat_else), bw.unwrap_or(bw_else)));
    }
    let mut triples: Vec<(CollKind, Algo, Proto)> = points
        .iter()
        .map(|p| (p.kind, p.algo, p.proto))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    triples.sort_by_key(|&(_, a, _)| a != Algo::Ring);
    for (kind, algo, proto) in triples {
        let (lat, bw) = fit_group(
            points
                .iter()
                .filter(|p| (p.kind, p.algo, p.proto) == (kind, algo, proto)),
            lat0,
        );
        // A part this collective's points do not give: the ring's for
        // the collective where this plan is ring-like and the ring has
        // one, else the (algorithm, protocol) one fitted above.
        let ring = out
            .fitted_coll
            .iter()
            .find(|f| (f.0, f.1, f.2) == (kind, Algo::Ring, proto))
            .filter(|_| view.ring_like(algo))
            .map(|f| (f.3, f.4));
        let (lat_else, bw_else) = ring.unwrap_or_else(|| out.correction(algo, proto));
        out.fitted_coll.push((
            kind,
            algo,
            proto,
            lat.unwrap_or(lat_else),
            bw.unwrap_or(bw_else),
        ));
    }
    // Chain and trees go through FIFOs as the ring does; unmeasured,
    // they take its correction, as do the FIFO variants of the direct
    // algorithms.
    let mut unfitted = vec![Algo::Chain, Algo::BinaryTree, Algo::DoubleBinaryTree];
    if view == View::Fifo {
        unfitted.extend([Algo::OneShot, Algo::TwoShot, Algo::AllPairs]);
    }
    out.ring_correction_for_unfitted(&unfitted);
    if floor.is_some() {
        for algo in Algo::ALL {
            for proto in Proto::ALL {
                if !out.fitted.iter().any(|f| (f.0, f.1) == (algo, proto)) {
                    out.fitted.push((algo, proto, lat0, 1.0));
                }
            }
        }
    }
    out.avoid = sweep
        .avoid
        .iter()
        .filter_map(|a| Some((a.coll.parse().ok()?, a.algo.parse().ok()?)))
        .filter(|&(_, algo)| view == View::Registered || !is_direct(algo))
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

/// (latency added, bandwidth multiplier) of one group of points, each
/// `None` where the group has no point to give it: the median excess of
/// the small sizes (≤ 4 KiB), and the median ratio of model to measured
/// per-byte cost over the top four octaves, the measured cost taken above
/// the fitted latency (else `lat0`).
fn fit_group<'a>(
    pts: impl Iterator<Item = &'a Point> + Clone,
    lat0: f64,
) -> (Option<f64>, Option<f64>) {
    let max_b = pts.clone().map(|p| p.bytes).fold(0.0, f64::max);
    let lat_add = median(
        pts.clone()
            .filter(|p| p.bytes <= 4096.0)
            .map(|p| p.excess)
            .collect(),
    );
    let above = lat_add.unwrap_or(lat0);
    let ratios = pts
        .filter(|p| p.bytes >= max_b / 16.0 && p.bytes > 4096.0)
        .filter_map(|p| {
            let measured = (p.excess - above) / p.bytes;
            (measured > 0.0 && p.model_slope > 0.0).then(|| p.model_slope / measured)
        })
        .collect();
    (lat_add, median(ratios))
}

/// The preset of the machine the built-in sweep ran on (one H200), whose
/// model [`fit`] and [`fit_fifo`] must compare the sweep with before
/// [`carry`] moves the corrections to another GPU's model.
pub const SHARED_GPU_MACHINE: &str = "single-gpu";

/// `target` with the corrections of `fitted` (a fit made against the model
/// of the machine a sweep ran on): the latencies added, the bandwidth
/// ratios, the avoid list and whether direct plans are FIFO-free. The rest
/// (channel caps, bandwidths) stays `target`'s, so a ratio fitted on one
/// GPU applies to another's own per-byte cost.
pub fn carry(fitted: &Constants, target: &Constants) -> Constants {
    Constants {
        fitted: fitted.fitted.clone(),
        fitted_coll: fitted.fitted_coll.clone(),
        avoid: fitted.avoid.clone(),
        direct_fifo_free: fitted.direct_fifo_free,
        ..target.clone()
    }
}

/// The sweep of the built-in shared-GPU calibration, measured with 8 ranks
/// sharing one H200: large sizes on registered buffers (`comm.alloc`,
/// 2026-12-02) and, for every collective, every algorithm's launch-bound
/// calls up to 2 KiB as `sweep --pick` times them (2026-12-04), with the
/// fastest of those as the floor; each point names its source. See the
/// file's `provenance`.
pub const SHARED_GPU: &str = include_str!("../calib/h200-1gpu-8ranks.json");

/// The built-in calibration sweep for the placement `ranks_to_gpus` on
/// `topo`, if any: the shared-GPU one, for two or more ranks sharing one
/// GPU, whatever its model. It was measured on an H200, but what it fits
/// is the model's error, not the GPU: its bandwidth corrections are
/// ratios to the model's per-byte cost, which scales with the GPU's own
/// memory bandwidth ([`Topology::local_bw`]: the driver's bus width and
/// memory clock), and its latencies are launch and synchronisation costs
/// of one GPU's SMs, alike across a generation. So an H100 gets the
/// H200's ranking of algorithms at its own speed, where the plain model
/// (NVLink-era constants) picked the ring for 256 MiB AllReduce at 2.66×
/// the best. Ranks on several GPUs keep the uncalibrated model.
pub fn builtin_for(topo: &Topology, ranks_to_gpus: &[usize]) -> Option<Sweep> {
    let first = *ranks_to_gpus.first()?;
    let shared = ranks_to_gpus.len() >= 2 && ranks_to_gpus.iter().all(|&g| g == first);
    if !shared || topo.gpus().get(first).is_none() && !topo.gpus().is_empty() {
        return None;
    }
    match parse_sweep(SHARED_GPU) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(
                "built-in shared-GPU calibration unreadable ({e}); using the plain model"
            );
            None
        }
    }
}
