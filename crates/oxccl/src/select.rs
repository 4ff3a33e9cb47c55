//! Per-call choice of algorithm, protocol and channel count: the topology
//! cost model (`oxccl_topo::Selector`), among what the configuration
//! (`NCCL_ALGO`/`NCCL_PROTO`/channels and their `OXCCL_` twins) and the
//! backend allow.
//!
//! Placement, built once per communicator set:
//!
//! - **host**: ranks are threads of one CPU process. The model sees a
//!   topology with no GPU, which `Selector` treats as one device shared
//!   by every rank (no links, every pair "direct"): all ranks on one host,
//!   rings in rank order. Its predicted times are in the GPU model's
//!   nominal units, not calibrated for CPUs: they rank the candidates
//!   (direct algorithms for small calls, rings for large) rather than
//!   forecast host wall time.
//! - **CUDA**: `Config::topology` where given, else
//!   [`crate::detect_topology`] (`OXCCL_TOPO_FILE`/`NCCL_TOPO_FILE`, else
//!   sysfs, NVML and the CUDA driver); rank `r` runs on GPU `r % ngpus`
//!   (the backend's round-robin placement over the visible devices).
//!
//! Every rank of a set decides from the same inputs with the same selector,
//! so all ranks pick alike and run parts of one plan.

use std::collections::HashMap;

use oxccl_core::{gen, Algo, CollKind, Proto};
use oxccl_topo::consts::{is_direct, Constants};
use oxccl_topo::{Selector, Topology};
use parking_lot::RwLock;

use crate::backend::{Backend, BackendKind};
use crate::config::Config;
use crate::error::{Error, Result};

/// What was chosen for one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub algo: Algo,
    pub proto: Proto,
    pub channels: u32,
    /// Whether the plan is a registered direct one: one-shot, two-shot or
    /// all-pairs reading and writing peers' buffers in place, with no FIFO
    /// (and so no protocol at work). `false` for every FIFO plan, the
    /// FIFO variants of those three included, which a call on registered
    /// buffers takes under LL where the model predicts it faster.
    pub direct: bool,
    /// The cost model's prediction in µs (`None` where the model does not
    /// time the combination an override forced).
    pub predicted_us: Option<f64>,
    /// Whether the configuration (environment) restricted the choice.
    pub forced: bool,
}

impl std::fmt::Display for Choice {
    /// `algo ring proto simple channels 2 predicted 12.3 us`, then
    /// ` (override)` when the configuration restricted the choice. A
    /// one-shot, two-shot or all-pairs running its FIFO variant is marked
    /// after its protocol: `algo oneshot proto ll (fifo) channels 1 ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "algo {} proto {}", self.algo, self.proto)?;
        if is_direct(self.algo) && !self.direct {
            f.write_str(" (fifo)")?;
        }
        write!(f, " channels {} predicted ", self.channels)?;
        match self.predicted_us {
            Some(us) => write!(f, "{us:.1} us")?,
            None => f.write_str("n/a")?,
        }
        if self.forced {
            f.write_str(" (override)")?;
        }
        Ok(())
    }
}

/// Algorithms in the order ties are broken and fallbacks are tried: ring
/// serves every collective, then the direct ones, then trees.
const ALGO_ORDER: [Algo; 7] = [
    Algo::Ring,
    Algo::AllPairs,
    Algo::DoubleBinaryTree,
    Algo::TwoShot,
    Algo::OneShot,
    Algo::Chain,
    Algo::BinaryTree,
];

/// The algorithms `config` allows for `kind` that have a generator, in
/// preference order. Registration does not remove any: one-shot, two-shot
/// and all-pairs have FIFO variants too, and a choice's
/// [`Choice::direct`] (which becomes the plan key's `registered` flag)
/// picks the direct variant, only ever for registered buffers.
pub(crate) fn allowed_algos(config: &Config, kind: CollKind) -> Vec<Algo> {
    config
        .algo
        .allowed(kind, &ALGO_ORDER)
        .into_iter()
        .filter(|a| gen::supports(*a, kind))
        .collect()
}

/// Bandwidth of one memory pass (reading or writing each byte once) the
/// host model assumes, GB/s: twice a single-thread memcpy, which measured 8
/// to 20 GB/s on the 2-core development VM (docs/PERFORMANCE.md). It turns
/// the model's nominal device bandwidth into host terms, so predictions are
/// of the right order; `calibrate` can fit better ones from a sweep.
const HOST_PASS_GBPS: f64 = 20.0;

