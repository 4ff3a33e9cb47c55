//! One-shot and two-shot AllReduce over registered buffers: ranks read
//! peers' inputs (and, for two-shot, write peers' outputs) directly
//! (`Src::Remote`, `Dst::Remote`) and order their accesses with
//! signal/wait barriers (every rank signals every peer, then waits for
//! every peer, on each channel). No FIFOs: each byte is read once from
//! where it lies.
//!
//! **Two-shot pushes** (n ≤ [`MAX_PUSH_RANKS`]): each channel's range is
//! split into n blocks; rank r reduces block r from all n inputs (rank
//! order, each pre-scaled, `post` on the result) and writes the result in
//! the same step into block r of every rank's output (its own `Dst::Local`
//! and n−1 `Dst::Remote`). Per rank that is S read (1/n of each of the n
//! inputs) and S written (1/n into each of the n outputs), the 2·S floor;
//! the pull scheme below moves (3n−1)/n·S (2.875·S at n = 8). With a
//! `push_group` below n in the request (`OXCCL_PUSH_GROUP`) the step
//! writes its own output only and copies it out from there, one step per
//! group of peers (each re-reading the reduced piece, from L2): a block
//! then keeps at most that many write streams open, as AllGather's pushes
//! do with [`PUSH_GROUP`]. Not the default: see [`PUSH_GROUP`].
//!
//! Synchronisation of the push, per channel and per call (not per piece;
//! pieces of `chunk` only bound the size of one step):
//! - entry barrier: no rank reads a peer's input or writes a peer's output
//!   before the peer has entered the call (its input is valid and its
//!   caller has handed over the output);
//! - exit barrier: a rank returns only after every peer has signalled that
//!   it finished reading its input and writing its output (each signal
//!   follows, in channel order, the peer's last access).
//!
//! In place (output = input), element e of block r on every rank is read
//! and then written by rank r only, within one step, element by element
//! (the step reads every source of an element before writing it), and by
//! no other rank or channel: no scratch is needed. `interp::check_in_place`
//! proves it with its happens-before race detection.
//!
//! **Two-shot pulls** above [`MAX_PUSH_RANKS`] (a step would need more
//! destinations than the CUDA executor takes): rank r reduces its block
//! into its own output, a middle barrier, then it gets the other n−1
//! blocks from peers' outputs; entry and exit barriers as above.
//!
//! **One-shot**: every rank reduces the whole range from all n inputs into
//! its own output (into scratch in place, since peers still read the input
//! it would overwrite, copied to the output after the exit barrier). Its
//! exit barrier cannot be merged with the next call's entry: without it a
//! rank returns while peers may still read its input, which then belongs
//! to the caller again (it may overwrite it before the next call, or never
//! make one). Merging would need the inputs copied into library-owned,
//! registered staging buffers that persist across calls and alternate by
//! call parity (so call k+2 only overwrites what call k+1's entry barrier
//! proved read); a plan describes one call with per-call scratch, so the
//! checker could not prove that.
//!
//! Steps per channel: 2(n−1) per barrier plus, per piece of up to `chunk`
//! elements, one reduce_from of n sources: two-shot push 2 barriers and
//! the pieces of its own block (one step when the block fits a chunk);
//! one-shot 2 barriers and the pieces of the range (+ one copy each in
//! place); two-shot pull 3 barriers and, per round of n blocks of up to
//! `chunk`, one reduce_from and n−1 gets. Reduction order: rank order
//! 0..n−1, the sequential reference's order, on every rank.

use std::ops::Range;

use super::allpairs::in_rank_order;
use super::{local, out, own, pieces, set_scratch, split, PlanRequest, Steps};
use crate::coll::Algo;
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src};

/// The most ranks for which two-shot, Broadcast and AllGather push: a
/// pushing step has n destinations (two-shot also n sources), and the CUDA
/// executor takes at most 128 of each (`oxccl_cuda::MAX_OPERANDS`, which
/// asserts this bound at compile time). Until the executor took 128 this
/// was 32, and 64 or 128 ranks on one H200 pulled: AllGather reached 57–59%
/// of its memory floor there (every input read n times) against 101% pushed
/// at 32 ranks.
pub const MAX_PUSH_RANKS: u32 = 128;

