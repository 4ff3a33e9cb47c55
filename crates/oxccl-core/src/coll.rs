//! Collective operations, algorithms and protocols.

use std::fmt;
use std::str::FromStr;

use crate::error::CoreError;

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    /// Point-to-point Send/Recv (grouped).
    SendRecv,
}

impl CollKind {
    pub const ALL: [CollKind; 9] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::SendRecv,
    ];

    /// Whether the collective combines values with a reduction operator.
    pub const fn is_reduction(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        )
    }

    /// Whether the collective has a root rank.
    pub const fn has_root(self) -> bool {
        matches!(
            self,
            CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        )
    }

    /// nccl-tests' bus-bandwidth factor: busbw = algbw × factor.
    pub fn busbw_factor(self, nranks: u32) -> f64 {
        let n = f64::from(nranks.max(1));
        match self {
            CollKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => (n - 1.0) / n,
            CollKind::Broadcast | CollKind::Reduce | CollKind::SendRecv => 1.0,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "allreduce",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllGather => "allgather",
            CollKind::ReduceScatter => "reducescatter",
            CollKind::AllToAll => "alltoall",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::SendRecv => "sendrecv",
        }
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CollKind {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let k = s.to_ascii_lowercase().replace(['_', '-'], "");
        CollKind::ALL
            .into_iter()
            .find(|c| c.name() == k || (k == "bcast" && *c == CollKind::Broadcast))
            .ok_or(CoreError::Parse {
                what: "collective",
                value: s.to_string(),
                expected: "allreduce broadcast reduce allgather reducescatter alltoall gather scatter sendrecv",
            })
    }
}

/// One collective call: its kind, its count (in NCCL's sense for that
/// collective) and its root.
///
/// `count` is what the NCCL call takes: elements per rank for AllReduce,
/// Broadcast and Reduce; the *send* count for AllGather and Gather; the
/// *receive* count for ReduceScatter and Scatter; the count exchanged with
/// each peer for AllToAll; the message size for SendRecv.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Collective {
    pub kind: CollKind,
    pub count: usize,
    pub root: u32,
}

impl Collective {
    pub const fn new(kind: CollKind, count: usize, root: u32) -> Self {
        Collective { kind, count, root }
    }

    /// Elements in each rank's input buffer. Ranks that do not read their
    /// input (non-roots of Broadcast and Scatter) still declare it.
    pub fn input_len(&self, nranks: u32) -> usize {
        let n = nranks as usize;
        match self.kind {
            CollKind::ReduceScatter | CollKind::AllToAll | CollKind::Scatter => self.count * n,
            _ => self.count,
        }
    }

    /// Elements in each rank's output buffer.
    pub fn output_len(&self, nranks: u32) -> usize {
        let n = nranks as usize;
        match self.kind {
            CollKind::AllGather | CollKind::AllToAll | CollKind::Gather => self.count * n,
            _ => self.count,
        }
    }

    /// Where the input lies inside the output when the call is in place,
    /// in elements (NCCL's in-place conventions): AllGather's input is the
    /// rank's own block of the output; ReduceScatter's output is the rank's
    /// own block of the input, which we express the other way round as a
    /// negative offset. Returns `(input_offset_in_output, output_offset_in_input)`.
    pub fn in_place_offsets(&self, rank: u32) -> (usize, usize) {
        let r = rank as usize;
        match self.kind {
            CollKind::AllGather | CollKind::Gather => (r * self.count, 0),
            CollKind::ReduceScatter | CollKind::Scatter => (0, r * self.count),
            _ => (0, 0),
        }
    }

    /// The "size" nccl-tests reports: bytes of the larger of the two
    /// buffers per rank.
    pub fn bytes(&self, nranks: u32, elem_size: usize) -> usize {
        self.input_len(nranks).max(self.output_len(nranks)) * elem_size
    }

    /// Whether the rank's output buffer is written by this collective.
    pub fn writes_output(&self, rank: u32) -> bool {
        match self.kind {
            CollKind::Reduce | CollKind::Gather => rank == self.root,
            _ => true,
        }
    }
}

