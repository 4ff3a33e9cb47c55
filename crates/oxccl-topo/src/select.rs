//! The selector: algorithm, protocol and channel count per call, from the
//! cost model, among what the caller allows.
//!
//! ```
//! use oxccl_core::{Algo, CollKind, Proto};
//! use oxccl_topo::{select::Selector, Topology};
//!
//! let topo = Topology::preset("hgx-h100", 1).unwrap();
//! let sel = Selector::new(&topo, &[0, 1, 2, 3, 4, 5, 6, 7]);
//! let c = sel.choose(CollKind::AllReduce, 1 << 30, 8, &Algo::ALL, &[Proto::Simple, Proto::LL]);
//! assert_eq!(c.algo, Algo::Ring);
//! assert_eq!(sel.rings().len() as u32, sel.max_channels());
//! ```

use oxccl_core::{Algo, CollKind, Proto};

use crate::consts::{Constants, HopClass};
use crate::graph::{NodeId, Topology};
use crate::paths::PathClass;
use crate::search::{search_rings, RingSet};
use crate::shape::Shape;

/// How a plan moves data between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Through FIFO connections: every algorithm has this form, and it
    /// is the only one on plain (unregistered) buffers.
    Fifo,
    /// Reading and writing peers' registered buffers in place, with no
    /// FIFO (and so no protocol at work): the plans of one-shot, two-shot
    /// and all-pairs on registered buffers (`comm.alloc`).
    Direct,
}

/// What was chosen for one call: by the selector, the policy
/// ([`crate::policy`]) or, with the configuration's overrides, the facade.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub algo: Algo,
    pub proto: Proto,
    pub channels: u32,
    /// The plan's data path. A direct algorithm (one-shot, two-shot,
    /// all-pairs) on registered buffers may still run its FIFO plan,
    /// under LL, where the model predicts it faster.
    pub transport: Transport,
    /// The cost model's prediction in µs (`None` where the model does not
    /// time the combination an override forced).
    pub predicted_us: Option<f64>,
    /// Whether the configuration (environment) restricted the choice.
    pub forced: bool,
}

impl Choice {
    /// The predicted time, infinite where there is none (for comparisons).
    pub fn us(&self) -> f64 {
        self.predicted_us.unwrap_or(f64::INFINITY)
    }

    /// Whether the plan reads and writes peers' buffers directly.
    pub fn is_direct(&self) -> bool {
        self.transport == Transport::Direct
    }

    /// Whether the pick is copies only, run on a GPU's copy engines with
    /// no SM ([`Algo::sm_free`]).
    pub fn sm_free(&self) -> bool {
        self.algo.sm_free()
    }
}