/// The model's constants for the host backend of `nranks` ranks, where
/// every rank shares one memory system and time goes in memory passes.
///
/// - One thread runs all of a rank's channels, so channels add no
///   bandwidth (the fewest within 1% win).
/// - A FIFO message costs about three passes per byte (read the source,
///   write the slot, read the slot while writing the destination).
/// - Registered one-shot (each rank reads all n inputs and writes its
///   output: n + 1 passes per byte) and two-shot (reduce its 1/n block from
///   n inputs, then read the other n − 1 blocks from peers: (3n − 1)/n)
///   read peers' buffers in place. Their multipliers turn the model's data
///   factor (n − 1 and 2(n − 1)/n) into those pass counts. Registered
///   all-pairs pulls its blocks from peers: two passes per byte moved.
///
/// Without registered buffers every algorithm goes through FIFOs.
fn host_constants(nranks: u32, registered: bool) -> Constants {
    let pass = HOST_PASS_GBPS / oxccl_topo::consts::copy_bw_for_sm(0);
    let n = f64::from(nranks.max(2));
    let fitted = Algo::ALL
        .iter()
        .flat_map(|&a| Proto::ALL.map(|p| (a, p)))
        .map(|(a, p)| {
            let mult = match a {
                Algo::OneShot if registered => (n - 1.0) / (n + 1.0),
                Algo::TwoShot if registered => 2.0 * (n - 1.0) / (3.0 * n - 1.0),
                // Pulls from peers: a read there and a write here per byte.
                Algo::AllPairs if registered => 1.0 / 2.0,
                _ => 1.0 / 3.0,
            };
            (a, p, 0.0, pass * mult)
        })
        .collect();
    Constants {
        chan_cap: [1e9; 3],
        direct_bw: 1.0,
        direct_fifo_free: registered,
        fitted,
        ..Constants::default()
    }
}

/// The selectors of one communicator set and what its backend runs.
#[derive(Debug)]
pub(crate) struct Chooser {
    /// Times the plans of calls on registered buffers (`comm.alloc`): the
    /// direct plans of one-shot, two-shot and all-pairs, and the FIFO
    /// algorithms (ring, chain, trees).
    registered: Selector,
    /// Times FIFO variants: every plan of a call on plain slices (host
    /// backend only), and the FIFO variants of the direct algorithms that
    /// a call on registered buffers may take under LL.
    fifo: Selector,
    /// Protocols the backend executes.
    protos: &'static [Proto],
    nranks: u32,
    max_channels: u32,
    /// Choices already made, by (collective, bytes, registered): the
    /// configuration is fixed per clique, so a repeated call is a lookup.
    memo: RwLock<HashMap<(CollKind, usize, bool), Choice>>,
}

/// Largest channel count the facade uses (NCCL's MAXCHANNELS is 32).
pub(crate) const MAX_CHANNELS: u32 = 32;

/// The model's constants for a GPU backend whose channels are thread
/// blocks: a rank's bus bandwidth (`shape.intra_bw`, its share of the GPU)
/// needs `max_channels` blocks (its share of the SMs), so one channel
/// carries at most `intra_bw / max_channels`. The defaults' per-channel
/// caps are NVLink figures (24 GB/s, Simple); with several ranks on one
/// GPU a block's share is smaller, and the model must ask for more blocks
/// to reach the HBM floor (on the H200, 16 channels per rank for 8 ranks
/// ran 2.4× faster than 4). Caps only go down, protocols keep their ratio.
fn gpu_constants(selector: &Selector, max_channels: u32) -> Constants {
    let base = selector.constants().clone();
    let per_block = selector.shape().intra_bw / f64::from(max_channels.max(1));
    let simple = base.channel_cap(Proto::Simple);
    let scale = (per_block / simple).min(1.0);
    Constants {
        chan_cap: base.chan_cap.map(|c| c * scale),
        ..base
    }
}