/// An algorithm: a plan generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    /// Ring: every collective.
    Ring,
    /// A chain (a degenerate tree): AllReduce, Reduce, Broadcast.
    Chain,
    /// One binary tree: AllReduce, Reduce, Broadcast.
    BinaryTree,
    /// Two complementary binary trees, each carrying half the data (AllReduce).
    DoubleBinaryTree,
    /// All-pairs AllReduce, one shot: every rank reduces every peer's input.
    OneShot,
    /// All-pairs AllReduce, two shots: direct ReduceScatter then AllGather.
    TwoShot,
    /// All-pairs direct exchange: AllGather, ReduceScatter, AllToAll,
    /// Gather, Scatter, Broadcast, Reduce (the root talks to every peer).
    AllPairs,
    /// Copy-engine variants of the data-movement collectives (Broadcast,
    /// AllGather, AllToAll, Gather, Scatter) on registered buffers: every
    /// transfer is one copy from one buffer to one other, so a backend may
    /// run each as a plain memory copy (the GPU's copy engines, no SMs).
    CopyEngine,
    /// One-step AllReduce for small messages through LL slots ("LL
    /// one-shot", the shape of NCCL's symmetric kernels): every rank
    /// stores its input, as LL words tagged with a per-call epoch, into a
    /// slot of every peer, then reduces the n slots in rank order. No
    /// barrier besides the data itself; no exit synchronisation (parity
    /// slots, see the backends). Its plan is the FIFO one-shot's, which a
    /// backend runs where it has no LL one-shot path for the call.
    OneShotLl,
}

impl Algo {
    pub const ALL: [Algo; 9] = [
        Algo::Ring,
        Algo::Chain,
        Algo::BinaryTree,
        Algo::DoubleBinaryTree,
        Algo::OneShot,
        Algo::TwoShot,
        Algo::AllPairs,
        Algo::CopyEngine,
        Algo::OneShotLl,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Chain => "chain",
            Algo::BinaryTree => "btree",
            Algo::DoubleBinaryTree => "tree",
            Algo::OneShot => "oneshot",
            Algo::TwoShot => "twoshot",
            Algo::AllPairs => "allpairs",
            Algo::CopyEngine => "ce",
            Algo::OneShotLl => "ll1",
        }
    }

    /// Whether the algorithm's plans are copies only ([`Algo::CopyEngine`]),
    /// which a GPU backend runs on its copy engines with no kernel, so
    /// they use no SM (where the backend falls back to its executor they
    /// do; `oxccl::Communicator::launch_counts` tells).
    pub const fn sm_free(self) -> bool {
        matches!(self, Algo::CopyEngine)
    }

    /// Plan channels (thread blocks per rank on a GPU) that a request for
    /// `channels` generates: the double binary tree gives each of its two
    /// trees a channel of its own, so twice as many; the others one each.
    pub const fn plan_channels(self, channels: u32) -> u32 {
        match self {
            Algo::DoubleBinaryTree => channels.saturating_mul(2),
            _ => channels,
        }
    }

    /// The most channels a request may ask for so that its plan has at
    /// most `max` ([`Algo::plan_channels`]); 0 when not even one fits.
    pub const fn channels_within(self, max: u32) -> u32 {
        match self {
            Algo::DoubleBinaryTree => max / 2,
            _ => max,
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = CoreError;
    /// `tree` is the double binary tree, as `NCCL_ALGO=Tree` means.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "ring" => Algo::Ring,
            "chain" => Algo::Chain,
            "btree" | "binarytree" => Algo::BinaryTree,
            "tree" | "dbtree" | "doublebinarytree" => Algo::DoubleBinaryTree,
            "oneshot" | "one_shot" => Algo::OneShot,
            "twoshot" | "two_shot" => Algo::TwoShot,
            "allpairs" | "all_pairs" | "direct" => Algo::AllPairs,
            "ce" | "copyengine" | "copy_engine" => Algo::CopyEngine,
            "ll1" | "oneshotll" | "oneshot_ll" | "one_shot_ll" => Algo::OneShotLl,
            _ => {
                return Err(CoreError::Parse {
                    what: "algorithm",
                    value: s.to_string(),
                    expected: "ring chain btree tree(dbtree) oneshot twoshot allpairs ce ll1",
                })
            }
        })
    }
}

/// A wire protocol for FIFO connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Simple,
    LL,
    LL128,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Simple, Proto::LL, Proto::LL128];
    pub const fn name(self) -> &'static str {
        match self {
            Proto::Simple => "simple",
            Proto::LL => "ll",
            Proto::LL128 => "ll128",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Proto {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "simple" => Proto::Simple,
            "ll" => Proto::LL,
            "ll128" => Proto::LL128,
            _ => {
                return Err(CoreError::Parse {
                    what: "protocol",
                    value: s.to_string(),
                    expected: "simple ll ll128",
                })
            }
        })
    }
}