impl std::fmt::Display for Choice {
    /// The line the communicator logs under `NCCL_DEBUG=INFO`:
    /// `algo ring proto simple channels 2 predicted 12.3 us`, then
    /// ` (override)` when the configuration restricted the choice. A
    /// one-shot, two-shot or all-pairs running its FIFO plan is marked
    /// after its protocol: `algo oneshot proto ll (fifo) channels 1 ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "algo {} proto {}", self.algo, self.proto)?;
        if crate::consts::is_direct(self.algo) && self.transport == Transport::Fifo {
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

/// Channel counts the selector considers by default.
pub const DEFAULT_MAX_CHANNELS: u32 = 16;

/// Picks algorithms for one communicator. Build it once per communicator.
#[derive(Clone, Debug)]
pub struct Selector {
    consts: Constants,
    shape: Shape,
    nranks: u32,
    max_channels: u32,
    /// Ring order of GPU positions inside a host, one per ring found.
    gpu_rings: Vec<Vec<usize>>,
    /// For each host spanned (in order), for each GPU position, its ranks.
    host_ranks: Vec<Vec<Vec<u32>>>,
    ringset: RingSet,
    /// Path classes between the first host's GPU positions.
    classes0: Vec<Vec<PathClass>>,
}

impl Selector {
    /// A selector for ranks placed on GPUs: `ranks_to_gpus[r]` is rank
    /// `r`'s GPU index in `topo.gpus()`. Ranks may share a GPU. An index
    /// out of range is treated as GPU 0 (with a warning), and a topology
    /// with no GPU as one GPU on one host, so this never panics.
    pub fn new(topo: &Topology, ranks_to_gpus: &[usize]) -> Selector {
        let all = topo.gpus();
        let nranks = ranks_to_gpus.len().max(1) as u32;
        let gpu_of = |r: usize| -> Option<NodeId> {
            let g = ranks_to_gpus.get(r).copied().unwrap_or(0);
            match all.get(g) {
                Some(&n) => Some(n),
                None => {
                    if !all.is_empty() {
                        tracing::warn!(
                            "selector: rank {r} on GPU {g}, which does not exist; using GPU 0"
                        );
                    }
                    all.first().copied()
                }
            }
        };
        // Hosts in order of first appearance; GPUs per host likewise.
        let mut hosts: Vec<(u32, Vec<NodeId>, Vec<Vec<u32>>)> = Vec::new();
        for r in 0..ranks_to_gpus.len().max(1) {
            let g = gpu_of(r);
            let h = g.map_or(0, |g| topo.nodes[g].host);
            let idx = match hosts.iter().position(|x| x.0 == h) {
                Some(i) => i,
                None => {
                    hosts.push((h, Vec::new(), Vec::new()));
                    hosts.len() - 1
                }
            };
            let entry = &mut hosts[idx];
            let pos = match g.and_then(|g| entry.1.iter().position(|&x| x == g)) {
                Some(p) => p,
                None => {
                    entry.1.extend(g);
                    entry.2.push(Vec::new());
                    entry.2.len() - 1
                }
            };
            entry.2[pos].push(r as u32);
        }
        let (_, gpus0, ranks0) = &hosts[0];
        let per_gpu = ranks0.iter().map(Vec::len).max().unwrap_or(1).max(1) as f64;
        let ringset = if gpus0.is_empty() {
            RingSet {
                rings: vec![vec![0]],
                bw_per_ring: crate::consts::copy_bw_for_sm(0),
                nvlink_only: true,
            }
        } else {
            search_rings(topo, gpus0, DEFAULT_MAX_CHANNELS as usize)
        };
        let local = gpus0
            .iter()
            .map(|&g| topo.local_bw(g))
            .fold(f64::INFINITY, f64::min);
        let local = if local.is_finite() {
            local
        } else {
            crate::consts::copy_bw_for_sm(0)
        };
        let intra_bw = ringset.total_bw().min(local) / per_gpu;
        let classes0: Vec<Vec<PathClass>> = gpus0
            .iter()
            .map(|&a| gpus0.iter().map(|&b| topo.path(a, b).class).collect())
            .collect();
        let pairs_nvlink = classes0.iter().flatten().all(|c| c.is_nvlink());
        let direct_bw = if gpus0.len() <= 1 {
            local / per_gpu
        } else {
            gpus0
                .iter()
                .map(|&g| topo.nvlinks_of(g).map(|(_, l)| l.bw).sum::<f64>())
                .fold(f64::INFINITY, f64::min)
                / per_gpu
        };
        let mut nics: Vec<NodeId> = Vec::new();
        let mut inter_bw = 0.0;
        for &g in gpus0 {
            if let Some((nic, p)) = topo.nearest_nic(g) {
                if !nics.contains(&nic) {
                    nics.push(nic);
                    inter_bw += p.bw.min(topo.nic_bw(nic));
                }
            }
        }
        if inter_bw <= 0.0 {
            inter_bw = crate::consts::NET_DEFAULT_BW;
        }
        let shape = Shape {
            nnodes: hosts.len() as u32,
            ranks_per_node: hosts
                .iter()
                .map(|h| h.2.iter().map(Vec::len).sum::<usize>())
                .max()
                .unwrap_or(1) as u32,
            ranks_per_gpu: per_gpu as u32,
            intra_bw,
            intra_hop: if ringset.nvlink_only {
                HopClass::NvLink
            } else {
                HopClass::Pcie
            },
            inter_bw,
            direct_ok: hosts.len() == 1 && pairs_nvlink,
            direct_bw,
            ll128_ok: pairs_nvlink,
        };
        Selector {
            consts: Constants::default(),
            shape,
            nranks,
            max_channels: DEFAULT_MAX_CHANNELS,
            gpu_rings: ringset.rings.clone(),
            host_ranks: hosts.into_iter().map(|h| h.2).collect(),
            ringset,
            classes0,
        }
    }

    /// Places the ranks on hosts that talk over the network: `host_of[r]`
    /// is rank `r`'s host (any labels; equal labels, one host), each rank
    /// its own position there. A host's ranks sit together in every ring,
    /// hosts in order of first appearance, so each ring crosses each host
    /// boundary once per channel; the double binary tree runs across
    /// hosts with chains inside. Inside a host a hop carries `intra_bw`
    /// (GB/s), between hosts the host's network `net_bw`. Ignored (with a
    /// warning) when `host_of` does not give one host per rank.
    pub fn with_hosts(mut self, host_of: &[u32], intra_bw: f64, net_bw: f64) -> Self {
        if host_of.len() != self.nranks as usize {
            tracing::warn!(
                "selector: {} hosts given for {} ranks; keeping one host",
                host_of.len(),
                self.nranks
            );
            return self;
        }
        let mut hosts: Vec<(u32, Vec<Vec<u32>>)> = Vec::new();
        for (r, &h) in host_of.iter().enumerate() {
            match hosts.iter_mut().find(|x| x.0 == h) {
                Some(x) => x.1.push(vec![r as u32]),
                None => hosts.push((h, vec![vec![r as u32]])),
            }
        }
        self.shape.nnodes = hosts.len() as u32;
        self.shape.ranks_per_node = hosts.iter().map(|h| h.1.len()).max().unwrap_or(1) as u32;
        self.shape.intra_bw = intra_bw;
        self.shape.inter_bw = net_bw;
        self.shape.direct_ok = false;
        self.shape.ll128_ok = false;
        self.host_ranks = hosts.into_iter().map(|h| h.1).collect();
        self.gpu_rings = vec![vec![0]];
        self
    }

    /// Each rank's host position (in order of first appearance), for
    /// ranks on more than one host; empty on one host.
    pub fn hosts(&self) -> Vec<u32> {
        if self.host_ranks.len() <= 1 {
            return Vec::new();
        }
        let mut v = vec![0; self.nranks as usize];
        for (h, gpus) in self.host_ranks.iter().enumerate() {
            for &r in gpus.iter().flatten() {
                if let Some(x) = v.get_mut(r as usize) {
                    *x = h as u32;
                }
            }
        }
        v
    }

    /// Uses other constants (e.g. from [`crate::calibrate`]).
    pub fn with_constants(mut self, consts: Constants) -> Self {
        self.consts = consts;
        self
    }

    /// Caps the channel count (at least 1); [`Selector::rings`] returns
    /// this many rings.
    pub fn with_max_channels(mut self, max: u32) -> Self {
        self.max_channels = max.max(1);
        self
    }

    /// The largest channel count `choose` may return.
    pub fn max_channels(&self) -> u32 {
        self.max_channels
    }

    /// The placement as the model sees it.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The constants in use.
    pub fn constants(&self) -> &Constants {
        &self.consts
    }

    /// The rings found inside the first host (GPU positions) and their
    /// bandwidth.
    pub fn ring_set(&self) -> &RingSet {
        &self.ringset
    }

    /// One ring per channel (`max_channels` of them), as rank orders: each
    /// host's GPUs in the searched order, ranks of one GPU next to each
    /// other, hosts one after another.
    pub fn rings(&self) -> Vec<Vec<u32>> {
        (0..self.max_channels as usize)
            .map(|c| {
                let order = &self.gpu_rings[c % self.gpu_rings.len()];
                let mut ring = Vec::with_capacity(self.nranks as usize);
                for host in &self.host_ranks {
                    if order.len() == host.len() {
                        for &p in order {
                            ring.extend_from_slice(&host[p]);
                        }
                    } else {
                        // A host shaped differently from the first keeps its own order.
                        for ranks in host {
                            ring.extend_from_slice(ranks);
                        }
                    }
                }
                ring
            })
            .collect()
    }

    /// The path class between ranks `a` and `b`: `X` when they share a
    /// GPU, `NET` on different hosts, else the class of their GPUs' path
    /// (first host only, as the model sees it). `None` for a rank out of
    /// range or a host other than the first.
    pub fn class_between(&self, a: u32, b: u32) -> Option<PathClass> {
        let (ha, pa) = self.locate(a)?;
        let (hb, pb) = self.locate(b)?;
        if ha != hb {
            return Some(PathClass::Net);
        }
        if pa == pb {
            return Some(PathClass::X);
        }
        if ha != 0 {
            return None;
        }
        self.classes0.get(pa)?.get(pb).copied()
    }

    /// (host position, GPU position within the host) of rank `r`.
    fn locate(&self, r: u32) -> Option<(usize, usize)> {
        self.host_ranks.iter().enumerate().find_map(|(h, gpus)| {
            gpus.iter()
                .position(|ranks| ranks.contains(&r))
                .map(|p| (h, p))
        })
    }

    /// The channel counts considered: powers of two up to the maximum, and
    /// the maximum.
    pub fn channel_options(&self) -> Vec<u32> {
        let mut v: Vec<u32> = (0..6)
            .map(|i| 1u32 << i)
            .filter(|&c| c < self.max_channels)
            .collect();
        v.push(self.max_channels);
        v
    }

    /// The best (algorithm, protocol) among those allowed, with the fewest
    /// channels that come within 1% of its best time, among the channel
    /// options that give each channel at least
    /// [`Constants::min_channel_bytes`] (one channel always qualifies).
    /// `bytes` is the nccl-tests size of the call (see [`crate::model`]).
    ///
    /// `allowed_protos` must hold only protocols the caller's backend
    /// implements (today Simple and LL; LL128 is modelled but no backend
    /// runs it): the selector picks LL128 wherever the model prefers it
    /// and it is allowed, so passing `Proto::ALL` can return a protocol
    /// the backend cannot execute. Likewise `allowed_algos` should hold
    /// algorithms that have a generator for `kind`. When nothing
    /// allowed applies (for instance only LL128 off NVLink, or only
    /// all-pairs on PCIe), falls back to Ring with the first allowed
    /// protocol that the model accepts, else Simple.
    pub fn choose(
        &self,
        kind: CollKind,
        bytes: usize,
        nranks: u32,
        allowed_algos: &[Algo],
        allowed_protos: &[Proto],
    ) -> Choice {
        let pairs: Vec<(Algo, Proto)> = allowed_algos
            .iter()
            .flat_map(|&a| allowed_protos.iter().map(move |&p| (a, p)))
            .collect();
        self.choose_among(kind, bytes, nranks, &pairs)
            .unwrap_or_else(|| {
                let proto = allowed_protos
                    .iter()
                    .copied()
                    .find(|&p| {
                        self.predict(kind, Algo::Ring, p, 1, bytes, nranks)
                            .is_some()
                    })
                    .unwrap_or(Proto::Simple);
                self.best_channels(kind, Algo::Ring, proto, bytes, nranks)
                    .unwrap_or(Choice {
                        algo: Algo::Ring,
                        proto,
                        channels: 1,
                        transport: Transport::Fifo,
                        predicted_us: None,
                        forced: false,
                    })
            })
    }

    /// The best of `candidates` (algorithm, protocol pairs, earlier ones
    /// winning ties), each with its channel count as [`Selector::choose`]
    /// picks it; `None` when the model times none of them. For callers
    /// whose protocol choice depends on the algorithm (a registered
    /// direct plan has no FIFO, so its protocol changes nothing).
    pub fn choose_among(
        &self,
        kind: CollKind,
        bytes: usize,
        nranks: u32,
        candidates: &[(Algo, Proto)],
    ) -> Option<Choice> {
        let mut best: Option<Choice> = None;
        for &(algo, proto) in candidates {
            if let Some(c) = self.best_channels(kind, algo, proto, bytes, nranks) {
                if best.is_none_or(|b| c.us() < b.us()) {
                    best = Some(c);
                }
            }
        }
        best
    }

    /// `algo` with `proto`: the fewest channels within 1% of the best
    /// time, among the options that leave each channel its minimum bytes
    /// and whose plan has at most `max_channels` ([`Algo::plan_channels`]).
    fn best_channels(
        &self,
        kind: CollKind,
        algo: Algo,
        proto: Proto,
        bytes: usize,
        nranks: u32,
    ) -> Option<Choice> {
        let min_bytes = self.consts.min_channel_bytes(algo);
        let times: Vec<(u32, f64)> = self
            .channel_options()
            .into_iter()
            .filter(|&c| c == 1 || bytes as f64 >= f64::from(c) * min_bytes)
            // The plan must fit: the double binary tree makes two a channel.
            .filter(|&c| algo.plan_channels(c) <= self.max_channels)
            .filter_map(|c| Some((c, self.predict(kind, algo, proto, c, bytes, nranks)?)))
            .collect();
        let min = times.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
        let (channels, predicted_us) = times.into_iter().find(|t| t.1 <= min * 1.01 + 1e-3)?;
        Some(Choice {
            algo,
            proto,
            channels,
            transport: Transport::Fifo,
            predicted_us: Some(predicted_us).filter(|t| t.is_finite()),
            forced: false,
        })
    }
}
