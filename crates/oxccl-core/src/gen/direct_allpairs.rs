//! All-pairs collectives over registered buffers: every rank *pulls* what
//! it needs from peers' inputs (`Src::Remote`) straight into its own
//! output, so each byte is read once where it lies and written once where
//! it belongs, with no FIFO hop. Reduce is the exception: it *pushes* into
//! the root's output (below). The FIFO variants are in `allpairs`.
//!
//! Why pull rather than push (a put of one's own block into every peer's
//! output): both need the same synchronisation (the peer must have entered
//! the call before its buffer is touched, and must not return before the
//! access is done), but with pull every rank writes only its own memory.
//! Remote traffic is then reads only, nobody writes into a buffer it does
//! not own, so in-place aliasing stays a local matter (AllGather,
//! ReduceScatter, Gather, Scatter and Broadcast need no scratch in place),
//! and the work of Broadcast, Scatter and Gather spreads over the n−1
//! readers or sits with the root that needs all of it.
//!
//! **Reduce** spreads the reduction over every rank instead of leaving it
//! all to the root: per channel the range is split into n blocks and rank
//! r reduces block r from all n inputs (rank order, each pre-scaled,
//! `post`) and writes it into the root's output (`Dst::Remote`; the root
//! writes its own block locally), one step per piece. All ranks together
//! read n·S and write S, the (n+1)·S floor, and each rank's channels carry
//! 1/n of it. Each rank reads every peer's input, so both handshakes are
//! full barriers and none can be dropped: at entry rank r must hear from
//! every q whose input it reads (and from the root, whose output it
//! writes); at exit every rank q, root or not, must wait for every r that
//! read block r of q's input. Non-roots waiting for each other is part of
//! that (the checker reports "rank q may finish while rank r ... still
//! accesses its memory" without it; `tests/direct_reduce.rs`). In place
//! the root's output is its input: element e of block r of the root's
//! buffer is read (as the root's input) and written by rank r only, in one
//! step, element by element, and touched by no other rank or channel, so
//! no scratch is needed (`interp::check_in_place`'s race detection proves
//! it). The step has n sources and one destination, the operand counts of
//! a reduction done by the root alone, so the CUDA executor's limit of 32
//! operands per step binds both alike: unlike two-shot's push there is no
//! fallback above 32 ranks that would help.
//!
//! Synchronisation, per channel, as a handshake between each owner of
//! memory that is read and each of its readers (the checker proves it,
//! see `race`):
//! - entry: the owner signals its readers, a reader waits for the owners
//!   it reads (the owner has entered the call, its input is valid);
//! - exit: a reader signals the owners it read, an owner waits for its
//!   readers (it returns, and its caller reuses the buffers, only once
//!   nobody reads them any more).
//!
//! AllGather, ReduceScatter, AllToAll and Reduce read every peer, so both
//! handshakes are full barriers (2(n−1) steps each); Broadcast and Scatter
//! read the root (non-roots 1 + 1 steps, the root 2(n−1)); Gather reads
//! the non-roots (the same counts, mirrored).
//!
//! In-place AllToAll is the one case where a rank overwrites memory that
//! peers still read (block q of its buffer is both peer q's source and the
//! destination of what it pulls from q). It stages each piece through
//! scratch: pull the piece of every block into scratch, barrier (every peer
//! has read this piece of my buffer), copy scratch into the output. Scratch
//! is (n−1) pieces per channel and there is one barrier per piece.
//!
//! Steps per piece of up to `chunk` elements of each block (Reduce: of the
//! rank's block of the channel's range), per channel:
//!
//! | collective    | steps per piece                                   |
//! |---------------|---------------------------------------------------|
//! | AllGather     | n−1 gets + 1 own copy (none in place)             |
//! | ReduceScatter | 1 reduce_from of n sources                        |
//! | AllToAll      | n−1 gets + 1 own copy (in place: n−1 gets into scratch, 1 barrier, n−1 copies) |
//! | Broadcast     | non-roots 1 get; root 1 copy (none in place)      |
//! | Scatter       | non-roots 1 get; root 1 copy (none in place)      |
//! | Reduce        | 1 reduce_from of n sources into the root's output |
//! | Gather        | root n−1 gets + 1 own copy (none in place); others none |
//!
//! Reduction order: one step whose sources are the n contributions in rank
//! order 0..n−1, each pre-scaled, as the FIFO variant and the sequential
//! reference do.

