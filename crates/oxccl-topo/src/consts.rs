//! Every number the model uses, in one place, with where it came from.
//!
//! Bandwidths are GB/s (10^9 bytes/s) in one direction; latencies are µs.
//! "NCCL" below means NCCL 2.30's published tuning constants (its
//! `src/graph/tuning.cc` and topology code, read as facts); "spec" means the
//! vendor's data sheet; "assumed" marks our own estimates, which
//! [`crate::calibrate`] replaces with fitted values once a sweep exists.
//!
//! | quantity | value | source |
//! | --- | --- | --- |
//! | NVLink 2 (V100) per link | 20 | NCCL's sm70 value (spec: 25 raw) |
//! | NVLink 3 (A100) per link | 20 | NCCL's sm80 value (spec: 25 raw) |
//! | NVLink 3 bridge (GA102) per link | 14 | spec: 4 links = 112.5 GB/s both ways |
//! | NVLink 4 (H100/H200) per link | 20.6 | NCCL's sm90 value (18 links ≈ 371) |
//! | NVLink 5 (B200) per link | 40 | assumed: spec 50 raw × NCCL's ~0.8 efficiency |
//! | PCIe Gen3 x16 | 12 | NCCL; other generations scale ×2 per generation and by width |
//! | PCIe, speed not given | Gen4 x16 = 24 | assumed (hint files leave it empty) |
//! | inter-socket, Intel | 10 | assumed; NCCL uses a per-CPU constant of this order |
//! | inter-socket, AMD | 16 | assumed, as above |
//! | network, speed not given | 12 | NCCL's NET default |
//! | GPU memory copy (ranks on one GPU) | per GPU below | H200: measured 4.21 TB/s read+write (docs/gpu-machine facts); others spec HBM ÷ 2 |
//! | base latency Ring LL/LL128/Simple | 6.6 / 14 / 8.4 | NCCL |
//! | base latency Tree LL/LL128/Simple | 6.8 / 14 / 8.4 | NCCL |
//! | hop NVLink Tree, Ring | LL 0.6/0.6, LL128 1.25/1.9, Simple 4.0/3.4 | NCCL |
//! | hop PCIe Tree, Ring | LL 1.0/1.0, LL128 1.9/2.5, Simple 4.0/5.7 | NCCL |
//! | hop network Tree, Ring | LL 5/2.7, LL128 8.5/4.0, Simple 14/14 | NCCL |
//! | hop between ranks of one GPU | NVLink values | assumed: device memory is at least as close |
//! | LL / LL128 bandwidth factor | 0.5 / 0.92 | NCCL (LL: 8 data bytes per 16) |
//! | tree bandwidth factor | 0.92 | NCCL |
//! | per-channel bandwidth cap | 24 (Simple, LL128), 8 (LL) | assumed: ~16 channels reach H100's 371 GB/s in practice |
//! | all-pairs (one/two-shot) base latency | 4.0 (LL), 6.0 (Simple) | assumed: one launch (~4.6 µs measured floor on H200) plus flags |
//! | all-pairs per-peer signal | 0.2 | assumed |
//! | all-pairs bandwidth efficiency | 0.85 | assumed: many concurrent peer streams reach less of the port than a ring (why one-shot/two-shot kernels are used only for small and medium sizes) |
//! | all-pairs (one/two-shot) minimum bytes per channel | 65536 | assumed: each channel is one more block per rank in every entry/exit barrier with all n − 1 peers, a cost the latency term does not grow with the channel count; 64 KiB is a few µs of copy for one block at its share of an H200 shared by 8 ranks (≈ 16 GB/s), well above a barrier's signals, so a channel is added only where it carries more copy than synchronisation (NCCL likewise drops channels below a bytes-per-thread threshold, 32 KiB per Simple channel) |
//! | copy engines (`ce`): per-engine rate, engines, per-copy issue, per-call and per-peer barrier cost | 200 GB/s, 4, 3 µs, 12 µs, 1 µs | assumed, uncalibrated ([`CopyEngineModel::GUESS`]); only where the backend runs `ce` on copy engines |
//! | hop that ranks as processes sharing one GPU pay beyond the shared-GPU calibration | 1.5 per sequential hop | measured (8 rank processes on an H100): [`PROCESS_HOP_US`] |
//! | ranks sharing one H200: per-collective corrections, avoided variants | fitted | `calib/h200-1gpu-8ranks.json` (device run 7, 2026-12-02, `cargo xtask sweep --backend cuda --ranks 8`, 256 MiB, 16 channels; loaded by [`crate::calibrate::builtin_for`]): registered two-shot AllReduce 1114.67 µs (96% of the HBM floor) vs ring 3101 µs; all-pairs ReduceScatter 594.51, Reduce 592.58, AllGather 679.35, Broadcast 677.72, AllToAll 1095.28 µs out of place; 8 B AllReduce (session 3 device run 1) direct one-shot 17.02 µs, FIFO one-shot LL 14.02, FIFO one-shot Simple 17.71 µs eager, launch floor 10.69 µs; nothing avoided |