/// The (registered, FIFO) selectors of a GPU backend. Where
/// `oxccl_topo::calibrate` has a built-in calibration for the placement
/// (today: ranks sharing one H200), each is fitted to the points that
/// time its plans ([`oxccl_topo::calibrate::fit`] the registered direct
/// ones, [`oxccl_topo::calibrate::fit_fifo`] the FIFO variants; ring and
/// trees count in both), so the FIFO one-shot's measured latency under LL
/// reaches the FIFO selector and the direct one-shot's the registered one.
/// On one GPU the HBM copy rate is the floor, and what counts is how many
/// bytes an algorithm moves: registered two-shot AllReduce moves about
/// 2·S per rank and ran 1115 µs at 256 MiB on 8 ranks, the FIFO ring about
/// 5.5·S and 3101 µs, which the uncalibrated NVLink-era constants got the
/// wrong way round.
fn gpu_selectors(
    topo: &Topology,
    gpus: &[usize],
    selector: Selector,
    max_channels: u32,
) -> (Selector, Selector) {
    let fifo = gpu_constants(&selector, max_channels);
    let registered = Constants {
        direct_fifo_free: true,
        ..fifo.clone()
    };
    let reg = selector.clone().with_constants(registered);
    let fifo = selector.with_constants(fifo);
    match oxccl_topo::calibrate::builtin_for(topo, gpus) {
        Some(sweep) => {
            // Each fitted against the model it times with: FIFO-free
            // direct latencies for the registered one, FIFO ones else.
            let registered = oxccl_topo::calibrate::fit(&reg, &sweep);
            let fifo_fitted = oxccl_topo::calibrate::fit_fifo(&fifo, &sweep);
            (
                reg.with_constants(registered),
                fifo.with_constants(fifo_fitted),
            )
        }
        None => (reg, fifo),
    }
}

impl Chooser {
    /// Builds the topology and the selector for `nranks` ranks on
    /// `backend`. Fails when the configuration's protocol filter leaves
    /// none the backend implements for some collective (as NCCL fails when
    /// no algorithm/protocol is left).
    pub fn new(config: &Config, backend: &dyn Backend, nranks: u32) -> Result<Chooser> {
        let protos = backend.protocols();
        for kind in CollKind::ALL {
            if kind != CollKind::SendRecv && config.proto.allowed(kind, protos).is_empty() {
                return Err(Error::Config {
                    var: "NCCL_PROTO".into(),
                    value: format!("{:?}", config.proto.allowed(kind, &Proto::ALL)),
                    reason: format!(
                        "allows no protocol the {} backend implements for {kind} (it implements {})",
                        backend.kind(),
                        names(protos)
                    ),
                });
            }
        }
        let (topo, gpus) = placement(config, backend.kind(), nranks);
        let max_channels = backend.max_channels().clamp(1, MAX_CHANNELS);
        let selector = Selector::new(&topo, &gpus).with_max_channels(max_channels);
        let (registered, fifo) = match backend.kind() {
            BackendKind::Host => (
                selector
                    .clone()
                    .with_constants(host_constants(nranks, true)),
                selector.with_constants(host_constants(nranks, false)),
            ),
            _ => gpu_selectors(&topo, &gpus, selector, max_channels),
        };
        Ok(Chooser {
            registered,
            fifo,
            protos,
            nranks,
            max_channels,
            memo: RwLock::default(),
        })
    }

    /// One rank order per channel, as the topology search found them.
    pub fn rings(&self) -> Vec<Vec<u32>> {
        self.registered.rings()
    }

    /// Chooses for a call of `kind` moving `bytes` (nccl-tests' size) on
    /// `registered` buffers or not: the model's best among the allowed
    /// algorithms and protocols; a configured channel count replaces the
    /// model's.
    pub fn choose(
        &self,
        config: &Config,
        kind: CollKind,
        bytes: usize,
        registered: bool,
    ) -> Result<Choice> {
        let key = (kind, bytes, registered);
        if let Some(c) = self.memo.read().get(&key) {
            return Ok(*c);
        }
        let c = self.choose_uncached(config, kind, bytes, registered)?;
        let mut memo = self.memo.write();
        // Bounded: a program calling every size would otherwise grow it.
        if memo.len() >= 4096 {
            memo.clear();
        }
        memo.insert(key, c);
        Ok(c)
    }

