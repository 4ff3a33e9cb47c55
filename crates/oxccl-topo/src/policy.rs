//! The selection policy: how the cost model is set up for a backend and a
//! placement, and which plans a call may take. The facade adds only the
//! configuration's filters (`NCCL_ALGO`, `NCCL_PROTO`, channels) and a memo.
//!
//! Two selectors per communicator set: one times the plans of calls on
//! registered buffers (the direct plans of one-shot, two-shot and
//! all-pairs, with the FIFO algorithms), the other FIFO plans (every plan
//! on plain buffers, and the FIFO variants of the direct algorithms that a
//! call on registered buffers may take under LL).
//!
//! - **Host** (ranks are threads of one CPU process): a topology with no
//!   GPU, which [`Selector`] treats as one device shared by every rank;
//!   constants in memory passes ([`host_constants`]). Its predictions rank
//!   the candidates rather than forecast host wall time.
//! - **GPU**: channels are thread blocks, so a channel carries at most its
//!   share of the rank's bandwidth ([`gpu_constants`]). Ranks sharing one
//!   GPU take the built-in shared-GPU calibration, fitted against the
//!   model of the machine it was measured on and carried to this GPU's own
//!   model, whose memory bandwidth comes from the device's attributes (see
//!   [`crate::calibrate::builtin_for`]).
//!
//! Every rank of a set decides from the same inputs, so all ranks pick
//! alike and run parts of one plan.

use oxccl_core::{Algo, CollKind, Proto};

use crate::calibrate::{builtin_for, carry, fit, fit_fifo, SHARED_GPU_MACHINE};
use crate::consts::{
    copy_bw_for_sm, is_direct, Constants, CopyEngineModel, OneShotLlModel, PROCESS_HOP_US,
};
use crate::graph::{NodeId, Topology};
use crate::netdev::NetDevice;
use crate::select::{Choice, Selector, Transport};

/// Bandwidth of one memory pass (reading or writing each byte once) the
/// host model assumes, GB/s: twice a single-thread memcpy, which measured 8
/// to 20 GB/s on the 2-core development VM (docs/perf/LOG.md). It turns
/// the model's nominal device bandwidth into host terms, so predictions are
/// of the right order; `calibrate` can fit better ones from a sweep.
const HOST_PASS_GBPS: f64 = 20.0;

