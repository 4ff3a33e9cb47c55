//! Algorithm generators: `(collective, ranks, channels, chunk)` to a [`Plan`].
//!
//! Each generator lives in its own module and builds every rank's part.
//! [`generate`] dispatches on the requested [`Algo`] and says clearly when
//! an algorithm does not serve a collective. [`supports`] is the table the
//! selector and `docs/ARCHITECTURE.md` use.
#![doc = include_str!("ALGORITHMS.md")]

mod allpairs;
mod copies;
mod direct;
mod direct_allpairs;
pub mod p2p;
mod ring;
pub mod tree;

pub use direct::{MAX_PUSH_RANKS, PUSH_GROUP};

use crate::coll::{Algo, CollKind, Collective};
use crate::error::CoreError;
use crate::plan::{BufDecl, BufId, BufRole, Dst, Loc, Plan, Rank, RankPlan, Src, Step, Xfer};

/// What to generate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanRequest {
    pub coll: Collective,
    pub nranks: u32,
    pub algo: Algo,
    /// Channels (parallel step lists, one thread block each on a GPU).
    pub channels: u32,
    /// Largest message in elements (a FIFO slot). Generators pipeline in
    /// pieces of at most this many elements.
    pub chunk: usize,
    /// Whether input and output overlap as NCCL's in-place convention says.
    pub in_place: bool,
    /// Rank orders for rings, one per channel (cycled). Empty: `0..n`.
    pub rings: Vec<Vec<Rank>>,
    /// Each rank's host (indexed by rank), for ranks on several hosts:
    /// the double binary tree then runs across hosts with chains inside
    /// (`tree::Tree::double_binary_hosts`). Empty: one host.
    pub hosts: Vec<u32>,
    /// Whether every rank's input, output and scratch are registered
    /// (addressable by every peer). The one-shot, two-shot and all-pairs
    /// generators then read peers' buffers directly instead of going
    /// through FIFOs.
    pub registered: bool,
    /// The most outputs one pushing step writes (registered two-shot,
    /// Broadcast and AllGather); a piece with more takes one step per group
    /// of this many (two-shot: it reduces into its own output first, then
    /// copies that out in groups). `None`: the generators' defaults
    /// ([`PUSH_GROUP`] for Broadcast and AllGather, every output in the
    /// reducing step for two-shot). For experiments (`OXCCL_PUSH_GROUP`).
    pub push_group: Option<usize>,
}

impl PlanRequest {
    /// A request with one channel, 64 Ki-element chunks and identity rings.
    pub fn new(coll: Collective, nranks: u32, algo: Algo) -> Self {
        PlanRequest {
            coll,
            nranks,
            algo,
            channels: 1,
            chunk: 1 << 16,
            in_place: false,
            rings: Vec::new(),
            hosts: Vec::new(),
            registered: false,
            push_group: None,
        }
    }

    /// The ring order used by `channel`.
    pub fn ring(&self, channel: u32) -> Vec<Rank> {
        if self.rings.is_empty() {
            (0..self.nranks).collect()
        } else {
            self.rings[channel as usize % self.rings.len()].clone()
        }
    }
}

/// Whether `algo` has a generator for `kind`.
pub fn supports(algo: Algo, kind: CollKind) -> bool {
    use CollKind::*;
    match algo {
        // Send/Recv plans come from `p2p::plan`, not from a collective generator.
        Algo::Ring => kind != SendRecv,
        Algo::Chain | Algo::BinaryTree => matches!(kind, AllReduce | Reduce | Broadcast),
        Algo::DoubleBinaryTree => matches!(kind, AllReduce),
        Algo::OneShot | Algo::TwoShot | Algo::OneShotLl => matches!(kind, AllReduce),
        Algo::AllPairs => matches!(
            kind,
            AllGather | ReduceScatter | AllToAll | Gather | Scatter | Broadcast | Reduce
        ),
        Algo::CopyEngine => matches!(kind, AllGather | AllToAll | Gather | Scatter | Broadcast),
    }
}

/// Whether the copy-engine algorithm serves `req`: only on registered
/// buffers (its copies read and write peers' buffers directly).
fn copy_engine_serves(req: &PlanRequest) -> Result<(), CoreError> {
    let refuse = |why: &str| {
        Err(CoreError::Unsupported {
            algo: Algo::CopyEngine.to_string(),
            coll: format!("{} {why}", req.coll.kind),
        })
    };
    if !req.registered {
        return refuse("on unregistered buffers (its copies address peers' buffers)");
    }
    Ok(())
}