/// The most destinations one pushing Broadcast or AllGather step writes;
/// more ranks take one step per group of this many, each reading the
/// piece again (from L2, just read). On an
/// H200 AllGather at 64 MiB pushed with one destination per rank per step
/// ran at 95% of its floor at 16 ranks and 91–101% at 32, but 70% at 64
/// and 21% at 128 (docs/perf/LOG.md, 2026-12-04 20:28 H200): one block then keeps 64 or 128 write streams
/// open at once. Two-shot still writes all n outputs in its reducing step:
/// at 128 ranks on the H100 its median call of 20 at 64 MiB took
/// 7273–9353 µs in ten rows, against 7146–7418 µs in three rows with
/// groups of 16 or 32 (`push_group`; groups of 8: 8729 and 9018 µs, more
/// steps), the 2026-12-06 01:05 H100 run; on the H200 (docs/perf/LOG.md, 2026-12-06 03:20 H200) one step and groups of 32 ran
/// within 1.5% of each other at 64 and 128 ranks (4837–4920 µs at 128),
/// with no such spread: grouping stays an experiment.
pub const PUSH_GROUP: usize = 32;

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let n = req.nranks;
    let one_shot = req.algo == Algo::OneShot;
    if one_shot && req.in_place {
        set_scratch(rp, req.coll.count);
    }
    let g = Direct { req, rank, n };
    for range in split(req.coll.count, req.channels as usize) {
        let mut s = Steps::default();
        if range.is_empty() || n == 1 {
            // Nothing to share: a plain local reduction of one contribution.
            for p in pieces(range, req.chunk) {
                s.xfer(g.sources(p.start), vec![out(p.start)], p.len(), true);
            }
        } else {
            s.barrier(rank, n);
            if one_shot {
                g.one_shot(range, &mut s);
            } else if n <= MAX_PUSH_RANKS {
                g.two_shot_push(range, &mut s);
            } else {
                g.two_shot_pull(range, &mut s);
            }
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}

/// Element `off` of every rank's input in rank order 0..n−1, each
/// pre-scaled, as seen from `rank` (its own locally, peers' remotely): the
/// sources of a registered reduction step (here and in `direct_allpairs`).
pub(super) fn inputs_in_rank_order(rank: Rank, n: u32, off: usize) -> Vec<Src> {
    in_rank_order(rank, n, own(Loc::input(off)), |q| Src::Remote {
        peer: q,
        at: Loc::input(off),
        pre: true,
    })
}

/// Block `q` of `p` when `p` is split into n blocks: (offset, length).
pub(super) fn block(p: &Range<usize>, n: u32, q: Rank) -> (usize, usize) {
    let b = &split(p.len(), n as usize)[q as usize];
    (p.start + b.start, b.len())
}

/// One rank's view of a registered one-shot or two-shot AllReduce.
struct Direct<'a> {
    req: &'a PlanRequest,
    rank: Rank,
    n: u32,
}

impl Direct<'_> {
    fn sources(&self, off: usize) -> Vec<Src> {
        inputs_in_rank_order(self.rank, self.n, off)
    }

    /// Peers in rotating order from this rank, so ranks start on
    /// different peers.
    fn peers(&self) -> impl Iterator<Item = Rank> + '_ {
        (1..self.n).map(move |k| (self.rank + k) % self.n)
    }

    fn block(&self, p: &Range<usize>, q: Rank) -> (usize, usize) {
        block(p, self.n, q)
    }

    /// After the entry barrier: reduce into output (scratch in place),
    /// exit barrier, in place copy scratch to output.
    fn one_shot(&self, range: Range<usize>, s: &mut Steps) {
        let dst = |o: usize| {
            Dst::Local(if self.req.in_place {
                Loc::scratch(o)
            } else {
                Loc::output(o)
            })
        };
        for p in pieces(range.clone(), self.req.chunk) {
            s.xfer(self.sources(p.start), vec![dst(p.start)], p.len(), true);
        }
        s.barrier(self.rank, self.n);
        if self.req.in_place {
            for p in pieces(range, self.req.chunk) {
                s.mv(local(Loc::scratch(p.start)), vec![out(p.start)], p.len());
            }
        }
    }

    /// After the entry barrier: reduce this rank's block from every input
    /// into every output, exit barrier. With a request's `push_group` below
    /// n the reduction lands in its own output only and is copied from
    /// there to the peers' outputs, at most a group per step: block r of
    /// every buffer is still touched by rank r alone, in place too.
    fn two_shot_push(&self, range: Range<usize>, s: &mut Steps) {
        let (o, l) = self.block(&range, self.rank);
        let group = self.req.push_group.filter(|&g| g < self.n as usize);
        for p in pieces(o..o + l, self.req.chunk) {
            let remote = |q| Dst::Remote {
                peer: q,
                at: Loc::output(p.start),
            };
            match group {
                None => {
                    let dsts = std::iter::once(out(p.start))
                        .chain(self.peers().map(remote))
                        .collect();
                    s.xfer(self.sources(p.start), dsts, p.len(), true);
                }
                Some(g) => {
                    s.xfer(self.sources(p.start), vec![out(p.start)], p.len(), true);
                    let peers: Vec<Dst> = self.peers().map(remote).collect();
                    for dsts in peers.chunks(g.max(1)) {
                        s.mv(local(Loc::output(p.start)), dsts.to_vec(), p.len());
                    }
                }
            }
        }
        s.barrier(self.rank, self.n);
    }

    /// After the entry barrier: per round of n blocks of up to `chunk`,
    /// reduce this rank's block into its output; middle barrier; get the
    /// other blocks from their owners' outputs; exit barrier.
    fn two_shot_pull(&self, range: Range<usize>, s: &mut Steps) {
        let rounds: Vec<_> =
            pieces(range, self.req.chunk.saturating_mul(self.n as usize)).collect();
        for p in &rounds {
            let (o, l) = self.block(p, self.rank);
            s.xfer(self.sources(o), vec![out(o)], l, true);
        }
        s.barrier(self.rank, self.n);
        for p in &rounds {
            for q in self.peers() {
                let (o, l) = self.block(p, q);
                let get = Src::Remote {
                    peer: q,
                    at: Loc::output(o),
                    pre: false,
                };
                s.mv(get, vec![out(o)], l);
            }
        }
        s.barrier(self.rank, self.n);
    }
}
