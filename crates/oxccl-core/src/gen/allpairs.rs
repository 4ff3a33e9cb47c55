//! All-pairs (direct) generators over FIFOs: every rank talks to every
//! peer, or the root to every rank. One-shot and two-shot AllReduce here
//! are the FIFO variants; with registered buffers see `direct` and
//! `direct_allpairs`.
//!
//! Each channel owns a contiguous part of the data and pipelines it in
//! pieces of at most `req.chunk` elements (two-shot: pieces of n blocks of
//! at most `chunk`). Steps per piece on each rank (n ranks):
//!
//! | collective    | steps per piece                                         |
//! |---------------|---------------------------------------------------------|
//! | AllGather     | 1 (own block to output and to every peer) + n−1 receives |
//! | ReduceScatter | n−1 sends + 1 reduce of n sources                        |
//! | AllToAll      | n−1 sends + 1 own copy + n−1 receives (in place: + n−1 copies out of scratch) |
//! | Gather        | root: 1 + n−1 receives; others: 1 send                   |
//! | Scatter       | root: 1 + n−1 sends; others: 1 receive                   |
//! | Broadcast     | root: 1 (to output and every peer); others: 1 receive    |
//! | Reduce        | root: 1 reduce of n sources; others: 1 send              |
//! | OneShot AllReduce | 1 (input to every peer) + 1 reduce of n sources      |
//! | TwoShot AllReduce | n−1 sends + 1 reduce + 1 (own block to every peer) + n−1 receives |
//!
//! Reduction order (deterministic and the same on every rank): one step
//! whose sources are the n contributions in rank order 0..n−1, exactly the
//! sequential reference's order.

use super::ring::Exchange;
use super::{local, out, own, pieces, recv, send, set_scratch, split, PlanRequest, Steps};
use crate::coll::{Algo, CollKind};
use crate::error::CoreError;
use crate::plan::{Channel, Loc, Rank, RankPlan, Src};

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let n = req.nranks;
    let ranges = split(req.coll.count, req.channels as usize);
    let slot = ranges
        .first()
        .map_or(0, |r| r.len().min(req.chunk) * (n as usize - 1));
    let a2a = req.coll.kind == CollKind::AllToAll;
    if a2a && req.in_place {
        set_scratch(rp, slot * ranges.len());
    }
    let peers: Vec<Rank> = (1..n).map(|k| (rank + k) % n).collect();
    let g = Gen { req, rank, peers };
    for (ch, range) in ranges.into_iter().enumerate() {
        let mut s = Steps::default();
        let piece = if req.algo == Algo::TwoShot {
            req.chunk.saturating_mul(n as usize)
        } else {
            req.chunk
        };
        for p in pieces(range, piece) {
            let (off, len) = (p.start, p.len());
            match (req.algo, req.coll.kind) {
                (Algo::OneShot, _) => g.one_shot(off, len, &mut s),
                (Algo::TwoShot, _) => g.two_shot(off, len, &mut s),
                (_, CollKind::AllGather) => g.all_gather(off, len, &mut s),
                (_, CollKind::ReduceScatter) => g.reduce_scatter(off, len, &mut s),
                (_, CollKind::AllToAll) => {
                    let ex = Exchange {
                        rank,
                        nranks: n,
                        count: req.coll.count,
                        scratch: req.in_place.then_some(ch * slot),
                        interleave: false,
                    };
                    ex.emit(
                        &|k| (rank + k as u32) % n,
                        &|k| (rank + n - k as u32) % n,
                        off,
                        len,
                        &mut s,
                    );
                }
                (_, CollKind::Gather) => g.gather(off, len, &mut s),
                (_, CollKind::Scatter) => g.scatter(off, len, &mut s),
                (_, CollKind::Broadcast) => g.broadcast(off, len, &mut s),
                (_, CollKind::Reduce) => g.reduce(off, len, &mut s),
                (_, CollKind::AllReduce | CollKind::SendRecv) => unreachable!("not supported"),
            }
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}

/// The n contributions in rank order: this rank's own input at `at`
/// (pre-scaled), every peer's next message.
pub(super) fn in_rank_order(rank: Rank, n: u32, mine: Src, peer: impl Fn(Rank) -> Src) -> Vec<Src> {
    (0..n)
        .map(|q| if q == rank { mine } else { peer(q) })
        .collect()
}

struct Gen<'a> {
    req: &'a PlanRequest,
    rank: Rank,
    /// Peers in rotating order from this rank.
    peers: Vec<Rank>,
}