use oxccl_core::{Algo, CollKind, Proto};

/// Default bandwidth of a network port whose speed is not given.
pub const NET_DEFAULT_BW: f64 = 12.0;

/// Latency, µs, that each hop a message takes one after another costs
/// ranks launched by processes of their own on a shared GPU, on top of the
/// shared-GPU calibration ([`Constants::exposed_hop_us`]).
///
/// That calibration timed threads of one process, whose launches one
/// driver context serializes: a chain's or tree's next rank is still
/// being launched while the message travels, so the hops hide behind the
/// launches and the fit prices them near zero. Processes launch at once
/// and wait on every hop. Measured on one H100, 8 rank processes under
/// MPS, nccl-tests 2.19.6 over `libnccl.so.2`, 8 B f32 AllReduce on plain
/// buffers, `NCCL_ALGO` forced (2026-12-07): chain 29.63 µs, binary tree
/// 24.58, one-shot 20.37 eager (23.38, 18.62, 14.67 replayed from a CUDA
/// graph); at 512 B one-shot 19.62, tree 23.36, chain 28.31. Against the
/// calibrated model's prices for the same plans (at 8 B chain 4.8 µs and
/// tree 4.6 µs below the one-shot, at 512 B the tree 6.0 µs below), with
/// 14 sequential hops for the chain, 6 for the tree and 1 for the
/// one-shot, each hop cost (29.63 − 20.37 + 4.8) / 13 = 1.08 µs by the
/// chain, (24.58 − 20.37 + 4.6) / 5 = 1.76 and (23.36 − 19.62 + 6.0) / 5 =
/// 1.95 by the tree. 1.5 puts the one-shot ahead of both up to 1 KiB, as
/// measured, and the tree next (4 and 32 KiB: within 5% of the one-shot).
/// With 2 processes the chain and the one-shot ran within noise of each
/// other (7.56 and 7.98 µs in a graph) and the model keeps the chain.
/// A registered direct plan's entry and exit barriers each count n − 1
/// such hops (its registered two-shot ran 28.35 µs at 8 B, 56.29 at 512 B
/// and 77.67 at 4 KiB on the caller's memory shared across the 8
/// processes): it stays the pick from 512 KiB, as for threads.
pub const PROCESS_HOP_US: f64 = 1.5;

/// Generation of an NVLink, which fixes its per-link bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NvLinkGen {
    /// NVLink 2 (V100).
    V2,
    /// NVLink 3 (A100).
    V3,
    /// NVLink 3 through a consumer/workstation bridge (GA102: RTX A6000, 3090).
    V3Bridge,
    /// NVLink 4 (H100, H200).
    V4,
    /// NVLink 5 (B200).
    V5,
}

/// Bandwidth of one NVLink of generation `gen`.
pub fn nvlink_bw(gen: NvLinkGen) -> f64 {
    use NvLinkGen::*;
    match gen {
        V2 => 20.0,
        V3 => 20.0,
        V3Bridge => 14.0,
        V4 => 20.6,
        V5 => 40.0,
    }
}

/// Bandwidth of a PCIe link; `gen == 0` (unknown) assumes Gen4, `width == 0`
/// assumes x16.
pub fn pcie_bw(gen: u8, width: u8) -> f64 {
    let gen = if gen == 0 { 4 } else { gen };
    let width = if width == 0 { 16 } else { width };
    let per_lane_gen3 = 12.0 / 16.0;
    per_lane_gen3 * 2f64.powi(i32::from(gen) - 3) * f64::from(width)
}

/// Bandwidth of the inter-socket link for a CPU `vendor` string.
pub fn smp_bw(vendor: &str) -> f64 {
    if vendor.contains("AMD") {
        16.0
    } else {
        10.0
    }
}

/// What we know of a GPU model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    pub device_id: u32,
    pub sm: u32,
    /// Device-to-device copy bandwidth, bytes moved (not read + written).
    pub copy_gbps: f64,
}