use std::ops::Range;

use super::direct::{block, inputs_in_rank_order};
use super::{local, out, pieces, set_scratch, split, PlanRequest, Steps};
use crate::coll::CollKind;
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src, Step};

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let n = req.nranks;
    let ranges = split(req.coll.count, req.channels as usize);
    let staged = req.coll.kind == CollKind::AllToAll && req.in_place;
    // In-place AllToAll: n−1 pieces of scratch per channel.
    let slot = ranges
        .first()
        .map_or(0, |r| r.len().min(req.chunk) * (n as usize - 1));
    if staged {
        set_scratch(rp, slot * ranges.len());
    }
    let peers: Vec<Rank> = (1..n).map(|k| (rank + k) % n).collect();
    let root = req.coll.root;
    // Whose memory this rank reads, and who reads this rank's memory.
    let (reads, read_by): (Vec<Rank>, Vec<Rank>) = match req.coll.kind {
        CollKind::Broadcast | CollKind::Scatter if rank == root => (vec![], peers.clone()),
        CollKind::Broadcast | CollKind::Scatter => (vec![root], vec![]),
        CollKind::Gather if rank == root => (peers.clone(), vec![]),
        CollKind::Gather => (vec![], vec![root]),
        _ => (peers.clone(), peers.clone()),
    };
    let g = Pull {
        req,
        rank,
        peers,
        reads,
        read_by,
    };
    for (ch, range) in ranges.into_iter().enumerate() {
        let mut s = Steps::default();
        if !range.is_empty() {
            if staged {
                g.all_to_all_staged(range, ch * slot, &mut s);
            } else if req.coll.kind == CollKind::Reduce {
                g.reduce_into_root(range, &mut s);
            } else {
                g.channel(range, &mut s);
            }
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}

/// One rank's view of a registered all-pairs collective.
struct Pull<'a> {
    req: &'a PlanRequest,
    rank: Rank,
    /// Peers in rotating order from this rank, so ranks start on
    /// different peers.
    peers: Vec<Rank>,
    /// Peers whose input this rank reads.
    reads: Vec<Rank>,
    /// Peers that read this rank's input.
    read_by: Vec<Rank>,
}

/// A peer's input, as is.
fn get(peer: Rank, off: usize) -> Src {
    Src::Remote {
        peer,
        at: Loc::input(off),
        pre: false,
    }
}