/// Whether `algo`'s plans for `kind` reduce every element in rank order
/// 0..n−1 from the original inputs, in one step whose sources are the n
/// contributions (the sequential reference's order, [`crate::reference`]):
/// then a reduction's result depends only on the rank count and the
/// inputs, not on the channel count, piece size, call size, protocol,
/// ring order, or whether the buffers are registered. One-shot and
/// two-shot AllReduce and all-pairs Reduce and ReduceScatter do (FIFO and
/// registered variants alike); rings and trees accumulate partial results
/// in orders that follow the ring or the tree, and so the channel and
/// piece layout. Collectives that reduce nothing are deterministic under
/// every algorithm that serves them.
pub fn reduces_in_rank_order(algo: Algo, kind: CollKind) -> bool {
    if !supports(algo, kind) {
        return false;
    }
    if !kind.is_reduction() {
        return true;
    }
    match algo {
        Algo::OneShot | Algo::TwoShot | Algo::OneShotLl => kind == CollKind::AllReduce,
        Algo::AllPairs => matches!(kind, CollKind::Reduce | CollKind::ReduceScatter),
        Algo::Ring | Algo::Chain | Algo::BinaryTree | Algo::DoubleBinaryTree => false,
        // Serves no reduction (checked above).
        Algo::CopyEngine => false,
    }
}

/// Whether `req` is the in-place AllToAll of several ranks, which the
/// all-pairs plan runs as swaps and the copy-engine plan stages through
/// scratch (`copies`).
fn staged_all_to_all(req: &PlanRequest) -> bool {
    copy_engine_staged(req.coll.kind, req.nranks, req.in_place)
}

/// Whether the copy-engine plan of such a call is staged through scratch
/// with a barrier between its copies (the in-place AllToAll of several
/// ranks): no backend issues that as copies alone, so it runs on the
/// backend's executor, whose plans want the channels a kernel plan gets,
/// not the one channel the copy-engine model prices best.
pub fn copy_engine_staged(kind: CollKind, nranks: u32, in_place: bool) -> bool {
    in_place && kind == CollKind::AllToAll && nranks > 1
}

/// Builds the plan `req` asks for.
pub fn generate(req: &PlanRequest) -> Result<Plan, CoreError> {
    validate(req)?;
    if !supports(req.algo, req.coll.kind) {
        return Err(CoreError::Unsupported {
            algo: req.algo.to_string(),
            coll: req.coll.kind.to_string(),
        });
    }
    if req.algo == Algo::CopyEngine {
        copy_engine_serves(req)?;
    }
    // The copy-engine plan is the registered all-pairs plan with one
    // destination per step, so every transfer is a single copy.
    let copies = (req.algo == Algo::CopyEngine).then(|| PlanRequest {
        algo: Algo::AllPairs,
        push_group: Some(1),
        ..req.clone()
    });
    let ranks = (0..req.nranks)
        .map(|r| {
            let mut rp = empty_rank_plan(req, r);
            match req.algo {
                Algo::CopyEngine if staged_all_to_all(req) => {
                    copies::all_to_all_in_place(req, r, &mut rp)
                }
                Algo::CopyEngine => {
                    direct_allpairs::build(copies.as_ref().unwrap_or(req), r, &mut rp)
                }
                Algo::Ring => ring::build(req, r, &mut rp),
                Algo::Chain | Algo::BinaryTree | Algo::DoubleBinaryTree => {
                    tree::build(req, r, &mut rp)
                }
                Algo::OneShot | Algo::TwoShot if req.registered => direct::build(req, r, &mut rp),
                Algo::AllPairs if req.registered => direct_allpairs::build(req, r, &mut rp),
                Algo::OneShot | Algo::TwoShot | Algo::AllPairs => allpairs::build(req, r, &mut rp),
                // The FIFO one-shot's plan: what a backend without an LL
                // one-shot path for the call runs, and what the checker
                // proves (the LL path computes the same rank-order sums).
                Algo::OneShotLl => allpairs::build(
                    &PlanRequest {
                        algo: Algo::OneShot,
                        registered: false,
                        ..req.clone()
                    },
                    r,
                    &mut rp,
                ),
            }?;
            Ok(rp)
        })
        .collect::<Result<Vec<_>, CoreError>>()?;
    Ok(Plan {
        algo: req.algo,
        coll: Some(req.coll),
        nranks: req.nranks,
        ranks,
    })
}

fn validate(req: &PlanRequest) -> Result<(), CoreError> {
    let bad = |m: String| Err(CoreError::InvalidRequest(m));
    if req.nranks == 0 {
        return bad("zero ranks".into());
    }
    if req.channels == 0 {
        return bad("zero channels".into());
    }
    if req.chunk == 0 {
        return bad("zero chunk size".into());
    }
    if req.coll.kind == CollKind::SendRecv {
        return bad("Send/Recv plans come from gen::p2p::plan, not generate".into());
    }
    if req.coll.kind.has_root() && req.coll.root >= req.nranks {
        return bad(format!(
            "root {} out of range for {} ranks",
            req.coll.root, req.nranks
        ));
    }
    if !req.hosts.is_empty() && req.hosts.len() != req.nranks as usize {
        return bad(format!(
            "{} hosts given for {} ranks: one per rank",
            req.hosts.len(),
            req.nranks
        ));
    }
    for ring in &req.rings {
        let mut seen = vec![false; req.nranks as usize];
        for &r in ring {
            if (r as usize) >= seen.len() || std::mem::replace(&mut seen[r as usize], true) {
                return bad(format!(
                    "ring {ring:?} is not a permutation of 0..{}",
                    req.nranks
                ));
            }
        }
        if ring.len() != req.nranks as usize {
            return bad(format!(
                "ring {ring:?} is not a permutation of 0..{}",
                req.nranks
            ));
        }
    }
    Ok(())
}

