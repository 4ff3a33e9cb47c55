//! Ring generators: every collective over the ring order the topology
//! search chose for each channel (`req.ring(channel)`).
//!
//! Each channel owns a contiguous part of the data (`split` of the count)
//! and pipelines it in pieces of at most `req.chunk` elements. Steps per
//! piece on each rank (n ranks):
//!
//! | collective    | steps per piece                                        |
//! |---------------|--------------------------------------------------------|
//! | AllReduce     | 2n−1 per round of n blocks (send, n−2 × recv_reduce_send, recv_reduce_copy_send, n−2 × recv_copy_send, recv): 2(n−1) messages |
//! | Broadcast     | 1 (a pipelined chain from the root along the ring)     |
//! | Reduce        | 1 (a pipelined chain along the ring ending at the root)|
//! | AllGather     | n (send own block, n−2 × recv_copy_send, recv)         |
//! | ReduceScatter | n (send, n−2 × recv_reduce_send, recv_reduce)          |
//! | AllToAll      | 2(n−1) + 1 (n−1 rotating send/recv pairs, own copy; in place: + n−1 copies out of scratch) |
//! | Gather        | d + 1 on the rank d places before the root; n at the root |
//! | Scatter       | n − d on the rank d places after the root; n at the root |
//!
//! Reduction order (deterministic): along the ring. AllReduce and
//! ReduceScatter reduce block b starting at the rank after b's owner;
//! Reduce starts at the rank after the root and ends at the root; each
//! step adds the received partial first, then the rank's own input.

