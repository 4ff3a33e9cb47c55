//! Per-call choice of algorithm, protocol and channel count: the policy
//! of `oxccl_topo::policy` (the cost model set up for the backend and the
//! placement), among what the configuration (`NCCL_ALGO`/`NCCL_PROTO`/
//! channels and their `OXCCL_` twins) and the backend allow, remembered
//! per (collective, size, buffers).
//!
//! Placement: the host backend's ranks are threads of one process
//! ([`Policy::host`]); the CUDA backend's rank `r` runs on GPU
//! `r % ngpus` of [`crate::detect_topology`] (`OXCCL_TOPO_FILE`/
//! `NCCL_TOPO_FILE`, else sysfs, NVML and the CUDA driver), the backend's
//! round-robin placement ([`Policy::gpu`]); `Config::topology`, where
//! given, replaces the detected machine.

use std::collections::HashMap;

use oxccl_core::{gen, Algo, CollKind, Proto};
use oxccl_topo::consts::is_direct;
pub use oxccl_topo::{Choice, Transport};
use oxccl_topo::{Policy, Topology};
use parking_lot::RwLock;

use crate::backend::{Backend, BackendKind};
use crate::config::Config;
use crate::error::{Error, Result};

/// Algorithms in the order ties are broken and fallbacks are tried: ring
/// serves every collective, then the direct ones, then trees.
const ALGO_ORDER: [Algo; 9] = [
    Algo::Ring,
    Algo::AllPairs,
    Algo::DoubleBinaryTree,
    Algo::TwoShot,
    Algo::OneShot,
    Algo::Chain,
    Algo::BinaryTree,
    Algo::CopyEngine,
    Algo::OneShotLl,
];

/// The algorithms `config` allows for `kind` that have a generator, in
/// preference order. Registration does not remove any: one-shot, two-shot
/// and all-pairs have FIFO variants too, and a choice's
/// [`Choice::direct`] (which becomes the plan key's `registered` flag)
/// picks the direct variant, only ever for registered buffers. With
/// [`Config::deterministic`] only those that reduce in rank order
/// ([`gen::reduces_in_rank_order`]; every algorithm of a collective that
/// reduces nothing).
pub(crate) fn allowed_algos(config: &Config, kind: CollKind) -> Vec<Algo> {
    config
        .algo
        .allowed(kind, &ALGO_ORDER)
        .into_iter()
        .filter(|a| gen::supports(*a, kind))
        .filter(|a| !config.deterministic || gen::reduces_in_rank_order(*a, kind))
        .collect()
}

/// The policy of one communicator set and what its backend runs.
#[derive(Debug)]
pub(crate) struct Chooser {
    policy: Policy,
    /// Protocols the backend executes.
    protos: &'static [Proto],
    max_channels: u32,
    /// Largest AllReduce per rank the backend's one-step LL path serves
    /// (0: none); larger calls take the FIFO one-shot in its place.
    ll1_bytes: usize,
    /// Choices already made, by (collective, bytes, registered): the
    /// configuration is fixed per clique, so a repeated call is a lookup.
    memo: RwLock<HashMap<(CollKind, usize, bool), Choice>>,
}