/// Known GPUs by PCI device id (spec sheets; H200 measured).
pub const GPUS: [GpuSpec; 9] = [
    GpuSpec {
        name: "V100-SXM2-16GB",
        device_id: 0x1db1,
        sm: 70,
        copy_gbps: 450.0,
    },
    GpuSpec {
        name: "V100-SXM2-32GB",
        device_id: 0x1db5,
        sm: 70,
        copy_gbps: 450.0,
    },
    GpuSpec {
        name: "A100-SXM4-40GB",
        device_id: 0x20b0,
        sm: 80,
        copy_gbps: 780.0,
    },
    GpuSpec {
        name: "A100-SXM4-80GB",
        device_id: 0x20b2,
        sm: 80,
        copy_gbps: 1000.0,
    },
    GpuSpec {
        name: "A100-PCIE-80GB",
        device_id: 0x20b5,
        sm: 80,
        copy_gbps: 950.0,
    },
    GpuSpec {
        name: "RTX-A6000",
        device_id: 0x2230,
        sm: 86,
        copy_gbps: 380.0,
    },
    GpuSpec {
        name: "H100-SXM5-80GB",
        device_id: 0x2330,
        sm: 90,
        copy_gbps: 1670.0,
    },
    GpuSpec {
        name: "H200",
        device_id: 0x2335,
        sm: 90,
        copy_gbps: 2105.0,
    },
    GpuSpec {
        name: "B200",
        device_id: 0x2901,
        sm: 100,
        copy_gbps: 4000.0,
    },
];

/// The spec of a PCI device id, if known.
pub fn gpu_by_device_id(id: u32) -> Option<GpuSpec> {
    GPUS.iter().copied().find(|g| g.device_id == id)
}

/// Share of the memory's peak bandwidth (bus width × clock × 2) a
/// device-to-device copy reaches, counting read and write: on the H200
/// (6144-bit bus, 3.2 GHz: 4915 GB/s peak) the copy moved 2015-2105 GB/s
/// of data, 4030-4210 GB/s of traffic (docs/perf/LOG.md).
pub const COPY_EFFICIENCY: f64 = 0.857;

/// Copy bandwidth for a GPU known only by compute capability.
pub fn copy_bw_for_sm(sm: u32) -> f64 {
    match sm {
        0 => 400.0,
        1..=79 => 450.0,
        80..=85 => 780.0,
        86..=89 => 380.0,
        90..=99 => 1670.0,
        _ => 4000.0,
    }
}

/// Kind of hop, for per-hop latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HopClass {
    NvLink,
    Pcie,
    Net,
}

/// Which latency family an algorithm uses.
fn family(algo: Algo) -> usize {
    match algo {
        Algo::Ring | Algo::Chain => 1,
        _ => 0,
    }
}

/// One-shot, two-shot and all-pairs: registered plans read and write
/// peers' buffers directly (their FIFO variants otherwise); the copy-engine
/// algorithm has only the registered plan.
pub fn is_direct(algo: Algo) -> bool {
    matches!(
        algo,
        Algo::OneShot | Algo::TwoShot | Algo::AllPairs | Algo::CopyEngine
    )
}

fn proto_index(p: Proto) -> usize {
    match p {
        Proto::LL => 0,
        Proto::LL128 => 1,
        Proto::Simple => 2,
    }
}