use super::{local, out, own, pieces, recv, send, set_scratch, split, PlanRequest, RingPos, Steps};
use crate::coll::CollKind;
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan};

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let kind = req.coll.kind;
    let ranges = split(req.coll.count, req.channels as usize);
    // In-place AllToAll receives into scratch: one piece of n−1 blocks per channel.
    let slot = ranges
        .first()
        .map_or(0, |r| r.len().min(req.chunk) * (req.nranks as usize - 1));
    if kind == CollKind::AllToAll && req.in_place {
        set_scratch(rp, slot * ranges.len());
    }
    for (ch, range) in ranges.into_iter().enumerate() {
        let ring = RingPos::new(req.ring(ch as u32), rank);
        let mut s = Steps::default();
        for piece in pieces(range.clone(), piece_len(req)) {
            let (off, len) = (piece.start, piece.len());
            match kind {
                CollKind::AllReduce => all_reduce(&ring, off, len, &mut s),
                CollKind::Broadcast => broadcast(req, &ring, off, len, &mut s),
                CollKind::Reduce => reduce(req, &ring, off, len, &mut s),
                CollKind::AllGather => all_gather(req, &ring, off, len, &mut s),
                CollKind::ReduceScatter => reduce_scatter(req, &ring, off, len, &mut s),
                CollKind::AllToAll => {
                    let to = |k| ring.fwd(k);
                    let from = |k| ring.back(k);
                    let ex = Exchange {
                        rank,
                        nranks: req.nranks,
                        count: req.coll.count,
                        scratch: req.in_place.then_some(ch * slot),
                        interleave: true,
                    };
                    ex.emit(&to, &from, off, len, &mut s);
                }
                CollKind::Gather => gather(req, &ring, off, len, &mut s),
                CollKind::Scatter => scatter(req, &ring, off, len, &mut s),
                CollKind::SendRecv => unreachable!("validated"),
            }
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}

/// AllReduce pipelines rounds of n blocks of up to `chunk` elements; the
/// others pieces of `chunk`.
fn piece_len(req: &PlanRequest) -> usize {
    match req.coll.kind {
        CollKind::AllReduce => req.chunk.saturating_mul(req.nranks as usize),
        _ => req.chunk,
    }
}

fn all_reduce(ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let p = ring.pos;
    if n == 1 {
        s.xfer(vec![own(Loc::input(off))], vec![out(off)], len, true);
        return;
    }
    let blocks = split(len, n);
    // Block b of this round, as a position and length.
    let blk = |b: usize| (off + blocks[b].start, blocks[b].len());
    let input = |b: usize| own(Loc::input(blk(b).0));
    let output = |b: usize| out(blk(b).0);
    let (rcv, snd) = (recv(ring.back(1)), send(ring.fwd(1)));
    // Reduce-scatter: position p starts with block p−1 and ends owning block p.
    let b0 = (p + n - 1) % n;
    s.xfer(vec![input(b0)], vec![snd], blk(b0).1, false);
    for j in 2..n {
        let b = (p + n - j) % n;
        s.xfer(vec![rcv, input(b)], vec![snd], blk(b).1, false);
    }
    s.xfer(vec![rcv, input(p)], vec![output(p), snd], blk(p).1, true);
    // All-gather of the reduced blocks.
    for j in 1..n - 1 {
        let b = (p + n - j) % n;
        s.xfer(vec![rcv], vec![output(b), snd], blk(b).1, false);
    }
    let bl = (p + 1) % n;
    s.xfer(vec![rcv], vec![output(bl)], blk(bl).1, false);
}

fn broadcast(req: &PlanRequest, ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let d = ring.dist_from(req.coll.root);
    let mut dsts = Vec::new();
    if d == 0 {
        if !req.in_place {
            dsts.push(out(off));
        }
        if n > 1 {
            dsts.push(send(ring.fwd(1)));
        }
        s.mv(local(Loc::input(off)), dsts, len);
        return;
    }
    dsts.push(out(off));
    if d < n - 1 {
        dsts.push(send(ring.fwd(1)));
    }
    s.mv(recv(ring.back(1)), dsts, len);
}

fn reduce(req: &PlanRequest, ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let me = own(Loc::input(off));
    // Distance from the first rank of the chain (the one after the root).
    let d = (ring.dist_from(req.coll.root) + n - 1) % n;
    let srcs = if d == 0 {
        vec![me]
    } else {
        vec![recv(ring.back(1)), me]
    };
    if d == n - 1 {
        s.xfer(srcs, vec![out(off)], len, true);
    } else {
        s.xfer(srcs, vec![send(ring.fwd(1))], len, false);
    }
}

fn all_gather(req: &PlanRequest, ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let c = req.coll.count;
    let me = ring.fwd(0) as usize;
    let mut dsts = Vec::new();
    if !req.in_place {
        dsts.push(out(me * c + off));
    }
    if n > 1 {
        dsts.push(send(ring.fwd(1)));
    }
    s.mv(local(Loc::input(off)), dsts, len);
    for k in 1..n {
        let owner = ring.back(k) as usize;
        let mut dsts = vec![out(owner * c + off)];
        if k < n - 1 {
            dsts.push(send(ring.fwd(1)));
        }
        s.mv(recv(ring.back(1)), dsts, len);
    }
}

fn reduce_scatter(req: &PlanRequest, ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let c = req.coll.count;
    let input = |r: Rank| own(Loc::input(r as usize * c + off));
    let me = ring.fwd(0);
    if n == 1 {
        s.xfer(vec![input(me)], vec![out(off)], len, true);
        return;
    }
    let (rcv, snd) = (recv(ring.back(1)), send(ring.fwd(1)));
    s.xfer(vec![input(ring.back(1))], vec![snd], len, false);
    for j in 2..n {
        s.xfer(vec![rcv, input(ring.back(j))], vec![snd], len, false);
    }
    s.xfer(vec![rcv, input(me)], vec![out(off)], len, true);
}

fn gather(req: &PlanRequest, ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let c = req.coll.count;
    // Distance to the root: the root is at n−1 from the chain's start.
    let d = (ring.dist_from(req.coll.root) + n - 1) % n;
    if d == n - 1 {
        if !req.in_place {
            s.mv(
                local(Loc::input(off)),
                vec![out(req.coll.root as usize * c + off)],
                len,
            );
        }
        for k in 1..n {
            let owner = ring.back(k) as usize;
            s.mv(recv(ring.back(1)), vec![out(owner * c + off)], len);
        }
        return;
    }
    // Own block first, then relay the d blocks of the ranks before.
    let snd = send(ring.fwd(1));
    s.mv(local(Loc::input(off)), vec![snd], len);
    for _ in 0..d {
        s.mv(recv(ring.back(1)), vec![snd], len);
    }
}

fn scatter(req: &PlanRequest, ring: &RingPos, off: usize, len: usize, s: &mut Steps) {
    let n = ring.n();
    let c = req.coll.count;
    let d = ring.dist_from(req.coll.root);
    if d == 0 {
        let block = |r: Rank| local(Loc::input(r as usize * c + off));
        if !req.in_place {
            s.mv(block(req.coll.root), vec![out(off)], len);
        }
        // Farthest first, so every rank forwards before it keeps its own.
        for k in (1..n).rev() {
            s.mv(block(ring.fwd(k)), vec![send(ring.fwd(1))], len);
        }
        return;
    }
    for _ in d + 1..n {
        s.mv(recv(ring.back(1)), vec![send(ring.fwd(1))], len);
    }
    s.mv(recv(ring.back(1)), vec![out(off)], len);
}

/// AllToAll as n−1 exchanges with the peers `to(k)` / `from(k)`, k in
/// 1..n; shared by the ring (ring neighbours at distance k, send and
/// receive interleaved) and all-pairs (rank order, all sends first).
#[derive(Clone, Copy, Debug)]
pub(super) struct Exchange {
    pub rank: Rank,
    pub nranks: u32,
    pub count: usize,
    /// In place: where this channel's scratch slot starts. Blocks are
    /// received there and copied out once every block of the piece is sent.
    pub scratch: Option<usize>,
    pub interleave: bool,
}

impl Exchange {
    pub fn emit(
        &self,
        to: &dyn Fn(usize) -> Rank,
        from: &dyn Fn(usize) -> Rank,
        off: usize,
        len: usize,
        s: &mut Steps,
    ) {
        let n = self.nranks as usize;
        let c = self.count;
        let blk = |r: Rank| r as usize * c + off;
        if self.scratch.is_none() {
            s.mv(
                local(Loc::input(blk(self.rank))),
                vec![out(blk(self.rank))],
                len,
            );
        }
        let dst = |k: usize| match self.scratch {
            Some(base) => Dst::Local(Loc::scratch(base + (k - 1) * len)),
            None => out(blk(from(k))),
        };
        let snd = |k: usize, s: &mut Steps| {
            s.mv(local(Loc::input(blk(to(k)))), vec![send(to(k))], len);
        };
        if self.interleave {
            for k in 1..n {
                snd(k, s);
                s.mv(recv(from(k)), vec![dst(k)], len);
            }
        } else {
            (1..n).for_each(|k| snd(k, s));
            (1..n).for_each(|k| s.mv(recv(from(k)), vec![dst(k)], len));
        }
        if let Some(base) = self.scratch {
            for k in 1..n {
                s.mv(
                    local(Loc::scratch(base + (k - 1) * len)),
                    vec![out(blk(from(k)))],
                    len,
                );
            }
        }
    }
}