impl Gen<'_> {
    fn count(&self) -> usize {
        self.req.coll.count
    }
    fn root(&self) -> Rank {
        self.req.coll.root
    }
    fn block(&self, r: Rank, off: usize) -> usize {
        r as usize * self.count() + off
    }
    fn sends(&self) -> Vec<crate::plan::Dst> {
        self.peers.iter().map(|&q| send(q)).collect()
    }
    /// Reduces the n contributions at `off` of input into output `dst`.
    fn reduce_all(&self, input_off: usize, dst: usize, len: usize, s: &mut Steps) {
        let srcs = in_rank_order(self.rank, self.req.nranks, own(Loc::input(input_off)), recv);
        s.xfer(srcs, vec![out(dst)], len, true);
    }

    fn all_gather(&self, off: usize, len: usize, s: &mut Steps) {
        let mut dsts = self.sends();
        if !self.req.in_place {
            dsts.insert(0, out(self.block(self.rank, off)));
        }
        s.mv(local(Loc::input(off)), dsts, len);
        for &q in self.peers.iter().rev() {
            s.mv(recv(q), vec![out(self.block(q, off))], len);
        }
    }

    fn reduce_scatter(&self, off: usize, len: usize, s: &mut Steps) {
        for &q in &self.peers {
            s.mv(own(Loc::input(self.block(q, off))), vec![send(q)], len);
        }
        self.reduce_all(self.block(self.rank, off), off, len, s);
    }

    fn gather(&self, off: usize, len: usize, s: &mut Steps) {
        let root = self.root();
        if self.rank != root {
            s.mv(local(Loc::input(off)), vec![send(root)], len);
            return;
        }
        if !self.req.in_place {
            s.mv(
                local(Loc::input(off)),
                vec![out(self.block(root, off))],
                len,
            );
        }
        for &q in &self.peers {
            s.mv(recv(q), vec![out(self.block(q, off))], len);
        }
    }

    fn scatter(&self, off: usize, len: usize, s: &mut Steps) {
        let root = self.root();
        if self.rank != root {
            s.mv(recv(root), vec![out(off)], len);
            return;
        }
        if !self.req.in_place {
            s.mv(
                local(Loc::input(self.block(root, off))),
                vec![out(off)],
                len,
            );
        }
        for &q in &self.peers {
            s.mv(local(Loc::input(self.block(q, off))), vec![send(q)], len);
        }
    }

    fn broadcast(&self, off: usize, len: usize, s: &mut Steps) {
        let root = self.root();
        if self.rank != root {
            s.mv(recv(root), vec![out(off)], len);
            return;
        }
        let mut dsts = self.sends();
        if !self.req.in_place {
            dsts.insert(0, out(off));
        }
        s.mv(local(Loc::input(off)), dsts, len);
    }

    fn reduce(&self, off: usize, len: usize, s: &mut Steps) {
        let root = self.root();
        if self.rank != root {
            s.mv(own(Loc::input(off)), vec![send(root)], len);
            return;
        }
        self.reduce_all(off, off, len, s);
    }

    fn one_shot(&self, off: usize, len: usize, s: &mut Steps) {
        s.mv(own(Loc::input(off)), self.sends(), len);
        self.reduce_all(off, off, len, s);
    }

    /// A round of n blocks: block q is reduced by rank q (reduce-scatter),
    /// then every rank sends its reduced block to every peer (all-gather).
    fn two_shot(&self, off: usize, len: usize, s: &mut Steps) {
        let blocks = split(len, self.req.nranks as usize);
        let blk = |q: Rank| (off + blocks[q as usize].start, blocks[q as usize].len());
        for &q in &self.peers {
            let (o, l) = blk(q);
            s.mv(own(Loc::input(o)), vec![send(q)], l);
        }
        let (mo, ml) = blk(self.rank);
        self.reduce_all(mo, mo, ml, s);
        s.mv(local(Loc::output(mo)), self.sends(), ml);
        for &q in self.peers.iter().rev() {
            let (o, l) = blk(q);
            s.mv(recv(q), vec![out(o)], l);
        }
    }
}
