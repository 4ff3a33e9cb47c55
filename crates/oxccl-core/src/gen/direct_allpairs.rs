//! All-pairs collectives over registered buffers, with no FIFO hop: ranks
//! read peers' inputs (`Src::Remote`) or write peers' outputs
//! (`Dst::Remote`) directly. ReduceScatter, AllToAll and Scatter *pull*
//! (every rank gets what it needs into its own output); Broadcast and
//! AllGather (up to [`MAX_PUSH_RANKS`]), Reduce and Gather *push* (below).
//! The FIFO variants are in `allpairs`.
//!
//! Gather pushes for the same reason as Reduce: pulled, the root's blocks
//! did all of the work, every byte read and written by the root's
//! channels while the other ranks' sat idle (21–22% of the floor on an
//! H200, 8 ranks, 256 MiB); pushed, each rank copies its own input into
//! its block of the root's output, all ranks' channels at once.
//!
//! Why pull for ReduceScatter, AllToAll and Scatter: pull and push
//! need the same synchronisation (the peer must have entered the call
//! before its buffer is touched, and must not return before the access is
//! done), and for these pull already reads every input byte once and
//! writes every output byte once, so push would only move work between
//! ranks. With pull every rank writes only its own memory, so in-place
//! aliasing stays a local matter (ReduceScatter and Scatter need no
//! scratch in place; in-place AllToAll swaps instead, below).
//!
//! Why push for Broadcast and AllGather: pulled, an input that several
//! ranks need is read once per reader (the root's whole input n−1 times,
//! every AllGather input n times), above the HBM floor where all ranks
//! share one memory (on an H200 with 8 ranks at 256 MiB, pulled Broadcast
//! ran at 31% of its floor, AllGather at 49% out of place and 31% in
//! place). Pushed, every input byte is read once and written straight
//! into every output, n destinations in one step:
//! - **Broadcast** spreads the work: per channel the range is split into n
//!   blocks, and rank r reads block r of the root's input (`Src::Remote`;
//!   the root its own locally) and writes it into every output (its own
//!   locally, the peers' remotely), one step per piece. All ranks together
//!   read S and write n·S, the (n+1)·S floor, 1/n per rank. In place the
//!   root's output is its input, its bytes already there: it is no
//!   destination (n−1 per step), nobody writes the root's buffer, so the
//!   reads of it never race a write (n·S in all, the in-place floor).
//! - **AllGather**: rank r reads its own input once per piece and writes it
//!   into block r of every output. All ranks together read S (= n·count)
//!   and write n·S, the n·(S/n + S) floor. In place rank r's input is
//!   block r of its own output, so it writes only the n−1 peers'; block r
//!   of a peer q's output is written by rank r alone and is not q's input.
//!
//! Each rank reads the root's input (Broadcast) and writes every peer's
//! output, so both handshakes are full barriers: at entry every rank must
//! hear from the root (its input is valid) and from every rank whose
//! output it writes (handed over); at exit every rank must wait for every
//! writer of its output, and the root for every reader of its input. One
//! barrier each per channel and call, not per piece. A step then has one
//! source and up to n destinations; the CUDA executor takes at most
//! [`MAX_PUSH_RANKS`] = 128 destinations per step, so above that both fall
//! back to pulling (rows below).
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
//! a reduction done by the root alone, so the CUDA executor's limit of 128
//! operands per step binds both alike: unlike two-shot's push there is no
//! fallback above 128 ranks that would help.
//!
//! Synchronisation, per channel, as a handshake between each owner of
//! memory that a peer accesses and each such peer (the checker proves it,
//! see `race`):
//! - entry: the owner signals, the accessing peer waits (the owner has
//!   entered the call: its input is valid, its output handed over);
//! - exit: the accessing peer signals, the owner waits (it returns, and its
//!   caller reuses the buffers, only once nobody reads or writes them any
//!   more).
//!
//! ReduceScatter, AllToAll, Reduce and the pushes (which also write every
//! peer) access every peer, so both handshakes are full barriers (2(n−1)
//! steps each); pulled Broadcast (above 128 ranks) and Scatter read the
//! root, and Gather writes it (non-roots 1 + 1 steps, the root 2(n−1)).
//!
//! In-place AllToAll is the one case where a rank overwrites memory that
//! peers still read: block q of rank r's buffer is peer q's source and
//! where q's block r must land, and block r of q's buffer likewise, so the
//! two blocks trade places. Each such pair of blocks is one swap, done by
//! one rank: the pair {r, q} belongs to r when q is 1..⌈n/2⌉−1 steps after
//! r (mod n); with even n the opposite pair (n/2 apart) is split, each of
//! the two swapping half of the channel's range (which half alternates by
//! channel), so every rank swaps (n−1)/2 blocks' worth, give or take one
//! element. The owner swaps each of its pairs with one `Step::Swap` per
//! piece: element by element it reads its block and the peer's, then
//! writes each into the other, so every moved byte is read once and
//! written once, the in-place floor (2(n−1)·B per rank, B = `count`
//! elements), in one pass with no scratch. No other rank touches either
//! block, so entry and exit barriers suffice, as for the others;
//! `check_in_place` proves it and reports either barrier removed. Block r
//! of r's buffer stays put. Two earlier plans reached less on an H200 (8
//! ranks, 256 MiB): pulling every piece of the n−1 blocks into scratch and
//! copying it out moved 4(n−1)·B per rank (56% of the floor), and swapping
//! through one L2-sized piece of scratch per channel (peer's piece into
//! scratch, own piece into the peer's block, scratch into own block: three
//! dependent copies with block barriers between them per piece) reached
//! 74–78% whatever the piece size (16 Ki–128 Ki elements).
//!
//! Steps per piece of up to `chunk` elements of each block (Reduce and
//! pushed Broadcast: of the rank's block of the channel's range), per
//! channel:
//!
//! | collective    | steps per piece                                   |
//! |---------------|---------------------------------------------------|
//! | AllGather, n ≤ 128 | 1 copy of its input into n outputs (n−1 peers' in place), one step per [`PUSH_GROUP`] of them |
//! | AllGather, n > 128 | n−1 gets + 1 own copy (none in place)         |
//! | ReduceScatter | 1 reduce_from of n sources                        |
//! | AllToAll      | n−1 gets + 1 own copy (in place: 1 swap per piece of each pair it owns) |
//! | Broadcast, n ≤ 128 | 1 get (root: copy) of its block of the root's input into n outputs (all but the root's in place), one step per [`PUSH_GROUP`] of them |
//! | Broadcast, n > 128 | non-roots 1 get; root 1 copy (none in place)  |
//! | Scatter       | non-roots 1 get; root 1 copy (none in place)      |
//! | Reduce        | 1 reduce_from of n sources into the root's output |
//! | Gather        | non-roots 1 put of their input into the root's output; root 1 own copy (none in place) |
//!
//! Reduction order: one step whose sources are the n contributions in rank
//! order 0..n−1, each pre-scaled, as the FIFO variant and the sequential
//! reference do.