/// The model's constants; [`Constants::default`] is the table above and
/// [`crate::calibrate`] adjusts a copy.
#[derive(Clone, Debug, PartialEq)]
pub struct Constants {
    /// `[tree family, ring family][LL, LL128, Simple]`.
    pub base_lat: [[f64; 3]; 2],
    /// `[tree, ring][NvLink, Pcie, Net][LL, LL128, Simple]`.
    pub hop_lat: [[[f64; 3]; 3]; 2],
    /// `[LL, LL128, Simple]`.
    pub proto_bw: [f64; 3],
    pub tree_bw: f64,
    /// Per channel, `[LL, LL128, Simple]`.
    pub chan_cap: [f64; 3],
    /// All-pairs base latency `[LL, LL128, Simple]`.
    pub direct_base_lat: [f64; 3],
    pub direct_peer_lat: f64,
    /// Share of the port bandwidth the all-pairs algorithms reach.
    pub direct_bw: f64,
    /// Fewest bytes (nccl-tests size) per channel the all-pairs
    /// algorithms are given: the selector adds a channel only while each
    /// carries at least this many (see the table above for why).
    pub direct_chan_min_bytes: f64,
    /// The same for every other algorithm (0: no minimum). Over the
    /// network a channel that carries less than a round of full slots
    /// adds messages, not overlap.
    pub fifo_chan_min_bytes: f64,
    /// The direct algorithms (one-shot, two-shot, all-pairs) run registered
    /// plans: peers' buffers are read and written in place, with no FIFO
    /// connection, so no protocol's FIFO handshake applies. They are then
    /// timed, under any protocol, with the lowest latencies the model
    /// has (the LL base and hop: one launch plus flag signals) and that
    /// protocol's bandwidth. On the H200, 8 B AllReduce on 8 ranks ran
    /// 15.6 µs eager / 7.8 µs in a graph as a registered one-shot against
    /// 14.8 / 8.5 µs for the FIFO one-shot under LL: the same latency,
    /// not Simple's. Off by default (the generic model times FIFO
    /// variants); callers set it for calls on registered buffers.
    pub direct_fifo_free: bool,
    /// Fitted corrections per (algorithm, protocol): latency added and
    /// bandwidth multiplied. Empty until calibrated.
    pub fitted: Vec<(Algo, Proto, f64, f64)>,
    /// Fitted corrections for one collective, which win over `fitted`:
    /// an algorithm's efficiency differs by collective (registered
    /// all-pairs on one H200, run 7: ReduceScatter at 101% of its HBM
    /// floor, AllGather at 88%, AllToAll at 97%).
    pub fitted_coll: Vec<(CollKind, Algo, Proto, f64, f64)>,
    /// (collective, algorithm) pairs the model must not time, so the
    /// selector never picks them (an override still can): variants known
    /// to hang or to be pathologically slow on the calibrated machine.
    pub avoid: Vec<(CollKind, Algo)>,
    /// How the copy-engine algorithm runs, where a backend runs its plans
    /// on the copy engines with no kernel; `None` (the default): it is not
    /// timed, so the selector never picks it (forcing it still can).
    pub copy_engine: Option<CopyEngineModel>,
    /// How the one-step LL AllReduce runs, where a backend has that path;
    /// `None` (the default): it is not timed, so the selector never picks
    /// it (forcing `ll1` still can).
    pub oneshot_ll: Option<OneShotLlModel>,
    /// Latency added per hop a message takes one after another (µs; 0 by
    /// default): [`PROCESS_HOP_US`] where ranks sharing a GPU are
    /// processes, whose hops the shared-GPU calibration did not see.
    pub exposed_hop_us: f64,
}

/// The cost of the copy-engine algorithm (`ce`): each rank issues one
/// `cuMemcpyAsync` per peer block, between three barriers of stream
/// memory operations. **Every value is a guess, to be calibrated** with
/// the sweep (`cargo xtask sweep --backend cuda --algo ce` against the
/// kernel algorithms): nothing here has been measured yet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyEngineModel {
    /// Bytes one copy engine moves per second, GB/s (each byte read once
    /// and written once). Guess: a fraction of an HBM3 GPU's copy rate.
    pub engine_bw: f64,
    /// Copy engines a GPU runs at once; ranks sharing a GPU share them.
    pub engines: u32,
    /// Host and device cost of one copy issued, µs (the driver call and
    /// the engine's start).
    pub issue_us: f64,
    /// Fixed cost of a call, µs: the address exchange between the ranks'
    /// threads and the first barrier.
    pub base_us: f64,
    /// Cost per peer of the three flag barriers, µs (a stream wait on
    /// one flag each, in turn).
    pub peer_us: f64,
}

impl CopyEngineModel {
    /// The uncalibrated guess: 4 engines of 200 GB/s, 3 µs per copy,
    /// 12 µs per call plus 1 µs per peer. A rank's copies run one after
    /// another on its stream, so a rank gets one engine at most; at this
    /// rate the kernels win everywhere (on one GPU they reach the HBM
    /// floor, across NVLink the port), so `ce` is picked only once a
    /// calibration finds the engines faster: conservative on purpose.
    pub const GUESS: CopyEngineModel = CopyEngineModel {
        engine_bw: 200.0,
        engines: 4,
        issue_us: 3.0,
        base_us: 12.0,
        peer_us: 1.0,
    };