/// Largest channel count the facade uses (NCCL's MAXCHANNELS is 32).
pub(crate) const MAX_CHANNELS: u32 = 32;

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
        let max_channels = backend.max_channels().clamp(1, MAX_CHANNELS);
        let policy = match (
            backend.net_placement(),
            placement(config, backend.kind(), nranks, backend.rank_devices()),
        ) {
            // Over the network the host backend runs every plan (staged
            // CUDA ranks too), between hosts at the network's speed.
            (Some(net), topo) => {
                log_network(&net, topo.map(|(t, _)| t));
                Policy::network(&net, max_channels)
            }
            (None, Some((topo, gpus))) => {
                Policy::gpu_launched(&topo, &gpus, max_channels, backend.launcher())
            }
            (None, None) => Policy::host(nranks, max_channels),
        }
        .with_link_memory(backend.link_memory())
        // The copy-engine model's constants are guesses to calibrate
        // (`CopyEngineModel::GUESS`); timed only where the backend really
        // runs those plans on its copy engines.
        .with_copy_engines(
            backend
                .copy_engines()
                .then_some(oxccl_topo::consts::CopyEngineModel::GUESS),
        )
        // Likewise the one-step LL AllReduce's: guesses but for the
        // barrier, with a margin, timed where the backend asks for it.
        .with_oneshot_ll(
            (backend.oneshot_ll_priced() && backend.oneshot_ll_bytes() > 0)
                .then(|| oxccl_topo::consts::OneShotLlModel::serving(backend.oneshot_ll_bytes())),
        );
        Ok(Chooser {
            policy,
            protos,
            max_channels,
            ll1_bytes: backend.oneshot_ll_bytes(),
            memo: RwLock::default(),
        })
    }

    /// Most plan channels the backend runs (at most [`MAX_CHANNELS`]).
    pub fn max_channels(&self) -> u32 {
        self.max_channels
    }

    /// One rank order per channel, as the topology search found them.
    pub fn rings(&self) -> Vec<Vec<u32>> {
        self.policy.rings()
    }

    /// Each rank's host position for plans across hosts (empty: one host).
    pub fn hosts(&self) -> Vec<u32> {
        self.policy.hosts()
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
        let c = self.choose_uncached(config, key)?;
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
        (kind, bytes, registered): (CollKind, usize, bool),
    ) -> Result<Choice> {
        let algos = ll1_served(allowed_algos(config, kind), bytes, self.ll1_bytes);
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
        let pick = self.policy.best(kind, bytes, registered, &algos, &protos);
        // The policy falls back to Ring when the model times nothing
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
        let transport = if algo == pick.algo {
            pick.transport
        } else if registered && is_direct(algo) {
            Transport::Direct
        } else {
            Transport::Fifo
        };
        // Clamped so the plan fits the backend: a configured count, or one
        // chosen for another algorithm, may be more than `algo` can run
        // (the double binary tree's plan has two channels per channel).
        let channels = fit_channels(
            algo,
            config.channels.unwrap_or(pick.channels),
            self.max_channels,
        );
        let mut c = Choice {
            algo,
            proto,
            channels,
            transport,
            predicted_us: pick.predicted_us,
            forced,
        };
        if (algo, proto, channels) != (pick.algo, pick.proto, pick.channels) {
            c.predicted_us = self.policy.predict(kind, bytes, registered, &c);
        }
        Ok(c)
    }
}

/// `algos` for a call of `bytes` per rank where the one-step LL path
/// serves at most `ll1_bytes`: past that (or without the path) `ll1` is
/// the FIFO one-shot it falls back to, which computes the same rank-order
/// sums, so a forced `ll1` still runs.
fn ll1_served(mut algos: Vec<Algo>, bytes: usize, ll1_bytes: usize) -> Vec<Algo> {
    if bytes <= ll1_bytes {
        return algos;
    }
    if let Some(i) = algos.iter().position(|&a| a == Algo::OneShotLl) {
        if algos.contains(&Algo::OneShot) {
            algos.remove(i);
        } else {
            algos[i] = Algo::OneShot;
        }
    }
    algos
}

/// `channels` for `algo`, clamped so that its plan has at most `max`
/// channels ([`Algo::plan_channels`]); at least 1 (an algorithm whose one
/// channel does not fit is refused where its plan is prepared).
pub(crate) fn fit_channels(algo: Algo, channels: u32, max: u32) -> u32 {
    channels.min(algo.channels_within(max)).max(1)
}