use std::ops::Range;

use super::direct::{block, inputs_in_rank_order, MAX_PUSH_RANKS, PUSH_GROUP};
use super::{local, out, pieces, split, PlanRequest, Steps};
use crate::coll::CollKind;
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src, Step};

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let n = req.nranks;
    let ranges = split(req.coll.count, req.channels as usize);
    let swapped = req.coll.kind == CollKind::AllToAll && req.in_place && n > 1;
    let peers: Vec<Rank> = (1..n).map(|k| (rank + k) % n).collect();
    let root = req.coll.root;
    // Whose memory this rank reads, and who reads this rank's memory.
    let (reads, read_by): (Vec<Rank>, Vec<Rank>) = match req.coll.kind {
        // Gather pushes into the root's output: the root's memory is the
        // one accessed, as for Broadcast and Scatter.
        CollKind::Broadcast | CollKind::Scatter | CollKind::Gather if rank == root => {
            (vec![], peers.clone())
        }
        CollKind::Broadcast | CollKind::Scatter | CollKind::Gather => (vec![root], vec![]),
        _ => (peers.clone(), peers.clone()),
    };
    let g = AllPairs {
        req,
        rank,
        peers,
        reads,
        read_by,
    };
    let push = pushes(req);
    for (ch, range) in ranges.into_iter().enumerate() {
        let mut s = Steps::default();
        if !range.is_empty() {
            if swapped {
                g.all_to_all_swapped(ch, range, &mut s);
            } else if req.coll.kind == CollKind::Reduce {
                g.reduce_into_root(range, &mut s);
            } else if push {
                g.push(range, &mut s);
            } else {
                g.channel(range, &mut s);
            }
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}

/// Whether `req` is a Broadcast or AllGather that pushes: its steps have
/// one destination per rank, so up to [`MAX_PUSH_RANKS`] (the CUDA
/// executor's operand limit); above it they pull.
fn pushes(req: &PlanRequest) -> bool {
    matches!(req.coll.kind, CollKind::Broadcast | CollKind::AllGather)
        && req.nranks <= MAX_PUSH_RANKS
}

/// Which part of the swap of blocks with `peer` this rank does, as a
/// fraction (part, parts) of the channel's range: (0, 1) all of it, (i, 2)
/// half i; `None`: the peer does it all. A pair {r, q} belongs to r when
/// q is 1..⌈n/2⌉−1 steps after r (mod n), so with odd n every rank owns
/// (n−1)/2 pairs. With even n the opposite pair (n/2 steps apart) is
/// split: the rank below n/2 takes half `channel % 2`, its partner the
/// other, so that odd-length channels alternate which one does the larger
/// half. Every rank then swaps (n−1)/2 blocks' worth, give or take one
/// element.
fn swap_share(n: u32, rank: Rank, peer: Rank, channel: usize) -> Option<(usize, usize)> {
    let d = (peer + n - rank) % n;
    if 2 * d == n {
        let upper = usize::from(rank >= n / 2);
        Some(((channel + upper) % 2, 2))
    } else if 2 * d < n {
        Some((0, 1))
    } else {
        None
    }
}

/// One rank's view of a registered all-pairs collective.
struct AllPairs<'a> {
    req: &'a PlanRequest,
    rank: Rank,
    /// Peers in rotating order from this rank, so ranks start on
    /// different peers.
    peers: Vec<Rank>,
    /// Peers whose input this rank reads (for the handshakes of the pulls
    /// and Reduce; the pushes and the in-place AllToAll swap use full
    /// barriers).
    reads: Vec<Rank>,
    /// Peers that read this rank's input (likewise).
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

impl AllPairs<'_> {
    /// Offset of element `off` of rank `r`'s block.
    fn block(&self, r: Rank, off: usize) -> usize {
        r as usize * self.req.coll.count + off
    }

    /// Owners tell their readers they have entered; readers wait for them.
    fn enter(&self, s: &mut Steps) {
        self.signal_entry(s);
        self.await_entry(s);
    }

    /// The owner's half of [`AllPairs::enter`].
    fn signal_entry(&self, s: &mut Steps) {
        s.0.extend(self.read_by.iter().map(|&peer| Step::Signal { peer }));
    }

    /// The reader's half of [`AllPairs::enter`].
    fn await_entry(&self, s: &mut Steps) {
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

    /// Everything but in-place AllToAll: the owner's entry signals, then
    /// local copies (they need no peer, so they overlap the wait for the
    /// peers' entry), then the entry waits and the pulls (or Gather's
    /// pushes). The signals come before the local copies because readers
    /// wait for them: with the root's own copy first, out-of-place Gather
    /// and Scatter ran the root's copy of its block and then everyone
    /// else's transfers one after the other on every channel (H200, 8
    /// ranks, 256 MiB: 70-71% of the floor against 95.6% in place, where
    /// the root copies nothing).
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
        self.signal_entry(s);
        local_part(s);
        self.await_entry(s);
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
                CollKind::Gather if rank != root => {
                    let at = Loc::output(self.block(rank, o));
                    s.mv(
                        local(Loc::input(o)),
                        vec![Dst::Remote { peer: root, at }],
                        l,
                    );
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

    /// Broadcast and AllGather, pushed: entry barrier; per piece one step
    /// that reads it once (Broadcast: this rank's block of the channel's
    /// range from the root's input; AllGather: this rank's own input) and
    /// writes it into every rank's output at once (its own locally, the
    /// peers' remotely); exit barrier. In place the buffer whose bytes are
    /// already there (the root's for Broadcast, this rank's own for
    /// AllGather) is not a destination.
    fn push(&self, range: Range<usize>, s: &mut Steps) {
        let (n, rank, root) = (self.req.nranks, self.rank, self.req.coll.root);
        let broadcast = self.req.coll.kind == CollKind::Broadcast;
        // The elements this rank moves (offsets into its source), and the
        // rank whose buffer already holds them in place.
        let (span, already) = if broadcast {
            let (o, l) = block(&range, n, rank);
            (o..o + l, root)
        } else {
            (range, rank)
        };
        s.barrier(rank, n);
        for p in pieces(span, self.req.chunk) {
            let (src, at) = match (broadcast, rank == root) {
                (true, true) => (local(Loc::input(p.start)), p.start),
                (true, false) => (get(root, p.start), p.start),
                (false, _) => (local(Loc::input(p.start)), self.block(rank, p.start)),
            };
            let dsts = std::iter::once(rank)
                .chain(self.peers.iter().copied())
                .filter(|&q| !(self.req.in_place && q == already))
                .map(|q| {
                    if q == rank {
                        out(at)
                    } else {
                        Dst::Remote {
                            peer: q,
                            at: Loc::output(at),
                        }
                    }
                })
                .collect::<Vec<_>>();
            for group in dsts.chunks(self.req.push_group.unwrap_or(PUSH_GROUP).max(1)) {
                s.mv(src, group.to_vec(), p.len());
            }
        }
        s.barrier(rank, n);
    }

    /// In-place AllToAll: block q of rank r's buffer and block r of q's
    /// trade places, so each pair of blocks is one swap, done by one rank
    /// (`swap_share`) piece by piece. Only the swapping rank touches either
    /// block, so the only synchronisation is a full barrier at entry (the
    /// peer's buffer holds its input) and at exit (the peer returns only
    /// once its block is done with). Block `rank` stays where it is.
    fn all_to_all_swapped(&self, channel: usize, range: Range<usize>, s: &mut Steps) {
        let (n, rank) = (self.req.nranks, self.rank);
        s.barrier(rank, n);
        for &q in &self.peers {
            let Some((part, parts)) = swap_share(n, rank, q, channel) else {
                continue;
            };
            let mine = &split(range.len(), parts)[part];
            let span = range.start + mine.start..range.start + mine.end;
            for p in pieces(span, self.req.chunk) {
                let (o, len) = (p.start, p.len());
                if len > 0 {
                    s.0.push(Step::Swap {
                        at: Loc::output(self.block(q, o)),
                        peer: q,
                        peer_at: Loc::output(self.block(rank, o)),
                        len,
                    });
                }
            }
        }
        s.barrier(rank, n);
    }
}