    fn choose_uncached(
        &self,
        config: &Config,
        kind: CollKind,
        bytes: usize,
        registered: bool,
    ) -> Result<Choice> {
        let algos = allowed_algos(config, kind);
        if algos.is_empty() {
            return Err(Error::NoAlgorithm {
                coll: kind,
                allowed: describe_filter(config, kind),
            });
        }
        let protos = config.proto.allowed(kind, self.protos);
        let forced = config.channels.is_some()
            || Algo::ALL.iter().any(|&a| !config.algo.allows(kind, a))
            || Proto::ALL.iter().any(|&p| !config.proto.allows(kind, p));
        let n = self.nranks;
        let (pick, direct) = self
            .best(kind, bytes, registered, &algos, &protos)
            .unwrap_or_else(|| {
                let selector = self.timer(registered, false);
                (selector.choose(kind, bytes, n, &algos, &protos), false)
            });
        // The selector falls back to Ring when the model times nothing
        // allowed; an override must still win, so keep to the allowed lists.
        let algo = if algos.contains(&pick.algo) {
            pick.algo
        } else {
            algos[0]
        };
        let proto = if protos.contains(&pick.proto) {
            pick.proto
        } else {
            protos[0]
        };
        // A replaced algorithm runs the plan its buffers allow.
        let direct = if algo == pick.algo {
            direct
        } else {
            registered && is_direct(algo)
        };
        let channels = match config.channels {
            Some(c) => c.clamp(1, self.max_channels),
            None => pick.channels.clamp(1, self.max_channels),
        };
        let predicted_us = if (algo, proto, channels) == (pick.algo, pick.proto, pick.channels) {
            Some(pick.predicted_us).filter(|t| t.is_finite())
        } else {
            self.timer(registered, is_direct(algo) && !direct)
                .predict(kind, algo, proto, channels, bytes, n)
        };
        Ok(Choice {
            algo,
            proto,
            channels,
            direct,
            predicted_us,
            forced,
        })
    }

    /// The model's best plan for the call and whether it is a registered
    /// direct one; `None` when the model times no candidate. On registered
    /// buffers the registered selector's best (direct plans, FIFO
    /// algorithms) meets the FIFO selector's best FIFO variant of a direct
    /// algorithm under a FIFO protocol ([`fifo_variants`]); a tie keeps
    /// the direct plan.
    fn best(
        &self,
        kind: CollKind,
        bytes: usize,
        registered: bool,
        algos: &[Algo],
        protos: &[Proto],
    ) -> Option<(oxccl_topo::select::Choice, bool)> {
        let n = self.nranks;
        let own = self
            .timer(registered, false)
            .choose_among(kind, bytes, n, &candidates(algos, protos, registered))
            .map(|c| (c, registered && is_direct(c.algo)));
        if !registered {
            return own;
        }
        let fifo = self
            .fifo
            .choose_among(kind, bytes, n, &fifo_variants(algos, protos))
            .map(|c| (c, false));
        match (own, fifo) {
            (Some(a), Some(b)) if b.0.predicted_us < a.0.predicted_us => Some(b),
            (None, b) => b,
            (a, _) => a,
        }
    }

    /// The selector that times a plan: the registered one for calls on
    /// registered buffers, except for the FIFO variant of a direct
    /// algorithm, which the FIFO one times as it does every plan on plain
    /// slices.
    fn timer(&self, registered: bool, fifo_variant: bool) -> &Selector {
        if registered && !fifo_variant {
            &self.registered
        } else {
            &self.fifo
        }
    }
}

/// The (algorithm, protocol) pairs the selector of a call's buffers
/// compares. On registered buffers one-shot, two-shot and all-pairs run
/// their direct plans here, which read and write peers' buffers with no
/// FIFO connection; a protocol only shapes FIFO traffic (the CUDA
/// executor's LL flag changes nothing else), so those plans run alike
/// under any protocol and are timed and reported under Simple only.
/// Timing them under LL would credit them a FIFO protocol's latency they
/// do not get; their FIFO variants under LL are candidates of their own
/// ([`fifo_variants`]), timed as FIFO plans. Where the configuration
/// allows no Simple, the direct plans keep the allowed protocols (the
/// override is honoured, and changes nothing in how they run). FIFO
/// algorithms keep every allowed protocol.
fn candidates(algos: &[Algo], protos: &[Proto], registered: bool) -> Vec<(Algo, Proto)> {
    let simple_only = registered && protos.contains(&Proto::Simple);
    algos
        .iter()
        .flat_map(|&a| {
            let ps: &[Proto] = if simple_only && is_direct(a) {
                &[Proto::Simple]
            } else {
                protos
            };
            ps.iter().map(move |&p| (a, p))
        })
        .collect()
}