/// A rank plan with the standard input/output buffers and no scratch yet.
fn empty_rank_plan(req: &PlanRequest, rank: Rank) -> RankPlan {
    let c = &req.coll;
    RankPlan {
        rank,
        nranks: req.nranks,
        bufs: vec![
            BufDecl {
                role: BufRole::Input,
                len: c.input_len(req.nranks),
                must_write: false,
            },
            BufDecl {
                role: BufRole::Output,
                len: c.output_len(req.nranks),
                must_write: c.writes_output(rank),
            },
            BufDecl {
                role: BufRole::Scratch,
                len: 0,
                must_write: false,
            },
        ],
        channels: Vec::new(),
    }
}

/// Splits `0..len` into `parts` contiguous ranges whose sizes differ by at
/// most one element, larger ones first.
pub fn split(len: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.max(1);
    let (q, rem) = (len / parts, len % parts);
    let mut lo = 0;
    (0..parts)
        .map(|i| {
            let hi = lo + q + usize::from(i < rem);
            let r = lo..hi;
            lo = hi;
            r
        })
        .collect()
}

/// Splits `0..len` into pieces of at most `chunk` elements.
pub fn pieces(
    range: std::ops::Range<usize>,
    chunk: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    let chunk = chunk.max(1);
    (range.start..range.end)
        .step_by(chunk)
        .map(move |lo| lo..(lo + chunk).min(range.end))
}

/// Sets the length of a rank's scratch buffer.
fn set_scratch(rp: &mut RankPlan, len: usize) {
    rp.bufs[BufId::SCRATCH.0 as usize].len = len;
}

/// One channel's steps as a generator emits them. Transfers of zero
/// elements or without a destination are dropped here, on every rank alike
/// (both ends of a connection compute the same lengths), so generators need
/// no special cases for empty blocks.
#[derive(Debug, Default)]
struct Steps(Vec<Step>);

impl Steps {
    fn xfer(&mut self, srcs: Vec<Src>, dsts: Vec<Dst>, len: usize, post: bool) {
        if len > 0 && !dsts.is_empty() {
            self.0.push(Step::Xfer(Xfer {
                srcs,
                dsts,
                len,
                post,
            }));
        }
    }

    /// A plain transfer (no post-operation).
    fn mv(&mut self, src: Src, dsts: Vec<Dst>, len: usize) {
        self.xfer(vec![src], dsts, len, false);
    }

    /// Every rank signals every peer, then waits for every peer: after it,
    /// each rank knows every peer has reached this point of this channel.
    fn barrier(&mut self, rank: Rank, nranks: u32) {
        let peers = || (1..nranks).map(move |k| (rank + k) % nranks);
        self.0.extend(peers().map(|peer| Step::Signal { peer }));
        self.0.extend(peers().map(|peer| Step::Wait { peer }));
    }
}

/// A rank's own contribution to a reduction (pre-scaled).
fn own(at: Loc) -> Src {
    Src::Local { at, pre: true }
}

/// Local data moved as is.
fn local(at: Loc) -> Src {
    Src::Local { at, pre: false }
}

fn recv(peer: Rank) -> Src {
    Src::Recv { peer }
}

fn send(peer: Rank) -> Dst {
    Dst::Send { peer }
}

fn out(off: usize) -> Dst {
    Dst::Local(Loc::output(off))
}

/// A rank's position in a ring order, and its neighbours at any distance.
#[derive(Clone, Debug)]
struct RingPos {
    ring: Vec<Rank>,
    pos: usize,
}

impl RingPos {
    fn new(ring: Vec<Rank>, rank: Rank) -> Self {
        let pos = ring
            .iter()
            .position(|&r| r == rank)
            .expect("validated ring is a permutation");
        RingPos { ring, pos }
    }
    fn n(&self) -> usize {
        self.ring.len()
    }
    /// The rank `k` places after this one.
    fn fwd(&self, k: usize) -> Rank {
        self.ring[(self.pos + k) % self.n()]
    }
    /// The rank `k` places before this one.
    fn back(&self, k: usize) -> Rank {
        self.ring[(self.pos + self.n() - k % self.n()) % self.n()]
    }
    /// How many places after `rank` this one is.
    fn dist_from(&self, rank: Rank) -> usize {
        let p = self
            .ring
            .iter()
            .position(|&r| r == rank)
            .expect("rank in ring");
        (self.pos + self.n() - p) % self.n()
    }
}