/// The network's device as a NIC of this machine's topology, and what the
/// model prices the network at, under INIT (NCCL logs its NICs with the
/// topology). `topo` is the GPU backend's; the host backend has none, so
/// sysfs is read (no NVML) where the device names a PCI path to match.
fn log_network(net: &oxccl_topo::NetPlacement, topo: Option<Topology>) {
    // The placement is for this line alone (the model takes the device's
    // figures from `net`): no sysfs walk at init unless it is printed.
    if !tracing::enabled!(target: "oxccl::init", tracing::Level::INFO) {
        return;
    }
    let base = topo.unwrap_or_else(|| {
        let has_pci = net
            .device
            .as_ref()
            .and_then(|d| d.pci_path.as_deref())
            .and_then(oxccl_topo::netdev::busid_of_path)
            .is_some();
        if has_pci {
            oxccl_topo::detect::detect_with(std::path::Path::new("/sys"), false)
        } else {
            Topology::empty()
        }
    });
    let nic = net
        .nic(&base)
        .map_or_else(|| "no device stated".into(), |(t, n)| t.nic_line(n));
    let hop = net
        .hop_latency_us()
        .map_or_else(|| "the model's constant".into(), |h| format!("{h:.1} us"));
    tracing::info!(
        target: "oxccl::init",
        "oxccl: Topology NET/0 : {nic}; the model prices the network at {:.2} GB/s per host, one hop {hop}",
        net.bandwidth()
    );
}

/// The topology a GPU backend's model sees and each rank's GPU index in
/// it: the device each rank runs on, where the backend knows them all (a
/// device ordinal is taken as the topology's GPU index), else rank
/// round-robin; `None` for the host backend (and Auto, which never
/// reaches here).
fn placement(
    config: &Config,
    kind: BackendKind,
    nranks: u32,
    devices: Option<Vec<i32>>,
) -> Option<(Topology, Vec<usize>)> {
    (kind == BackendKind::Cuda).then(|| {
        let topo = config
            .topology
            .clone()
            .unwrap_or_else(|| oxccl_cuda::detect_topology(config.topology_file.as_deref()));
        let ngpus = topo.gpus().len().max(1);
        let gpus = match devices.filter(|d| d.len() == nranks as usize) {
            Some(d) => d.iter().map(|&g| g.max(0) as usize % ngpus).collect(),
            None => (0..nranks as usize).map(|r| r % ngpus).collect(),
        };
        (topo, gpus)
    })
}

fn names(protos: &[Proto]) -> String {
    protos
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(",")
}