/// The FIFO variants a call on registered buffers may take besides the
/// direct plans: one-shot, two-shot and all-pairs under each allowed
/// protocol other than Simple (under Simple the direct plan is kept: on
/// the H200 it ran faster than the FIFO variant). Tiny calls are where
/// they pay: 8 B AllReduce on 8 ranks sharing one H200 ran 14.02 µs per
/// eager call as the FIFO one-shot under LL against 17.02 µs as the
/// registered direct one-shot and 17.71 µs as the FIFO one-shot under
/// Simple (6.60, 7.47 and 8.63 µs in a CUDA graph). The calibrated model
/// decides; `NCCL_PROTO=simple` leaves none.
fn fifo_variants(algos: &[Algo], protos: &[Proto]) -> Vec<(Algo, Proto)> {
    algos
        .iter()
        .filter(|&&a| is_direct(a))
        .flat_map(|&a| {
            protos
                .iter()
                .filter(|&&p| p != Proto::Simple)
                .map(move |&p| (a, p))
        })
        .collect()
}

/// The topology the model sees and each rank's GPU index in it.
fn placement(config: &Config, kind: BackendKind, nranks: u32) -> (Topology, Vec<usize>) {
    match kind {
        BackendKind::Cuda => {
            let topo = config
                .topology
                .clone()
                .unwrap_or_else(crate::detect_topology);
            let ngpus = topo.gpus().len().max(1);
            let gpus = (0..nranks as usize).map(|r| r % ngpus).collect();
            (topo, gpus)
        }
        // Host (and Auto, which never reaches here): no GPU at all.
        _ => (Topology::empty(), vec![0; nranks as usize]),
    }
}

fn names(protos: &[Proto]) -> String {
    protos
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(",")
}