    /// What one of `sharing` ranks on a GPU gets of its engines, GB/s:
    /// one engine each while there are enough, else an equal share.
    pub fn rank_bw(&self, sharing: u32) -> f64 {
        let r = sharing.max(1);
        self.engine_bw * f64::from(self.engines.min(r)) / f64::from(r)
    }
}

/// The cost of the one-step LL AllReduce (`ll1`): one launch, one
/// all-to-all exchange of LL lines (which is the barrier: each rank waits
/// for every peer's flags once), and the lines one block per rank writes
/// to every peer and reads back. **Only `barrier_us` was measured** (a
/// bare barrier kernel, about 1.5 µs per step on an H100 with 8 rank
/// threads); the rest are guesses, and `margin_us` is added so the path
/// is picked only where the model says it wins by that much. Calibrate
/// with the sweep (`--algo ll1` against the selector's pick).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneShotLlModel {
    /// A launch and the kernel's start, µs (unmeasured).
    pub launch_us: f64,
    /// One cross-rank exchange, µs (measured as a bare barrier's step).
    pub barrier_us: f64,
    /// GB/s of LL lines one block per rank stores and loads (unmeasured).
    pub line_gbps: f64,
    /// Added to every prediction, µs: the margin the path must win by
    /// while its constants are guesses.
    pub margin_us: f64,
    /// Largest payload per rank, bytes, the backend's path serves.
    pub max_bytes: usize,
}

impl OneShotLlModel {
    /// The guess for a GPU (see the type's docs); `max_bytes` is the
    /// backend's.
    pub const GUESS: OneShotLlModel = OneShotLlModel {
        launch_us: 5.0,
        barrier_us: 1.5,
        line_gbps: 100.0,
        margin_us: 2.0,
        max_bytes: 0,
    };

    /// The guess serving calls of at most `max_bytes` per rank.
    pub const fn serving(max_bytes: usize) -> OneShotLlModel {
        OneShotLlModel {
            max_bytes,
            ..Self::GUESS
        }
    }

    /// µs for an AllReduce of `bytes` per rank on `n` ranks, `None` past
    /// `max_bytes`. Each rank stores its payload as LL lines (twice the
    /// bytes) to n slots and loads n such slots back.
    pub fn time_us(&self, n: u32, bytes: f64) -> Option<f64> {
        if bytes > self.max_bytes as f64 {
            return None;
        }
        let lines = 2.0 * 2.0 * bytes * f64::from(n.max(1));
        Some(
            self.launch_us
                + self.barrier_us
                + self.margin_us
                + lines / (self.line_gbps.max(1e-9) * 1000.0),
        )
    }
}

impl Default for Constants {
    fn default() -> Self {
        Constants {
            base_lat: [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4]],
            hop_lat: [
                [[0.6, 1.25, 4.0], [1.0, 1.9, 4.0], [5.0, 8.5, 14.0]],
                [[0.6, 1.9, 3.4], [1.0, 2.5, 5.7], [2.7, 4.0, 14.0]],
            ],
            proto_bw: [0.5, 0.92, 1.0],
            tree_bw: 0.92,
            chan_cap: [8.0, 24.0, 24.0],
            direct_base_lat: [4.0, 5.0, 6.0],
            direct_peer_lat: 0.2,
            direct_bw: 0.85,
            direct_chan_min_bytes: 65536.0,
            fifo_chan_min_bytes: 0.0,
            direct_fifo_free: false,
            fitted: Vec::new(),
            fitted_coll: Vec::new(),
            avoid: Vec::new(),
            copy_engine: None,
            oneshot_ll: None,
            exposed_hop_us: 0.0,
        }
    }
}

impl Constants {
    /// Base latency of `algo` with `proto`.
    pub fn base(&self, algo: Algo, proto: Proto) -> f64 {
        let proto = self.latency_proto(algo, proto);
        match algo {
            Algo::OneShot | Algo::TwoShot | Algo::AllPairs => {
                self.direct_base_lat[proto_index(proto)]
            }
            _ => self.base_lat[family(algo)][proto_index(proto)],
        }
    }

    /// The protocol whose latencies time `algo` under `proto`: LL for a
    /// FIFO-free direct plan ([`Constants::direct_fifo_free`]), else
    /// `proto`.
    fn latency_proto(&self, algo: Algo, proto: Proto) -> Proto {
        if self.direct_fifo_free && is_direct(algo) {
            Proto::LL
        } else {
            proto
        }
    }