impl Pull<'_> {
    /// Offset of element `off` of rank `r`'s block.
    fn block(&self, r: Rank, off: usize) -> usize {
        r as usize * self.req.coll.count + off
    }

    /// Owners tell their readers they have entered; readers wait for them.
    fn enter(&self, s: &mut Steps) {
        s.0.extend(self.read_by.iter().map(|&peer| Step::Signal { peer }));
        s.0.extend(self.reads.iter().map(|&peer| Step::Wait { peer }));
    }

    /// Readers tell owners they are done; owners wait for every reader.
    fn exit(&self, s: &mut Steps) {
        s.0.extend(self.reads.iter().map(|&peer| Step::Signal { peer }));
        s.0.extend(self.read_by.iter().map(|&peer| Step::Wait { peer }));
    }

    /// Copies this rank's own block (`src` in input, `dst` in output)
    /// unless in place, where it already is there.
    fn own_copy(&self, src: usize, dst: usize, len: usize, s: &mut Steps) {
        if !self.req.in_place {
            s.mv(local(Loc::input(src)), vec![out(dst)], len);
        }
    }

    /// Everything but in-place AllToAll: local copies first (they need no
    /// peer, so they overlap the entry handshake), then the pulls.
    fn channel(&self, range: Range<usize>, s: &mut Steps) {
        let (rank, root, chunk) = (self.rank, self.req.coll.root, self.req.chunk);
        let local_part = |s: &mut Steps| {
            for p in pieces(range.clone(), chunk) {
                let (o, l) = (p.start, p.len());
                match self.req.coll.kind {
                    CollKind::AllGather => self.own_copy(o, self.block(rank, o), l, s),
                    CollKind::AllToAll => {
                        self.own_copy(self.block(rank, o), self.block(rank, o), l, s);
                    }
                    CollKind::Broadcast if rank == root => self.own_copy(o, o, l, s),
                    CollKind::Scatter if rank == root => {
                        self.own_copy(self.block(root, o), o, l, s);
                    }
                    CollKind::Gather if rank == root => {
                        self.own_copy(o, self.block(root, o), l, s);
                    }
                    _ => {}
                }
            }
        };
        local_part(s);
        self.enter(s);
        for p in pieces(range.clone(), chunk) {
            let (o, l) = (p.start, p.len());
            match self.req.coll.kind {
                CollKind::AllGather => {
                    for &q in &self.peers {
                        s.mv(get(q, o), vec![out(self.block(q, o))], l);
                    }
                }
                CollKind::AllToAll => {
                    for &q in &self.peers {
                        s.mv(get(q, self.block(rank, o)), vec![out(self.block(q, o))], l);
                    }
                }
                CollKind::ReduceScatter => {
                    let srcs = inputs_in_rank_order(rank, self.req.nranks, self.block(rank, o));
                    s.xfer(srcs, vec![out(o)], l, true);
                }
                CollKind::Gather if rank == root => {
                    for &q in &self.peers {
                        s.mv(get(q, o), vec![out(self.block(q, o))], l);
                    }
                }
                CollKind::Broadcast if rank != root => s.mv(get(root, o), vec![out(o)], l),
                CollKind::Scatter if rank != root => {
                    s.mv(get(root, self.block(rank, o)), vec![out(o)], l);
                }
                _ => {}
            }
        }
        self.exit(s);
    }

    /// Reduce: entry barrier, block `rank` of `range` reduced from every
    /// input into the root's output piece by piece, exit barrier.
    fn reduce_into_root(&self, range: Range<usize>, s: &mut Steps) {
        let (n, root) = (self.req.nranks, self.req.coll.root);
        self.enter(s);
        let (o, l) = block(&range, n, self.rank);
        for p in pieces(o..o + l, self.req.chunk) {
            let dst = if self.rank == root {
                out(p.start)
            } else {
                Dst::Remote {
                    peer: root,
                    at: Loc::output(p.start),
                }
            };
            let srcs = inputs_in_rank_order(self.rank, n, p.start);
            s.xfer(srcs, vec![dst], p.len(), true);
        }
        self.exit(s);
    }

    /// In-place AllToAll: per piece, pull block `rank` of every peer into
    /// scratch at `base`, barrier (every peer has read this piece of my
    /// buffer, which I am about to overwrite), then copy into the output.
    /// The last barrier is also the exit.
    fn all_to_all_staged(&self, range: Range<usize>, base: usize, s: &mut Steps) {
        self.enter(s);
        for p in pieces(range, self.req.chunk) {
            let (o, l) = (p.start, p.len());
            let tmp = |i: usize| Loc::scratch(base + i * l);
            for (i, &q) in self.peers.iter().enumerate() {
                s.mv(
                    get(q, self.block(self.rank, o)),
                    vec![Dst::Local(tmp(i))],
                    l,
                );
            }
            self.exit(s);
            for (i, &q) in self.peers.iter().enumerate() {
                s.mv(local(tmp(i)), vec![out(self.block(q, o))], l);
            }
        }
    }
}