fn describe_filter(config: &Config, kind: CollKind) -> String {
    let names: Vec<&str> = config
        .algo
        .allowed(kind, &Algo::ALL)
        .iter()
        .map(|a| a.name())
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_channels_reach_the_backend_limit_for_large_messages() {
        // 8 ranks on one GPU, 16 blocks each (132 SMs / 8): the default
        // NVLink caps are met with fewer channels on a GPU whose share per
        // rank is small; the SM-share caps ask for every block.
        for topo in [
            Topology::preset("single-gpu", 1).unwrap(),
            Topology::empty(),
        ] {
            for max in [16, 32] {
                let sel = Selector::new(&topo, &[0; 8]).with_max_channels(max);
                let gpu = sel.clone().with_constants(gpu_constants(&sel, max));
                for kind in [
                    CollKind::AllReduce,
                    CollKind::Broadcast,
                    CollKind::AllGather,
                ] {
                    let c = gpu.choose(kind, 256 << 20, 8, &Algo::ALL, &[Proto::Simple]);
                    assert_eq!(c.channels, max, "{kind} {c}");
                    let small = gpu.choose(kind, 8, 8, &Algo::ALL, &[Proto::Simple]);
                    assert_eq!(small.channels, 1, "{kind} {small}");
                }
            }
        }
    }

    /// A chooser for 8 ranks sharing one H200 (the preset `single-gpu`),
    /// 16 channels each, as the CUDA backend builds it, with `NCCL_ALGO`
    /// set to `algo` if given.
    fn shared_h200(algo: Option<&str>) -> (Chooser, Config) {
        let vars: Vec<(&str, &str)> = algo.map(|a| ("NCCL_ALGO", a)).into_iter().collect();
        shared_h200_with(&vars)
    }

    /// As [`shared_h200`], configured from the environment `vars`.
    fn shared_h200_with(vars: &[(&str, &str)]) -> (Chooser, Config) {
        let topo = Topology::preset("single-gpu", 1).unwrap();
        let gpus = vec![0; 8];
        let sel = Selector::new(&topo, &gpus).with_max_channels(16);
        let (registered, fifo) = gpu_selectors(&topo, &gpus, sel, 16);
        let chooser = Chooser {
            registered,
            fifo,
            protos: &[Proto::Simple, Proto::LL],
            nranks: 8,
            max_channels: 16,
            memo: RwLock::default(),
        };
        let config = Config::from_vars(|k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        (chooser, config)
    }

    #[test]
    fn shared_h200_picks_what_was_measured_fastest() {
        let (ch, cfg) = shared_h200(None);
        let pick = |kind, bytes, registered| ch.choose(&cfg, kind, bytes, registered).unwrap();
        let big = 256 << 20;
        // Registered, 256 MiB (run 7): two-shot 1115 µs against ring
        // 3101 µs and one-shot 2832 µs (AllReduce); all-pairs 595 µs
        // (ReduceScatter), 593 µs (Reduce), 679 µs (AllGather), 678 µs
        // against ring 2092 µs (Broadcast), 1095 µs (AllToAll).
        for (kind, algo) in [
            (CollKind::AllReduce, Algo::TwoShot),
            (CollKind::ReduceScatter, Algo::AllPairs),
            (CollKind::Reduce, Algo::AllPairs),
            (CollKind::AllGather, Algo::AllPairs),
            (CollKind::Broadcast, Algo::AllPairs),
            (CollKind::AllToAll, Algo::AllPairs),
        ] {
            let c = pick(kind, big, true);
            assert_eq!(
                (c.algo, c.proto, c.channels),
                (algo, Proto::Simple, 16),
                "{kind}: {c}"
            );
        }
        // Unregistered buffers run FIFO variants: the ring stays.
        let c = pick(CollKind::AllReduce, big, false);
        assert_eq!(c.algo, Algo::Ring, "{c}");
        assert_eq!(pick(CollKind::ReduceScatter, big, false).algo, Algo::Ring);
        // Small AllReduce: the one-launch one-shot, one channel, as its
        // FIFO variant under LL (session 3 run 1: 14.02 µs per eager call
        // against 17.02 as the registered direct one-shot).
        let c = pick(CollKind::AllReduce, 8, true);
        let got = (c.algo, c.proto, c.channels, c.direct);
        assert_eq!(got, (Algo::OneShot, Proto::LL, 1, false), "{c}");
        let t = c.predicted_us.unwrap();
        assert!((13.9..14.2).contains(&t), "{t}");
        // The model predicts the measured time.
        let t = pick(CollKind::AllReduce, big, true).predicted_us.unwrap();
        assert!((1090.0..1140.0).contains(&t), "{t}");
    }

    #[test]
    fn shared_h200_registered_allreduce_takes_no_ring_from_8_bytes_to_1_gib() {
        // Ring measured 3101 µs at 256 MiB against two-shot's 1115: on
        // registered buffers the model must not prefer it at any size.
        // Small calls take the one-launch one-shot on one channel (each
        // extra channel is one more block per rank in every barrier):
        // the tiniest as its FIFO variant under LL (measured faster at
        // 8 B), then as the direct plan; from 1 MiB two-shot with every
        // channel.
        // A registered direct plan has no FIFO, so it is reported as
        // Simple; a FIFO variant runs under LL.
        let (ch, cfg) = shared_h200(None);
        for e in 0..=27 {
            let bytes = 8usize << e;
            let c = ch.choose(&cfg, CollKind::AllReduce, bytes, true).unwrap();
            println!("{bytes:>11} B: {c}");
            assert_ne!(c.algo, Algo::Ring, "{bytes} B: {c}");
            assert!(is_direct(c.algo), "{bytes} B: {c}");
            let proto = if c.direct { Proto::Simple } else { Proto::LL };
            assert_eq!(c.proto, proto, "{bytes} B: {c}");
            if bytes <= 4096 {
                assert_eq!(c.algo, Algo::OneShot, "{bytes} B: {c}");
            }
            if bytes <= 64 {
                assert!(!c.direct, "{bytes} B: {c}");
            }
            if bytes >= 4096 {
                assert!(c.direct, "{bytes} B: {c}");
            }
            if bytes <= 64 << 10 {
                assert_eq!(c.channels, 1, "{bytes} B: {c}");
            }
            if bytes >= 1 << 20 {
                let got = (c.algo, c.proto, c.channels);
                assert_eq!(got, (Algo::TwoShot, Proto::Simple, 16), "{bytes} B: {c}");
            }
        }
    }

    #[test]
    fn registered_direct_picks_report_simple_for_every_collective() {
        let (ch, cfg) = shared_h200(None);
        for kind in CollKind::ALL {
            if kind == CollKind::SendRecv {
                continue;
            }
            for bytes in [8, 4 << 10, 64 << 10, 1 << 20, 256 << 20] {
                let c = ch.choose(&cfg, kind, bytes, true).unwrap();
                if c.direct {
                    assert_eq!(c.proto, Proto::Simple, "{kind} {bytes} B: {c}");
                } else if is_direct(c.algo) {
                    // A FIFO variant on registered buffers: under LL only.
                    assert_eq!(c.proto, Proto::LL, "{kind} {bytes} B: {c}");
                }
                if bytes <= 64 << 10 && is_direct(c.algo) {
                    assert_eq!(c.channels, 1, "{kind} {bytes} B: {c}");
                }
            }
        }
        // Unregistered calls run FIFO variants, where LL still counts:
        // the tiny AllReduce keeps it.
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, false).unwrap();
        assert_eq!(c.proto, Proto::LL, "{c}");
        assert!(!c.direct, "{c}");
    }

    #[test]
    fn registered_calls_take_the_fifo_plan_only_where_predicted_faster() {
        let (ch, cfg) = shared_h200(None);
        let pick = |cfg: &Config, bytes, registered| {
            let c = ch
                .choose(cfg, CollKind::AllReduce, bytes, registered)
                .unwrap();
            println!("{bytes:>10} B registered {registered}: {c}");
            c
        };
        // 8 B: the FIFO one-shot under LL, as measured fastest.
        let c = pick(&cfg, 8, true);
        assert_eq!(
            (c.algo, c.proto, c.direct, c.forced),
            (Algo::OneShot, Proto::LL, false, false),
            "{c}"
        );
        assert_eq!(
            c.to_string(),
            "algo oneshot proto ll (fifo) channels 1 predicted 14.0 us"
        );
        // Its prediction is the FIFO selector's, below the direct plan's.
        let direct = ch
            .registered
            .predict(CollKind::AllReduce, Algo::OneShot, Proto::Simple, 1, 8, 8)
            .unwrap();
        assert!(c.predicted_us.unwrap() + 2.5 < direct, "{c} vs {direct}");
        // 256 MiB: the direct two-shot, as before.
        let c = pick(&cfg, 256 << 20, true);
        assert_eq!(
            (c.algo, c.proto, c.channels, c.direct),
            (Algo::TwoShot, Proto::Simple, 16, true),
            "{c}"
        );
        // NCCL_PROTO=simple (or its OXCCL_ twin) leaves no FIFO protocol:
        // the direct plan comes back.
        for var in ["NCCL_PROTO", "OXCCL_PROTO"] {
            let (ch, cfg) = shared_h200_with(&[(var, "simple")]);
            let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
            assert_eq!(
                (c.algo, c.proto, c.direct, c.forced),
                (Algo::OneShot, Proto::Simple, true, true),
                "{var}: {c}"
            );
        }
        // NCCL_ALGO filters the FIFO variants as the direct plans.
        let (ch, cfg) = shared_h200(Some("twoshot"));
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
        assert_eq!(c.algo, Algo::TwoShot, "{c}");
        let (ch, cfg) = shared_h200(Some("ring"));
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
        assert_eq!((c.algo, c.direct), (Algo::Ring, false), "{c}");
        let (ch, cfg) = shared_h200(Some("oneshot"));
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
        assert_eq!(
            (c.algo, c.proto, c.direct),
            (Algo::OneShot, Proto::LL, false)
        );
        // Unregistered calls: FIFO plans throughout, picks as before.
        let (ch, cfg) = shared_h200(None);
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, false).unwrap();
        assert_eq!(
            (c.algo, c.proto, c.direct),
            (Algo::OneShot, Proto::LL, false)
        );
        let c = ch
            .choose(&cfg, CollKind::AllReduce, 256 << 20, false)
            .unwrap();
        assert_eq!(
            (c.algo, c.proto, c.direct),
            (Algo::Ring, Proto::Simple, false)
        );
        // The registered picks the facade reports at a few sizes.
        for bytes in [8, 4 << 10, 64 << 10, 1 << 20, 256 << 20] {
            pick(&cfg, bytes, true);
        }
    }

    #[test]
    fn host_registered_calls_keep_direct_plans() {
        // The host backend runs Simple only: no FIFO protocol, so no FIFO
        // variant competes on registered buffers.
        let backend = crate::backend::host::create(&crate::backend::BackendOptions {
            nranks: 4,
            deadline: std::time::Duration::from_secs(10),
        })
        .unwrap();
        let cfg = Config::default();
        let ch = Chooser::new(&cfg, backend.as_ref(), 4).unwrap();
        for bytes in [8, 4 << 10, 1 << 20, 256 << 20] {
            let c = ch.choose(&cfg, CollKind::AllReduce, bytes, true).unwrap();
            assert_eq!(c.proto, Proto::Simple, "{bytes} B: {c}");
            assert_eq!(c.direct, is_direct(c.algo), "{bytes} B: {c}");
            let f = ch.choose(&cfg, CollKind::AllReduce, bytes, false).unwrap();
            assert!(!f.direct, "{bytes} B: {f}");
        }
    }

    #[test]
    fn candidates_time_registered_direct_plans_under_simple_only() {
        let both = [Proto::Simple, Proto::LL];
        let algos = [Algo::Ring, Algo::OneShot];
        assert_eq!(
            candidates(&algos, &both, true),
            vec![
                (Algo::Ring, Proto::Simple),
                (Algo::Ring, Proto::LL),
                (Algo::OneShot, Proto::Simple)
            ]
        );
        assert_eq!(candidates(&algos, &both, false).len(), 4);
        // NCCL_PROTO=LL on registered buffers: honoured, nothing dropped.
        assert_eq!(
            candidates(&[Algo::OneShot], &[Proto::LL], true),
            vec![(Algo::OneShot, Proto::LL)]
        );
        // FIFO variants on registered buffers: direct algorithms under a
        // FIFO protocol only.
        let algos = [Algo::Ring, Algo::OneShot, Algo::AllPairs];
        assert_eq!(
            fifo_variants(&algos, &both),
            vec![(Algo::OneShot, Proto::LL), (Algo::AllPairs, Proto::LL)]
        );
        assert!(fifo_variants(&algos, &[Proto::Simple]).is_empty());
        assert!(fifo_variants(&[Algo::Ring], &both).is_empty());
    }

    #[test]
    fn overrides_win_over_the_calibrated_model() {
        let (ch, cfg) = shared_h200(Some("ring"));
        let c = ch
            .choose(&cfg, CollKind::AllReduce, 256 << 20, true)
            .unwrap();
        assert_eq!((c.algo, c.forced), (Algo::Ring, true), "{c}");
        // A variant a calibration avoids is still run when forced (the
        // built-in one avoids nothing today, so add one here).
        let avoiding = |vars: &[(&str, &str)]| {
            let (mut ch, cfg) = shared_h200_with(vars);
            let mut consts = ch.registered.constants().clone();
            consts.avoid.push((CollKind::AllGather, Algo::AllPairs));
            ch.registered = ch.registered.clone().with_constants(consts);
            ch.choose(&cfg, CollKind::AllGather, 256 << 20, true)
                .unwrap()
        };
        let c = avoiding(&[("NCCL_ALGO", "allpairs"), ("NCCL_PROTO", "simple")]);
        assert_eq!(
            (c.algo, c.forced, c.direct),
            (Algo::AllPairs, true, true),
            "{c}"
        );
        assert_eq!(c.predicted_us, None, "{c}");
        // The avoid list names the registered plan: where LL is allowed,
        // the model times the FIFO variant instead.
        let c = avoiding(&[("NCCL_ALGO", "allpairs")]);
        let got = (c.algo, c.proto, c.direct);
        assert_eq!(got, (Algo::AllPairs, Proto::LL, false), "{c}");
        assert!(c.predicted_us.is_some(), "{c}");
    }

    #[test]
    fn other_placements_keep_the_uncalibrated_model() {
        // Eight H100s, one rank each: no built-in calibration applies.
        let topo = Topology::preset("hgx-h100", 1).unwrap();
        let gpus: Vec<usize> = (0..8).collect();
        let sel = Selector::new(&topo, &gpus).with_max_channels(16);
        let (reg, fifo) = gpu_selectors(&topo, &gpus, sel.clone(), 16);
        assert!(reg.constants().fitted.is_empty());
        assert_eq!(fifo.constants(), &gpu_constants(&sel, 16));
        // Registered calls differ only in timing direct plans FIFO-free.
        let want = Constants {
            direct_fifo_free: true,
            ..gpu_constants(&sel, 16)
        };
        assert_eq!(reg.constants(), &want);
    }

    #[test]
    fn choice_line_carries_prediction_and_override() {
        let mut c = Choice {
            algo: Algo::Ring,
            proto: Proto::Simple,
            channels: 2,
            direct: false,
            predicted_us: Some(12.345),
            forced: false,
        };
        assert_eq!(
            c.to_string(),
            "algo ring proto simple channels 2 predicted 12.3 us"
        );
        c.forced = true;
        c.predicted_us = None;
        assert_eq!(
            c.to_string(),
            "algo ring proto simple channels 2 predicted n/a (override)"
        );
        // A direct algorithm's FIFO variant is marked; its direct plan not.
        let mut c = Choice {
            algo: Algo::OneShot,
            proto: Proto::LL,
            channels: 1,
            direct: false,
            predicted_us: Some(14.02),
            forced: false,
        };
        assert_eq!(
            c.to_string(),
            "algo oneshot proto ll (fifo) channels 1 predicted 14.0 us"
        );
        c.direct = true;
        c.proto = Proto::Simple;
        assert_eq!(
            c.to_string(),
            "algo oneshot proto simple channels 1 predicted 14.0 us"
        );
    }
}