/// What the configuration allows `kind`, for [`Error::NoAlgorithm`]; with
/// [`Config::deterministic`] also what that switch admits, since it may be
/// what left nothing.
pub(crate) fn describe_filter(config: &Config, kind: CollKind) -> String {
    let join = |algos: Vec<Algo>| {
        let names: Vec<&str> = algos.iter().map(|a| a.name()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(",")
        }
    };
    let allowed = join(config.algo.allowed(kind, &Algo::ALL));
    if config.deterministic && kind.is_reduction() {
        let admitted = Algo::ALL
            .into_iter()
            .filter(|&a| gen::reduces_in_rank_order(a, kind))
            .collect();
        format!(
            "{allowed}; OXCCL_DETERMINISTIC=1 admits only {}, which reduce in rank order",
            join(admitted)
        )
    } else {
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let chooser = Chooser {
            policy: Policy::gpu(&topo, &[0; 8], 16),
            protos: &[Proto::Simple, Proto::LL],
            max_channels: 16,
            ll1_bytes: 0,
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
        // Registered, 256 MiB: what the built-in sweep measured fastest
        // for each collective (two-shot AllReduce, all-pairs the others).
        let sweep = oxccl_topo::calibrate::parse_sweep(oxccl_topo::calibrate::SHARED_GPU).unwrap();
        let mut fastest: HashMap<CollKind, (f64, Algo)> = HashMap::new();
        for r in sweep.results.iter().filter(|r| r.bytes == big as u64) {
            let (kind, algo) = (r.coll.parse().unwrap(), r.algo.parse().unwrap());
            let e = fastest.entry(kind).or_insert((f64::INFINITY, algo));
            if r.time_us < e.0 {
                *e = (r.time_us, algo);
            }
        }
        assert_eq!(fastest.len(), 6);
        for (kind, (_, algo)) in fastest {
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
        // Launch-bound sizes (the sweep's points up to 2 KiB, the 2026-12-04 20:28 H200 run): for
        // every collective and size, the configuration the selector picks,
        // where the sweep timed it, ran within 10% of the fastest point
        // measured at that size (the target of `sweep --pick`).
        let mut checked = 0;
        for r in sweep.results.iter().filter(|r| r.bytes <= 2048) {
            let kind: CollKind = r.coll.parse().unwrap();
            let c = pick(kind, r.bytes as usize, true);
            let same_size = || {
                sweep
                    .results
                    .iter()
                    .filter(|q| (q.coll.as_str(), q.bytes) == (r.coll.as_str(), r.bytes))
            };
            let best = same_size().map(|q| q.time_us).fold(f64::INFINITY, f64::min);
            let own: Vec<f64> = same_size()
                .filter(|q| {
                    let algo: Algo = q.algo.parse().unwrap();
                    let proto: Proto = q.proto.parse().unwrap();
                    (algo, proto) == (c.algo, c.proto)
                        && (!is_direct(algo) || q.registered == c.is_direct())
                })
                .map(|q| q.time_us)
                .collect();
            if let Some(&t) = own.iter().min_by(|a, b| a.total_cmp(b)) {
                assert!(
                    t <= 1.10 * best,
                    "{kind} {} B: {c} ran {t} us, best {best}",
                    r.bytes
                );
                checked += 1;
            }
        }
        assert!(checked >= 20, "only {checked} small points checked");
        // The model predicts the measured time.
        let t = pick(CollKind::AllReduce, big, true).predicted_us.unwrap();
        assert!((1090.0..1140.0).contains(&t), "{t}");
    }

    #[test]
    fn shared_h200_registered_allreduce_takes_no_ring_from_8_bytes_to_1_gib() {
        // Ring measured 3101 µs at 256 MiB against two-shot's 1115, and
        // 47-60 µs at 32 B-128 KiB against 25-28 for the LL trees (docs/perf/LOG.md, 2026-12-04 20:28 H200):
        // on registered buffers the model must not prefer it at any size.
        // Launch-bound calls take an LL tree or chain (the direct plans'
        // barriers cost 2-5 µs more there, the 2026-12-04 20:28 H200 run), from 1 MiB two-shot
        // with every channel. A registered direct plan has no FIFO, so it
        // is reported as Simple; a FIFO plan of a direct algorithm runs
        // under LL.
        let (ch, cfg) = shared_h200(None);
        for e in 0..=27 {
            let bytes = 8usize << e;
            let c = ch.choose(&cfg, CollKind::AllReduce, bytes, true).unwrap();
            println!("{bytes:>11} B: {c}");
            assert_ne!(c.algo, Algo::Ring, "{bytes} B: {c}");
            if is_direct(c.algo) {
                let proto = if c.is_direct() {
                    Proto::Simple
                } else {
                    Proto::LL
                };
                assert_eq!(c.proto, proto, "{bytes} B: {c}");
            }
            if bytes <= 2048 {
                let tree = matches!(c.algo, Algo::Chain | Algo::BinaryTree);
                assert!(tree && c.proto == Proto::LL, "{bytes} B: {c}");
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
                if c.is_direct() {
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
        assert!(!c.is_direct(), "{c}");
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
        // One-shot alone at 8 B (NCCL_ALGO=oneshot): its FIFO plan under
        // LL (docs/perf/LOG.md, 2026-12-04 20:28 H200: 30.5-32.5 µs) or its direct plan, whichever the model
        // predicts faster; the choice's prediction is that plan's.
        let (one, one_cfg) = shared_h200(Some("oneshot"));
        let c = one.choose(&one_cfg, CollKind::AllReduce, 8, true).unwrap();
        assert_eq!(c.algo, Algo::OneShot, "{c}");
        let as_plan = |proto, transport| Choice {
            proto,
            transport,
            ..c
        };
        let fifo_plan = as_plan(Proto::LL, Transport::Fifo);
        let direct_plan = as_plan(Proto::Simple, Transport::Direct);
        let predict = |plan: &Choice| {
            one.policy
                .predict(CollKind::AllReduce, 8, true, plan)
                .unwrap()
        };
        let (fifo, direct) = (predict(&fifo_plan), predict(&direct_plan));
        let (want, t) = if fifo < direct {
            ((Proto::LL, false), fifo)
        } else {
            ((Proto::Simple, true), direct)
        };
        assert_eq!(
            (c.proto, c.is_direct()),
            want,
            "{c}: fifo {fifo}, direct {direct}"
        );
        assert_eq!(c.predicted_us, Some(t), "{c}");
        // 256 MiB: the direct two-shot, as before.
        let c = pick(&cfg, 256 << 20, true);
        assert_eq!(
            (c.algo, c.proto, c.channels, c.is_direct()),
            (Algo::TwoShot, Proto::Simple, 16, true),
            "{c}"
        );
        // NCCL_PROTO=simple (or its OXCCL_ twin) leaves no FIFO protocol:
        // the direct plan comes back.
        for var in ["NCCL_PROTO", "OXCCL_PROTO"] {
            let (ch, cfg) = shared_h200_with(&[(var, "simple")]);
            let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
            assert_eq!(c.proto, Proto::Simple, "{var}: {c}");
            assert!(c.is_direct() && c.forced, "{var}: {c}");
        }
        // NCCL_ALGO filters the FIFO variants as the direct plans.
        let (ch, cfg) = shared_h200(Some("twoshot"));
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
        assert_eq!(c.algo, Algo::TwoShot, "{c}");
        let (ch, cfg) = shared_h200(Some("ring"));
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, true).unwrap();
        assert_eq!((c.algo, c.is_direct()), (Algo::Ring, false), "{c}");
        // Unregistered calls: FIFO plans throughout, LL when tiny.
        let (ch, cfg) = shared_h200(None);
        let c = ch.choose(&cfg, CollKind::AllReduce, 8, false).unwrap();
        assert_eq!((c.proto, c.is_direct()), (Proto::LL, false), "{c}");
        let c = ch
            .choose(&cfg, CollKind::AllReduce, 256 << 20, false)
            .unwrap();
        assert_eq!(
            (c.algo, c.proto, c.is_direct()),
            (Algo::Ring, Proto::Simple, false)
        );
        // The registered picks the facade reports at a few sizes.
        for bytes in [8, 4 << 10, 64 << 10, 1 << 20, 256 << 20] {
            pick(&cfg, bytes, true);
        }
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
            let reg = ch
                .policy
                .selector(true, Algo::AllPairs, Transport::Direct)
                .clone();
            let mut consts = reg.constants().clone();
            consts.avoid.push((CollKind::AllGather, Algo::AllPairs));
            ch.policy = ch
                .policy
                .clone()
                .with_registered(reg.with_constants(consts));
            ch.choose(&cfg, CollKind::AllGather, 256 << 20, true)
                .unwrap()
        };
        let c = avoiding(&[("NCCL_ALGO", "allpairs"), ("NCCL_PROTO", "simple")]);
        assert_eq!(
            (c.algo, c.forced, c.is_direct()),
            (Algo::AllPairs, true, true),
            "{c}"
        );
        assert_eq!(c.predicted_us, None, "{c}");
        // The avoid list names the registered plan: where LL is allowed,
        // the model times the FIFO variant instead.
        let c = avoiding(&[("NCCL_ALGO", "allpairs")]);
        let got = (c.algo, c.proto, c.is_direct());
        assert_eq!(got, (Algo::AllPairs, Proto::LL, false), "{c}");
        assert!(c.predicted_us.is_some(), "{c}");
    }

    /// With deterministic reductions every pick of a reduction, at every
    /// size, registered or not, is a plan that reduces in rank order, and
    /// the data-movement collectives keep their picks; a forced
    /// algorithm that does not reduce in rank order is refused, naming
    /// the switch and what it admits.
    #[test]
    fn deterministic_picks_only_rank_order_plans() {
        let (ch, cfg) = shared_h200_with(&[("OXCCL_DETERMINISTIC", "1")]);
        let (free, free_cfg) = shared_h200(None);
        assert!(cfg.deterministic);
        let mut changed = 0;
        for kind in CollKind::ALL {
            if kind == CollKind::SendRecv {
                continue;
            }
            for e in 0..=27 {
                let bytes = 8usize << e;
                for registered in [false, true] {
                    let c = ch.choose(&cfg, kind, bytes, registered).unwrap();
                    let was = free.choose(&free_cfg, kind, bytes, registered).unwrap();
                    assert!(
                        gen::reduces_in_rank_order(c.algo, kind),
                        "{kind} {bytes} B registered {registered}: {c}"
                    );
                    if kind.is_reduction() {
                        changed += usize::from(c.algo != was.algo);
                    } else {
                        assert_eq!(c, was, "{kind} {bytes} B registered {registered}");
                    }
                }
            }
        }
        // Without the switch rings and trees win somewhere, so the switch
        // changes some picks (else this test could not fail).
        assert!(changed > 0);
        for algo in ["ring", "tree", "chain", "btree"] {
            let (ch, cfg) = shared_h200_with(&[("OXCCL_DETERMINISTIC", "1"), ("NCCL_ALGO", algo)]);
            match ch.choose(&cfg, CollKind::AllReduce, 1 << 20, true) {
                Err(e @ Error::NoAlgorithm { .. }) => {
                    let m = e.to_string();
                    assert!(
                        m.contains("OXCCL_DETERMINISTIC=1 admits only oneshot,twoshot"),
                        "{m}"
                    );
                }
                other => panic!("NCCL_ALGO={algo}: {other:?}"),
            }
            // Data movement is unaffected where the algorithm serves it.
            if algo == "ring" {
                let c = ch.choose(&cfg, CollKind::AllGather, 1 << 20, true).unwrap();
                assert_eq!(c.algo, Algo::Ring, "{c}");
            }
        }
        let (ch, cfg) = shared_h200_with(&[("OXCCL_DETERMINISTIC", "1"), ("NCCL_ALGO", "ring")]);
        let e = ch
            .choose(&cfg, CollKind::ReduceScatter, 64, false)
            .unwrap_err();
        assert!(e.to_string().contains("admits only allpairs"), "{e}");
    }

    /// The model sees each rank on the GPU it runs on: ranks on GPUs 1,
    /// 3, 5, 7 of an 8-GPU host, not on GPUs 0 to 3 by rank.
    #[test]
    fn the_model_places_ranks_on_their_own_gpus() {
        let config = Config {
            topology: Some(Topology::preset("hgx-h100", 1).unwrap()),
            ..Config::default()
        };
        let (_, gpus) = placement(&config, BackendKind::Cuda, 4, Some(vec![1, 3, 5, 7])).unwrap();
        assert_eq!(gpus, [1, 3, 5, 7]);
        let (_, gpus) = placement(&config, BackendKind::Cuda, 4, None).unwrap();
        assert_eq!(gpus, [0, 1, 2, 3]);
        assert!(placement(&config, BackendKind::Host, 4, None).is_none());
    }
}