    /// Latency of one hop of `class` for `algo` with `proto`.
    pub fn hop(&self, algo: Algo, proto: Proto, class: HopClass) -> f64 {
        let proto = self.latency_proto(algo, proto);
        let c = match class {
            HopClass::NvLink => 0,
            HopClass::Pcie => 1,
            HopClass::Net => 2,
        };
        let fam = match algo {
            Algo::Ring | Algo::Chain | Algo::OneShot | Algo::TwoShot | Algo::AllPairs => 1,
            _ => 0,
        };
        self.hop_lat[fam][c][proto_index(proto)]
    }

    /// Fewest bytes per channel the selector gives `algo` (0: no floor,
    /// the FIFO algorithms, whose latency the model already counts per
    /// step).
    pub fn min_channel_bytes(&self, algo: Algo) -> f64 {
        if is_direct(algo) {
            self.direct_chan_min_bytes
        } else {
            self.fifo_chan_min_bytes
        }
    }

    /// Bandwidth factor of a protocol.
    pub fn proto_factor(&self, proto: Proto) -> f64 {
        self.proto_bw[proto_index(proto)]
    }

    /// Per-channel bandwidth cap of a protocol.
    pub fn channel_cap(&self, proto: Proto) -> f64 {
        self.chan_cap[proto_index(proto)]
    }

    /// The calibrated correction for (algo, proto): (latency add, bw mult).
    pub fn correction(&self, algo: Algo, proto: Proto) -> (f64, f64) {
        self.fitted
            .iter()
            .find(|f| f.0 == algo && f.1 == proto)
            .map_or((0.0, 1.0), |f| (f.2, f.3))
    }

    /// The calibrated correction for `kind` with (algo, proto): the
    /// collective's own if fitted, else the (algo, proto) one.
    pub fn correction_for(&self, kind: CollKind, algo: Algo, proto: Proto) -> (f64, f64) {
        self.fitted_coll
            .iter()
            .find(|f| f.0 == kind && f.1 == algo && f.2 == proto)
            .map_or_else(|| self.correction(algo, proto), |f| (f.3, f.4))
    }

    /// Whether the model must not time `algo` for `kind`.
    pub fn avoids(&self, kind: CollKind, algo: Algo) -> bool {
        self.avoid.contains(&(kind, algo))
    }

    /// These constants for calls on unregistered buffers, which run the
    /// FIFO variants of the direct algorithms (one-shot, two-shot,
    /// all-pairs): the corrections fitted on registered direct plans do
    /// not describe them, so they are dropped and each direct algorithm
    /// takes the ring's correction of the same protocol (a FIFO moves each
    /// byte as a ring step does); the avoid list names registered variants
    /// and is dropped too, as is [`Constants::direct_fifo_free`].
    pub fn for_fifo(&self) -> Constants {
        let mut out = Constants {
            fitted: self
                .fitted
                .iter()
                .copied()
                .filter(|f| !is_direct(f.0))
                .collect(),
            fitted_coll: self
                .fitted_coll
                .iter()
                .copied()
                .filter(|f| !is_direct(f.1))
                .collect(),
            avoid: Vec::new(),
            direct_fifo_free: false,
            ..self.clone()
        };
        out.ring_correction_for_unfitted(&[Algo::OneShot, Algo::TwoShot, Algo::AllPairs]);
        out
    }

    /// Gives each of `algos` without a fitted (algorithm, protocol)
    /// correction the ring's of that protocol, and the ring's
    /// per-collective ones where it has none for that collective: an
    /// algorithm no sweep measured is no better, against the model, than
    /// the ring that was (left uncorrected, it would win by the ring's
    /// measured shortfall).
    pub fn ring_correction_for_unfitted(&mut self, algos: &[Algo]) {
        let ring_coll: Vec<_> = self
            .fitted_coll
            .iter()
            .copied()
            .filter(|f| f.1 == Algo::Ring)
            .collect();
        for &a in algos {
            for &(k, _, p, lat, bw) in &ring_coll {
                if !self
                    .fitted_coll
                    .iter()
                    .any(|f| (f.0, f.1, f.2) == (k, a, p))
                {
                    self.fitted_coll.push((k, a, p, lat, bw));
                }
            }
            for p in Proto::ALL {
                let ring = self.fitted.iter().find(|f| f.0 == Algo::Ring && f.1 == p);
                let have = self.fitted.iter().any(|f| f.0 == a && f.1 == p);
                if let (Some(&(_, _, lat, bw)), false) = (ring, have) {
                    self.fitted.push((a, p, lat, bw));
                }
            }
        }
    }
}