/// What one rank's FIFO messages move inside a host, GB/s: three memory
/// passes per byte (see [`host_constants`]). Over the network it bounds a
/// ring's bandwidth however fast the link is.
const HOST_FIFO_GBPS: f64 = HOST_PASS_GBPS / 3.0;

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
pub fn host_constants(nranks: u32, registered: bool) -> Constants {
    let pass = HOST_PASS_GBPS / copy_bw_for_sm(0);
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

/// Most channels (thread blocks) a rank's plan uses on a GPU.
pub const MAX_GPU_CHANNELS: u32 = 32;

/// The channels each of `ranks_on_gpu` ranks sharing a GPU of `sm_count`
/// SMs may use: its share of the SMs, one block per channel, 1 to
/// [`MAX_GPU_CHANNELS`]. The kernels of a call spin on each other, so every
/// block of every rank on the GPU must be resident at once; the CUDA
/// backend caps plans with it and `xtask topo`/`simulate` model the same.
pub fn gpu_channel_cap(sm_count: u32, ranks_on_gpu: u32) -> u32 {
    (sm_count / ranks_on_gpu.max(1)).clamp(1, MAX_GPU_CHANNELS)
}

/// The model's constants for a GPU backend whose channels are thread
/// blocks: a rank's bus bandwidth (`shape.intra_bw`, its share of the GPU)
/// needs `max_channels` blocks (its share of the SMs), so one channel
/// carries at most `intra_bw / max_channels`. The defaults' per-channel
/// caps are NVLink figures (24 GB/s, Simple); with several ranks on one
/// GPU a block's share is smaller, and the model must ask for more blocks
/// to reach the HBM floor (on the H200, 16 channels per rank for 8 ranks
/// ran 2.4× faster than 4). Caps only go down, protocols keep their ratio.
pub fn gpu_constants(selector: &Selector, max_channels: u32) -> Constants {
    let base = selector.constants().clone();
    let per_block = selector.shape().intra_bw / f64::from(max_channels.max(1));
    let simple = base.channel_cap(Proto::Simple);
    let scale = (per_block / simple).min(1.0);
    Constants {
        chan_cap: base.chan_cap.map(|c| c * scale),
        ..base
    }
}

/// The uncalibrated (registered, FIFO) selectors of a GPU backend.
fn plain_gpu_selectors(selector: Selector, max_channels: u32) -> (Selector, Selector) {
    let fifo = gpu_constants(&selector, max_channels);
    let registered = Constants {
        direct_fifo_free: true,
        ..fifo.clone()
    };
    let reg = selector.clone().with_constants(registered);
    (reg, selector.with_constants(fifo))
}

/// The (registered, FIFO) selectors of a GPU backend. Where a built-in
/// calibration fits the placement (ranks sharing one GPU, of any model),
/// each is fitted to the points that time its plans ([`fit`] the
/// registered direct ones, [`fit_fifo`] the FIFO variants; ring and trees
/// count in both) against the model of the machine the sweep ran on, then
/// carried over to this GPU's model ([`carry`]). On one GPU the HBM copy
/// rate is the floor, and what counts is how many bytes an algorithm
/// moves: registered two-shot AllReduce moves about 2·S per rank and ran
/// 1115 µs at 256 MiB on 8 ranks of an H200, the FIFO ring about 5.5·S and
/// 3101 µs, which the uncalibrated NVLink-era constants got the wrong way
/// round.
///
/// The calibration timed threads of one process; where `launcher` says
/// each rank is a process of its own, every sequential hop also costs
/// [`PROCESS_HOP_US`] (see there: the threads' serialized launches hid
/// it).
pub fn gpu_selectors(
    topo: &Topology,
    gpus: &[usize],
    max_channels: u32,
    launcher: Launcher,
) -> (Selector, Selector) {
    let selector = Selector::new(topo, gpus).with_max_channels(max_channels);
    let (reg, fifo) = plain_gpu_selectors(selector, max_channels);
    let Some(sweep) = builtin_for(topo, gpus) else {
        return (reg, fifo);
    };
    let reference = Topology::preset(SHARED_GPU_MACHINE, 1).unwrap_or_else(|_| topo.clone());
    let on_reference =
        Selector::new(&reference, &vec![0; gpus.len()]).with_max_channels(max_channels);
    let (reg_ref, fifo_ref) = plain_gpu_selectors(on_reference, max_channels);
    let exposed_hop_us = match launcher {
        Launcher::OneProcess => 0.0,
        Launcher::ProcessPerRank => PROCESS_HOP_US,
    };
    let registered = Constants {
        exposed_hop_us,
        ..carry(&fit(&reg_ref, &sweep), reg.constants())
    };
    let fifo_fitted = Constants {
        exposed_hop_us,
        ..carry(&fit_fifo(&fifo_ref, &sweep), fifo.constants())
    };
    (
        reg.with_constants(registered),
        fifo.with_constants(fifo_fitted),
    )
}

/// Who launches the kernels of a GPU backend's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Launcher {
    /// Threads of one process (one driver context per device launches
    /// them one after another).
    #[default]
    OneProcess,
    /// Each rank is a process of its own, launching independently.
    ProcessPerRank,
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
pub fn candidates(algos: &[Algo], protos: &[Proto], registered: bool) -> Vec<(Algo, Proto)> {
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
pub fn fifo_variants(algos: &[Algo], protos: &[Proto]) -> Vec<(Algo, Proto)> {
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

/// Where ranks that talk over the network are, and what the network gives
/// (the host backend's ranks as processes over `oxccl-net`).
#[derive(Clone, Debug, PartialEq)]
pub struct NetPlacement {
    /// Each rank's host (any labels; equal labels, one host). Ranks of one
    /// host forced onto the network each count as a host of their own:
    /// every hop of theirs crosses it.
    pub host_of: Vec<u32>,
    /// One host's network bandwidth, GB/s (0: unknown, the model's
    /// default [`crate::consts::NET_DEFAULT_BW`]).
    pub bw: f64,
    /// One network hop's latency, µs (`None`: the model's constant).
    pub hop_us: Option<f64>,
    /// The network's device as its transport states it (a net plugin's
    /// device, the built-in TCP's interface), where known: its speed
    /// stands in for an unknown `bw`, its latency floors the hop's, and
    /// [`NetPlacement::nic`] places it in a topology.
    pub device: Option<NetDevice>,
}

impl NetPlacement {
    /// The device as a NIC of `base` (host 0, this machine), and its node:
    /// the PCI device its path names, else a NIC under a CPU.
    pub fn nic(&self, base: &Topology) -> Option<(Topology, NodeId)> {
        self.device.as_ref().map(|d| base.with_net_device(0, d))
    }

    /// One hop's latency the model takes, µs: the measured hop, at least
    /// the device's stated latency; `None` where neither is known.
    pub fn hop_latency_us(&self) -> Option<f64> {
        let stated = self
            .device
            .as_ref()
            .map(|d| d.latency_us)
            .filter(|l| *l > 0.0);
        match (self.hop_us, stated) {
            (Some(h), Some(s)) => Some(h.max(s)),
            (h, s) => h.or(s),
        }
    }

    /// The network's bandwidth per host the model takes, GB/s: the
    /// placement's, else the device's stated speed, else the model's
    /// default [`crate::consts::NET_DEFAULT_BW`].
    pub fn bandwidth(&self) -> f64 {
        let stated = self
            .device
            .as_ref()
            .map_or(0.0, |d| f64::from(d.speed_mbps) / 8000.0);
        if self.bw > 0.0 {
            self.bw
        } else if stated > 0.0 {
            stated
        } else {
            crate::consts::NET_DEFAULT_BW
        }
    }
}

/// Channels a ring needs over the network to fill the link: a channel
/// runs its steps in order, so each ring round waits for its messages
/// (a block out, its reduction back) and one channel keeps the link busy
/// only part of the time. On the 2-core development VM (2 processes over
/// `lo`, 64 MiB AllReduce, docs/perf/LOG.md) 1, 2 and 4 channels moved
/// about 1.3, 1.6 and 1.9 GB/s.
pub const NET_CHANNELS_TO_FILL: f64 = 4.0;

/// Fewest bytes (nccl-tests size) a channel over the network is given:
/// two of the host backend's 512 KiB slots. A channel with less has one
/// message each way per ring step, and more channels then add messages
/// (each a hand-off through proxy and socket threads), not overlap.
pub const NET_CHANNEL_MIN_BYTES: f64 = 1024.0 * 1024.0;

/// The model's constants for ranks as processes over the network. A FIFO
/// message costs host memory passes inside a host (as [`host_constants`])
/// and the network's bandwidth between hosts, whichever is slower. A
/// channel carries at most [`NET_CHANNELS_TO_FILL`]-th of that slower
/// path's bandwidth and at least [`NET_CHANNEL_MIN_BYTES`], so
/// bandwidth-bound calls take that many channels and latency-bound ones
/// one (the fewest within 1% win), whatever the link's measured or stated
/// speed. (A quarter of the link alone would let one or two channels reach
/// the host's `HOST_FIFO_GBPS` on a link faster than about 13 GB/s, a
/// 200 or 400 Gb/s NIC or a fast loopback probe, and the selector would
/// stop there.) No plan is registered there: only FIFO plans are timed.
pub fn net_constants(p: &NetPlacement) -> Constants {
    let path = p.bandwidth().min(HOST_FIFO_GBPS);
    let mut c = Constants {
        chan_cap: [path / NET_CHANNELS_TO_FILL; 3],
        fifo_chan_min_bytes: NET_CHANNEL_MIN_BYTES,
        ..Constants::default()
    };
    if let Some(h) = p.hop_latency_us() {
        for fam in &mut c.hop_lat {
            fam[2] = [h; 3];
        }
    }
    c
}

/// What a plan's FIFO connections take of a device's memory, and how much
/// they may: a FIFO plan of all-pairs shape (one-shot, two-shot,
/// all-pairs) connects every rank to each of the n − 1 others on each
/// channel, so on one GPU its memory grows with the square of the ranks
/// sharing it (128 ranks on an H100: 128 × 127 LL connections of 4 MiB,
/// 65 GB, and the allocation failed). Rings and trees keep a few
/// connections per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkMemory {
    /// Bytes of one connection's buffer, per protocol ([`Proto::ALL`]
    /// order).
    pub per_link: [u64; 3],
    /// Ranks whose connections land in one device's memory (the busiest
    /// device's count).
    pub ranks_per_device: u32,
    /// Bytes one plan's connections may take on a device.
    pub budget: u64,
}

impl LinkMemory {
    /// The share of a device's memory one plan's connections may take.
    pub const SHARE: u64 = 4;

    /// Bytes the connections of a FIFO plan of `algo` under `proto` with
    /// `channels` channels take on the busiest device, for `nranks` ranks.
    pub fn need(&self, algo: Algo, proto: Proto, channels: u32, nranks: u32) -> u64 {
        let peers = if is_direct(algo) {
            nranks.saturating_sub(1)
        } else {
            // A ring's two neighbours, a tree's parent and two children.
            3
        };
        let p = Proto::ALL.iter().position(|&x| x == proto).unwrap_or(0);
        u64::from(self.ranks_per_device)
            * u64::from(peers)
            * u64::from(channels.max(1))
            * self.per_link[p]
    }

    /// Whether that plan's connections fit the budget.
    pub fn fits(&self, algo: Algo, proto: Proto, channels: u32, nranks: u32) -> bool {
        self.need(algo, proto, channels, nranks) <= self.budget
    }
}

/// The policy of one communicator set: its two selectors.
#[derive(Clone, Debug)]
pub struct Policy {
    registered: Selector,
    fifo: Selector,
    nranks: u32,
    /// Where FIFO connections must fit (`None`: anywhere).
    links: Option<LinkMemory>,
}

impl Policy {
    /// The host backend's policy for `nranks` threads of one process.
    pub fn host(nranks: u32, max_channels: u32) -> Policy {
        let topo = Topology::empty();
        let selector =
            Selector::new(&topo, &vec![0; nranks as usize]).with_max_channels(max_channels);
        Policy {
            registered: selector
                .clone()
                .with_constants(host_constants(nranks, true)),
            fifo: selector.with_constants(host_constants(nranks, false)),
            nranks,
            links: None,
        }
    }

    /// The policy of ranks as processes over the network ([`NetPlacement`]):
    /// rings and trees follow the hosts, a FIFO hop inside a host costs
    /// three memory passes per byte, one between hosts the network's
    /// bandwidth.
    pub fn network(p: &NetPlacement, max_channels: u32) -> Policy {
        let n = p.host_of.len().max(1);
        let selector = Selector::new(&Topology::empty(), &vec![0; n])
            .with_max_channels(max_channels)
            .with_hosts(&p.host_of, HOST_FIFO_GBPS, p.bandwidth())
            .with_constants(net_constants(p));
        Policy {
            registered: selector.clone(),
            fifo: selector,
            nranks: n as u32,
            links: None,
        }
    }

    /// Each rank's host position for plans across hosts (empty on one
    /// host): the double binary tree's chains and network edges follow it.
    pub fn hosts(&self) -> Vec<u32> {
        self.fifo.hosts()
    }

    /// A GPU backend's policy: rank `r` on GPU `gpus[r]` of `topo`, the
    /// ranks threads of one process.
    pub fn gpu(topo: &Topology, gpus: &[usize], max_channels: u32) -> Policy {
        Policy::gpu_launched(topo, gpus, max_channels, Launcher::OneProcess)
    }

    /// [`Policy::gpu`] with the ranks launched as `launcher` says.
    pub fn gpu_launched(
        topo: &Topology,
        gpus: &[usize],
        max_channels: u32,
        launcher: Launcher,
    ) -> Policy {
        let (registered, fifo) = gpu_selectors(topo, gpus, max_channels, launcher);
        Policy {
            registered,
            fifo,
            nranks: gpus.len().max(1) as u32,
            links: None,
        }
    }

    /// A policy from two selectors made elsewhere (tests, calibration).
    pub fn from_selectors(registered: Selector, fifo: Selector, nranks: u32) -> Policy {
        Policy {
            registered,
            fifo,
            nranks,
            links: None,
        }
    }

    /// Keeps FIFO plans whose connections would not fit `links` out of
    /// the choice (`None`: no limit).
    pub fn with_link_memory(mut self, links: Option<LinkMemory>) -> Policy {
        self.links = links;
        self
    }

    /// `sel`'s best plan among `cands` whose FIFO connections fit
    /// (`fifo(c)`: whether choice `c` runs on FIFO connections): a pick
    /// that does not fit is dropped and the choice made again.
    fn choose_fitting(
        &self,
        sel: &Selector,
        kind: CollKind,
        bytes: usize,
        cands: &[(Algo, Proto)],
        fifo: impl Fn(&Choice) -> bool,
    ) -> Option<Choice> {
        let mut cands = cands.to_vec();
        loop {
            let c = sel.choose_among(kind, bytes, self.nranks, &cands)?;
            let fits = self
                .links
                .is_none_or(|l| !fifo(&c) || l.fits(c.algo, c.proto, c.channels, self.nranks));
            if fits {
                return Some(c);
            }
            cands.retain(|&x| x != (c.algo, c.proto));
        }
    }

    /// One rank order per channel, as the topology search found them.
    pub fn rings(&self) -> Vec<Vec<u32>> {
        self.registered.rings()
    }

    /// The selector that times a plan of `transport` for a call on
    /// `registered` buffers or not: the registered one, except for FIFO
    /// plans of direct algorithms and calls on plain buffers.
    pub fn selector(&self, registered: bool, algo: Algo, transport: Transport) -> &Selector {
        let fifo_variant = is_direct(algo) && transport == Transport::Fifo;
        if registered && !fifo_variant {
            &self.registered
        } else {
            &self.fifo
        }
    }

    /// Times the copy-engine algorithm on registered buffers with `model`
    /// (a backend that runs its plans on copy engines), or not (`None`:
    /// the selector never picks it; forcing it still works).
    pub fn with_copy_engines(mut self, model: Option<CopyEngineModel>) -> Policy {
        let c = Constants {
            copy_engine: model,
            ..self.registered.constants().clone()
        };
        self.registered = self.registered.with_constants(c);
        self
    }

    /// Times the one-step LL AllReduce with `model` (a backend that has
    /// the path, for calls up to its `max_bytes`), on registered buffers
    /// and plain ones alike (it copies into its own slots), or not
    /// (`None`: the selector never picks it; forcing it still works).
    pub fn with_oneshot_ll(mut self, model: Option<OneShotLlModel>) -> Policy {
        for sel in [&mut self.registered, &mut self.fifo] {
            let c = Constants {
                oneshot_ll: model,
                ..sel.constants().clone()
            };
            *sel = sel.clone().with_constants(c);
        }
        self
    }

    /// Replaces a selector (tests: constants a calibration would give).
    pub fn with_registered(mut self, s: Selector) -> Policy {
        self.registered = s;
        self
    }

    /// The model's best plan for the call among `algos` × `protos`, with
    /// its transport: on registered buffers the registered selector's best
    /// (direct plans, FIFO algorithms) meets the FIFO selector's best FIFO
    /// variant of a direct algorithm under a FIFO protocol
    /// ([`fifo_variants`]), a tie keeping the direct plan; else, where the
    /// model times no candidate, the FIFO ring's fallback
    /// ([`Selector::choose`]).
    pub fn best(
        &self,
        kind: CollKind,
        bytes: usize,
        registered: bool,
        algos: &[Algo],
        protos: &[Proto],
    ) -> Choice {
        let n = self.nranks;
        let own_fifo = |c: &Choice| !(registered && is_direct(c.algo));
        let own = self
            .choose_fitting(
                self.selector(registered, Algo::Ring, Transport::Direct),
                kind,
                bytes,
                &candidates(algos, protos, registered),
                own_fifo,
            )
            .map(|c| Choice {
                transport: if registered && is_direct(c.algo) {
                    Transport::Direct
                } else {
                    Transport::Fifo
                },
                ..c
            });
        let fifo = if registered {
            self.choose_fitting(
                &self.fifo,
                kind,
                bytes,
                &fifo_variants(algos, protos),
                |_| true,
            )
        } else {
            None
        };
        match (own, fifo) {
            (Some(a), Some(b)) if b.us() < a.us() => b,
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => self
                .selector(registered, Algo::Ring, Transport::Fifo)
                .choose(kind, bytes, n, algos, protos),
        }
    }

    /// The model's time, µs, for `plan` (its algorithm, protocol, channels
    /// and transport) running a call of `kind` on `bytes` of `registered`
    /// buffers or not (`None` where the model times none).
    pub fn predict(
        &self,
        kind: CollKind,
        bytes: usize,
        registered: bool,
        plan: &Choice,
    ) -> Option<f64> {
        let (algo, proto, channels) = (plan.algo, plan.proto, plan.channels);
        self.selector(registered, algo, plan.transport).predict(
            kind,
            algo,
            proto,
            channels,
            bytes,
            self.nranks,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_gets_its_share_of_the_sms_from_1_to_32() {
        assert_eq!(gpu_channel_cap(132, 8), 16);
        assert_eq!(gpu_channel_cap(132, 1), 32);
        assert_eq!(gpu_channel_cap(132, 128), 1);
        assert_eq!(gpu_channel_cap(132, 256), 1);
        assert_eq!(gpu_channel_cap(132, 0), 32);
    }

    /// 128 ranks on one 80 GB GPU: every small call's pick on registered
    /// and on plain buffers keeps its FIFO connections within a quarter of
    /// the memory, and for AllGather that changes the pick (its FIFO
    /// all-pairs variant would need 128 × 127 LL connections, as the one
    /// that failed to allocate on the H100).
    #[test]
    fn many_ranks_on_one_gpu_pick_plans_whose_connections_fit() {
        const N: u32 = 128;
        let topo = Topology::preset("single-gpu", 1).unwrap();
        let plain = Policy::gpu(&topo, &[0; N as usize], gpu_channel_cap(132, N));
        let links = LinkMemory {
            per_link: [(2 << 20) + 4096, (4 << 20) + 4096, (2 << 20) + 4096],
            ranks_per_device: N,
            budget: (80 << 30) / LinkMemory::SHARE,
        };
        let limited = plain.clone().with_link_memory(Some(links));
        let algos = Algo::ALL;
        let protos = [Proto::Simple, Proto::LL];
        let mut changed = 0;
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
        ] {
            for bytes in [8usize, 1024, 128 << 10, 1 << 20] {
                for registered in [true, false] {
                    let c = limited.best(kind, bytes, registered, &algos, &protos);
                    let fifo = c.transport == Transport::Fifo;
                    assert!(
                        !fifo || links.fits(c.algo, c.proto, c.channels, N),
                        "{kind:?} {bytes} B registered={registered}: {c:?} needs {} B",
                        links.need(c.algo, c.proto, c.channels, N)
                    );
                    let p = plain.best(kind, bytes, registered, &algos, &protos);
                    changed += usize::from(p != c);
                }
            }
        }
        assert!(
            changed > 0,
            "no unlimited pick was over the budget: the test shows nothing"
        );
        let ag = plain.best(CollKind::AllGather, 8, true, &algos, &protos);
        assert!(!links.fits(ag.algo, ag.proto, ag.channels, N), "{ag:?}");
    }

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
    fn other_placements_keep_the_uncalibrated_model() {
        // Eight H100s, one rank each: no built-in calibration applies.
        let topo = Topology::preset("hgx-h100", 1).unwrap();
        let gpus: Vec<usize> = (0..8).collect();
        let sel = Selector::new(&topo, &gpus).with_max_channels(16);
        let (reg, fifo) = gpu_selectors(&topo, &gpus, 16, Launcher::OneProcess);
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
    fn rings_cross_each_host_boundary_once_per_channel() {
        // 8 ranks on 3 hosts, interleaved in rank order.
        let host_of = [0, 1, 2, 0, 1, 2, 0, 1];
        let p = NetPlacement {
            host_of: host_of.to_vec(),
            bw: 3.0,
            hop_us: Some(30.0),
            device: None,
        };
        let pol = Policy::network(&p, 4);
        let rings = pol.rings();
        assert_eq!(rings.len(), 4);
        for ring in &rings {
            let mut sorted = ring.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<u32>>(), "{ring:?}");
            let crossings = (0..8)
                .filter(|&i| host_of[ring[i] as usize] != host_of[ring[(i + 1) % 8] as usize])
                .count();
            assert_eq!(crossings, 3, "{ring:?}");
        }
        assert_eq!(pol.hosts(), host_of.to_vec());
        // One host: no host list; the network's speed and latency count.
        let one = Policy::network(
            &NetPlacement {
                host_of: vec![0; 4],
                bw: 3.0,
                hop_us: None,
                device: None,
            },
            4,
        );
        assert!(one.hosts().is_empty());
        let at = |bw: f64, hop: f64, bytes: usize| two_hosts(bw, hop, 4, bytes).us();
        // 64 MiB on 2 hosts: bandwidth-bound at the network's 1 GB/s
        // (busbw = algbw on 2 ranks), and faster on a faster network.
        let t = at(1.0, 10.0, 64 << 20);
        assert!((t / 67_108.864 - 1.0).abs() < 0.05, "{t}");
        assert!(at(2.0, 10.0, 64 << 20) < t * 0.6);
        // 8 B: latency-bound, by the hop's latency.
        assert!(at(1.0, 100.0, 8) > at(1.0, 10.0, 8) + 100.0);
    }

    #[test]
    fn the_network_device_prices_what_the_placement_leaves_unknown() {
        let dev = NetDevice {
            name: "ofi0".into(),
            pci_path: None,
            speed_mbps: 8_000,
            latency_us: 500.0,
        };
        let place = |bw: f64, hop: Option<f64>, device: Option<NetDevice>| NetPlacement {
            host_of: vec![0, 1],
            bw,
            hop_us: hop,
            device,
        };
        // Nothing known: the model's constants.
        let bare = place(0.0, None, None);
        assert_eq!(bare.bandwidth(), crate::consts::NET_DEFAULT_BW);
        assert_eq!(bare.hop_latency_us(), None);
        // The device's 8 Gb/s (1 GB/s) and 500 µs stand in, and reach the
        // model's per-channel caps and network hop.
        let with = place(0.0, None, Some(dev.clone()));
        assert_eq!(with.bandwidth(), 1.0);
        assert_eq!(with.hop_latency_us(), Some(500.0));
        let c = net_constants(&with);
        assert_eq!(c.chan_cap, [1.0 / NET_CHANNELS_TO_FILL; 3]);
        assert_eq!(c.hop_lat[1][2], [500.0; 3]);
        assert_ne!(net_constants(&bare).hop_lat[1][2], [500.0; 3]);
        // The ranks' agreed figure wins for bandwidth; the latency is the
        // larger of the measured hop and the device's promise.
        let agreed = place(2.0, Some(30.0), Some(dev.clone()));
        assert_eq!(agreed.bandwidth(), 2.0);
        assert_eq!(agreed.hop_latency_us(), Some(500.0));
        assert_eq!(
            place(2.0, Some(900.0), Some(dev)).hop_latency_us(),
            Some(900.0)
        );
        // A latency-bound call gets dearer with the device's latency.
        let small = |p: &NetPlacement| {
            Policy::network(p, 4)
                .best(CollKind::AllReduce, 8, false, &Algo::ALL, &[Proto::Simple])
                .us()
        };
        assert!(small(&with) > small(&bare) + 400.0);
        // The device enters a topology as a NIC under a CPU.
        let (t, nic) = with.nic(&Topology::empty()).unwrap();
        assert_eq!(t.nics(), vec![nic]);
        assert_eq!(bare.nic(&Topology::empty()), None);
    }

    /// The best AllReduce of `bytes` on 2 ranks over a network of `bw`
    /// GB/s and `hop` µs, at most `max` channels.
    fn two_hosts(bw: f64, hop: f64, max: u32, bytes: usize) -> Choice {
        let placement = NetPlacement {
            host_of: vec![0, 1],
            bw,
            hop_us: Some(hop),
            device: None,
        };
        let all = Algo::ALL;
        Policy::network(&placement, max).best(
            CollKind::AllReduce,
            bytes,
            false,
            &all,
            &[Proto::Simple],
        )
    }

    #[test]
    fn network_rings_take_channels_only_when_bandwidth_bound() {
        // 2 ranks forced onto loopback (a host each), as measured on the
        // 2-core VM: one channel per small call, every channel up to
        // NET_CHANNELS_TO_FILL for 64 MiB.
        for max in [2, 4, 8] {
            for small in [8, 64 << 10, 1 << 20] {
                let c = two_hosts(3.5, 50.0, max, small);
                assert_eq!(c.channels, 1, "{c}");
            }
            let big = two_hosts(3.5, 50.0, max, 64 << 20);
            assert_eq!(big.algo, Algo::Ring, "{big}");
            assert_eq!(big.channels, max.min(NET_CHANNELS_TO_FILL as u32), "{big}");
        }
    }

    /// The 2026-12-04 17:10 H200 run, call 10 on the H200 host (16 cores), 2 host processes over
    /// `lo`, 64 MiB AllReduce: each run's hop as measured at setup (µs) and
    /// the network bandwidth its ranks agreed (GB/s), recovered from the
    /// time the selector predicted for its one channel (13312.2 to 21588.6
    /// µs, 8.4 µs + 2 hops + 64 MiB at that bandwidth).
    const H200_LOOPBACK: [(f64, f64); 6] = [
        (28.2, 3.903),
        (26.7, 4.694),
        (58.6, 5.089),
        (28.8, 4.513),
        (26.3, 3.117),
        (32.1, 4.206),
    ];

    #[test]
    fn the_h200_hosts_loopback_figures_take_every_channel_for_64_mib() {
        // The 2026-12-04 17:10 H200 run's binary (4ac6bf0's model) connected 2 channels and chose
        // 1 in every run; each of its figures must give a bandwidth-bound
        // ring every channel connected (up to NET_CHANNELS_TO_FILL). Four
        // channels reach what that binary predicted for its one (64 MiB at
        // the agreed bandwidth); one channel moves a quarter of it.
        for (hop, bw) in H200_LOOPBACK {
            for max in [2, 4] {
                let c = two_hosts(bw, hop, max, 64 << 20);
                assert_eq!(
                    (c.algo, c.channels),
                    (Algo::Ring, max),
                    "{c} at {bw} GB/s, {hop} us"
                );
            }
            let ring = |ch| {
                Policy::network(
                    &NetPlacement {
                        host_of: vec![0, 1],
                        bw,
                        hop_us: Some(hop),
                        device: None,
                    },
                    4,
                )
                .predict(
                    CollKind::AllReduce,
                    64 << 20,
                    false,
                    &Choice {
                        algo: Algo::Ring,
                        proto: Proto::Simple,
                        channels: ch,
                        transport: Transport::Fifo,
                        predicted_us: None,
                        forced: false,
                    },
                )
                .expect("the ring is timed")
            };
            let bound = 8.4 + 2.0 * hop + 67_108.864 / bw;
            assert!((ring(4) / bound - 1.0).abs() < 0.01, "{}", ring(4));
            assert!(ring(1) > 3.0 * bound, "{}", ring(1));
        }
    }

    #[test]
    fn fast_links_take_every_channel_for_bandwidth_bound_rings() {
        // A many-core host's link may measure or state far more than the
        // 2-core VM's loopback (a 100 to 800 Gb/s NIC: 12.5 to 100 GB/s).
        // However fast, a 64 MiB ring takes NET_CHANNELS_TO_FILL channels
        // (a channel waits on its own messages whatever the link's speed),
        // and calls of at most a channel's minimum keep one.
        for bw in [0.5, 1.0, 3.9, 8.0, 12.5, 25.0, 50.0, 100.0] {
            for hop in [5.0, 28.0, 200.0] {
                let big = two_hosts(bw, hop, 4, 64 << 20);
                assert_eq!(
                    (big.algo, big.channels),
                    (Algo::Ring, 4),
                    "{big} at {bw} GB/s, {hop} us"
                );
                for small in [8, 64 << 10, 1 << 20] {
                    let c = two_hosts(bw, hop, 4, small);
                    assert_eq!(c.channels, 1, "{c} at {bw} GB/s, {hop} us, {small} B");
                }
            }
        }
    }

    #[test]
    fn slow_network_hops_pick_a_tree_for_small_allreduce() {
        // 8 ranks forced onto the network (a host each), one hop 146 µs as
        // measured on the H200 host: a ring's 14 hops lose to the double
        // binary tree's 2 × log2(8) = 6 at 8 B; bandwidth wins back for the
        // ring at 64 MiB.
        let p = Policy::network(
            &NetPlacement {
                host_of: (0..8).collect(),
                bw: 1.4,
                hop_us: Some(146.0),
                device: None,
            },
            2,
        );
        let best = |bytes, algos: &[Algo]| {
            p.best(CollKind::AllReduce, bytes, false, algos, &[Proto::Simple])
        };
        let small = best(8, &Algo::ALL);
        assert!(
            matches!(small.algo, Algo::DoubleBinaryTree | Algo::BinaryTree),
            "{small}"
        );
        let ring = best(8, &[Algo::Ring]).us();
        assert!(ring > 14.0 * 146.0, "{ring}");
        assert!(small.us() < 7.0 * 146.0, "{small}");
        assert_eq!(best(64 << 20, &Algo::ALL).algo, Algo::Ring);
    }

    #[test]
    fn host_registered_calls_keep_direct_plans() {
        // The host backend runs Simple only: no FIFO protocol, so no FIFO
        // variant competes on registered buffers.
        let p = Policy::host(4, 32);
        for bytes in [8, 4 << 10, 1 << 20, 256 << 20] {
            let c = p.best(
                CollKind::AllReduce,
                bytes,
                true,
                &Algo::ALL,
                &[Proto::Simple],
            );
            assert_eq!(c.proto, Proto::Simple, "{bytes} B: {c}");
            assert_eq!(c.is_direct(), is_direct(c.algo), "{bytes} B: {c}");
            let f = p.best(
                CollKind::AllReduce,
                bytes,
                false,
                &Algo::ALL,
                &[Proto::Simple],
            );
            assert!(!f.is_direct(), "{bytes} B: {f}");
        }
    }

    #[test]
    fn choice_line_carries_prediction_and_override() {
        let mut c = Choice {
            algo: Algo::Ring,
            proto: Proto::Simple,
            channels: 2,
            transport: Transport::Fifo,
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
            transport: Transport::Fifo,
            predicted_us: Some(14.02),
            forced: false,
        };
        assert_eq!(
            c.to_string(),
            "algo oneshot proto ll (fifo) channels 1 predicted 14.0 us"
        );
        c.transport = Transport::Direct;
        c.proto = Proto::Simple;
        assert_eq!(
            c.to_string(),
            "algo oneshot proto simple channels 1 predicted 14.0 us"
        );
    }

    /// The copy-engine algorithm is timed only with a model: without one
    /// (the default, and every backend that does not run it on copy
    /// engines) no call picks it. The guessed model (one engine per rank
    /// at 200 GB/s) loses to the kernels at 2 and 8 ranks on one GPU and
    /// across eight NVLink GPUs, so nothing changes until a calibration
    /// says otherwise. With engines as fast as a calibration could find
    /// them (2 TB/s), two ranks sharing a GPU get large AllGather and
    /// Broadcast on the engines, on one channel (each channel is one more
    /// copy per peer); small calls, unregistered buffers, eight ranks
    /// sharing the engines and NVLink (the port caps both) do not.
    #[test]
    fn copy_engines_are_picked_only_where_modelled_to_win() {
        let algos = Algo::ALL;
        let protos = [Proto::Simple, Proto::LL];
        let gpus: Vec<usize> = (0..8).collect();
        let nvlink = Policy::gpu(&Topology::preset("hgx-h100", 1).unwrap(), &gpus, 32);
        let one = Topology::preset("single-gpu", 1).unwrap();
        let eight = Policy::gpu(&one, &[0; 8], 16);
        let two = Policy::gpu(&one, &[0; 2], 32);
        let kinds = [CollKind::AllGather, CollKind::Broadcast];
        let never = |p: &Policy, what: &str| {
            for kind in kinds {
                for bytes in [8usize, 1 << 20, 256 << 20] {
                    for registered in [true, false] {
                        let c = p.best(kind, bytes, registered, &algos, &protos);
                        assert_ne!(c.algo, Algo::CopyEngine, "{what}: {kind:?} {bytes}");
                    }
                }
            }
        };
        let guess = Some(CopyEngineModel::GUESS);
        for p in [&nvlink, &eight, &two] {
            never(p, "no model");
            never(&p.clone().with_copy_engines(guess), "guess");
        }
        let fast = Some(CopyEngineModel {
            engine_bw: 2000.0,
            ..CopyEngineModel::GUESS
        });
        never(&nvlink.with_copy_engines(fast), "NVLink, fast engines");
        never(&eight.with_copy_engines(fast), "eight ranks, fast engines");
        let two = two.with_copy_engines(fast);
        for kind in kinds {
            let big = two.best(kind, 256 << 20, true, &algos, &protos);
            assert_eq!(big.algo, Algo::CopyEngine, "{kind:?}: {big:?}");
            assert!(big.sm_free());
            assert_eq!(big.channels, 1, "{big:?}");
            let plain = two.best(kind, 256 << 20, false, &algos, &protos);
            assert_ne!(plain.algo, Algo::CopyEngine, "unregistered: {plain:?}");
            let small = two.best(kind, 8, true, &algos, &protos);
            assert_ne!(small.algo, Algo::CopyEngine, "{kind:?} 8 B: {small:?}");
        }
    }

    /// The one-step LL AllReduce is timed only with a model, under LL,
    /// up to the backend's payload limit: 8 ranks sharing one GPU pick it
    /// for 8 B (registered buffers or not) and never past the limit, nor
    /// under Simple alone, nor without the model.
    #[test]
    fn oneshot_ll_is_picked_only_where_modelled_and_served() {
        let algos = Algo::ALL;
        let both = [Proto::Simple, Proto::LL];
        let one = Topology::preset("single-gpu", 1).unwrap();
        let plain = Policy::gpu(&one, &[0; 8], 16);
        let served = plain
            .clone()
            .with_oneshot_ll(Some(OneShotLlModel::serving(64 << 10)));
        for registered in [true, false] {
            for bytes in [8usize, 4096, 64 << 10, 1 << 20] {
                let c = plain.best(CollKind::AllReduce, bytes, registered, &algos, &both);
                assert_ne!(c.algo, Algo::OneShotLl, "no model, {bytes} B: {c:?}");
                let s = served.best(
                    CollKind::AllReduce,
                    bytes,
                    registered,
                    &algos,
                    &[Proto::Simple],
                );
                assert_ne!(s.algo, Algo::OneShotLl, "simple only, {bytes} B: {s:?}");
            }
            let past = served.best(
                CollKind::AllReduce,
                (64 << 10) + 8,
                registered,
                &algos,
                &both,
            );
            assert_ne!(past.algo, Algo::OneShotLl, "past the limit: {past:?}");
            let small = served.best(CollKind::AllReduce, 8, registered, &algos, &both);
            assert_eq!(
                (small.algo, small.proto, small.transport),
                (Algo::OneShotLl, Proto::LL, Transport::Fifo),
                "8 B, registered={registered}: {small:?} (without it {:?})",
                plain.best(CollKind::AllReduce, 8, registered, &algos, &both)
            );
            // Other collectives never.
            let ag = served.best(CollKind::AllGather, 8, registered, &algos, &both);
            assert_ne!(ag.algo, Algo::OneShotLl, "{ag:?}");
        }
    }

    /// One rank's call is a local copy, priced at what its channels move:
    /// a large one spreads over every channel (one block alone copied 256
    /// MiB in 7.1 ms on an H100), a small one keeps one.
    #[test]
    fn one_rank_copies_on_every_channel_only_when_large() {
        let algos = Algo::ALL;
        let protos = [Proto::Simple, Proto::LL];
        let one = Topology::preset("single-gpu", 1).unwrap();
        let p = Policy::gpu(&one, &[0], gpu_channel_cap(132, 1));
        for registered in [false, true] {
            let big = p.best(CollKind::AllReduce, 256 << 20, registered, &algos, &protos);
            assert_eq!(big.channels, 32, "{big:?}");
            let small = p.best(CollKind::AllReduce, 8, registered, &algos, &protos);
            assert_eq!(small.channels, 1, "{small:?}");
        }
    }

    /// Ranks sharing a GPU as processes pay each sequential hop that the
    /// shared-GPU calibration (threads) hid: 8 B AllReduce on plain buffers
    /// moves from the chain (14 hops) to the one-shot (1) for 8 rank
    /// processes, as the H100 measured (20.37 against 29.63 µs), while 8
    /// threads and 2 processes (where both ran alike) keep the chain.
    /// Where no calibration applies (one rank per GPU) the processes'
    /// model is the plain one: its NCCL latencies already count each hop.
    #[test]
    fn rank_processes_sharing_a_gpu_pay_every_hop() {
        let algos = Algo::ALL;
        let protos = [Proto::Simple, Proto::LL];
        let one = Topology::preset("single-gpu", 1).unwrap();
        let pick = |n: usize, l: Launcher| {
            let p = Policy::gpu_launched(&one, &vec![0; n], gpu_channel_cap(132, n as u32), l);
            p.best(CollKind::AllReduce, 8, false, &algos, &protos)
        };
        assert_eq!(pick(8, Launcher::OneProcess).algo, Algo::Chain);
        let procs = pick(8, Launcher::ProcessPerRank);
        assert_eq!((procs.algo, procs.proto), (Algo::OneShot, Proto::LL));
        assert_eq!(pick(2, Launcher::ProcessPerRank).algo, Algo::Chain);
        // Registered buffers (the caller's memory shared across processes,
        // as nccl-tests' and PyTorch's calls run): the registered two-shot,
        // whose barriers wait on every peer, ran 28.35 µs at 8 B and 56.29
        // at 512 B against the FIFO one-shot's 20.37 and 19.62.
        for bytes in [8, 512] {
            let p = Policy::gpu_launched(&one, &[0; 8], 16, Launcher::ProcessPerRank);
            let c = p.best(CollKind::AllReduce, bytes, true, &algos, &protos);
            assert_eq!(
                (c.algo, c.proto, c.transport),
                (Algo::OneShot, Proto::LL, Transport::Fifo),
                "{bytes} B"
            );
        }

        let threads = pick(8, Launcher::OneProcess).predicted_us.unwrap();
        let chain8 = |l: Launcher| {
            let p = Policy::gpu_launched(&one, &[0; 8], 16, l);
            p.selector(false, Algo::Chain, Transport::Fifo)
                .predict(CollKind::AllReduce, Algo::Chain, Proto::LL, 1, 8, 8)
                .unwrap()
        };
        let exposed = chain8(Launcher::ProcessPerRank) - chain8(Launcher::OneProcess);
        assert!(
            (exposed - 14.0 * PROCESS_HOP_US).abs() < 1e-9,
            "{exposed} over {threads}"
        );

        let gpus: Vec<usize> = (0..8).collect();
        let nvlink = Topology::preset("hgx-h100", 1).unwrap();
        let across = |l: Launcher| {
            Policy::gpu_launched(&nvlink, &gpus, 32, l).best(
                CollKind::AllReduce,
                8,
                false,
                &algos,
                &protos,
            )
        };
        assert_eq!(
            across(Launcher::ProcessPerRank).predicted_us,
            across(Launcher::OneProcess).predicted_us
        );
    }
}
