//! One-shot and two-shot AllReduce over registered buffers: ranks read
//! peers' inputs and outputs directly (`Src::Remote`) and order their
//! accesses with signal/wait barriers (every rank signals every peer, then
//! waits for every peer, on each channel). No FIFOs, each byte is read
//! once from where it lies.
//!
//! Synchronisation, per channel (the checker proves it, see `race`):
//! - an entry barrier: no rank reads a peer's input before the peer has
//!   entered the call;
//! - two-shot only, a middle barrier: every rank's reduced block is in its
//!   output before peers copy it;
//! - an exit barrier: no rank returns (so no caller reuses or overwrites
//!   an input or output) while peers still read it.
//!
//! In place, one-shot reduces into scratch first (peers still read the
//! input, which is the output) and copies to the output after the exit
//! barrier; two-shot writes only its own block during the reduce-scatter,
//! which no peer reads, so it needs no scratch.
//!
//! Steps per channel: 2(n−1) per barrier (one-shot 2 barriers, two-shot 3)
//! plus, per piece of up to `chunk` elements, one reduce_from of n sources
//! (one-shot, + 1 copy in place) or, per round of n blocks of up to
//! `chunk`, one reduce_from and n−1 gets (two-shot). Reduction order: rank
//! order 0..n−1, the sequential reference's order, on every rank.

use super::allpairs::in_rank_order;
use super::{local, out, own, pieces, set_scratch, split, PlanRequest, Steps};
use crate::coll::Algo;
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src};

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let n = req.nranks;
    let one_shot = req.algo == Algo::OneShot;
    if one_shot && req.in_place {
        set_scratch(rp, req.coll.count);
    }
    let remote = |q: Rank, at: Loc| Src::Remote {
        peer: q,
        at,
        pre: true,
    };
    for range in split(req.coll.count, req.channels as usize) {
        let mut s = Steps::default();
        if range.is_empty() || n == 1 {
            // Nothing to share: a plain local reduction of one contribution.
            for p in pieces(range, req.chunk) {
                s.xfer(
                    vec![own(Loc::input(p.start))],
                    vec![out(p.start)],
                    p.len(),
                    true,
                );
            }
            rp.channels.push(Channel { steps: s.0 });
            continue;
        }
        s.barrier(rank, n);
        if one_shot {
            let dst = |o: usize| {
                Dst::Local(if req.in_place {
                    Loc::scratch(o)
                } else {
                    Loc::output(o)
                })
            };
            for p in pieces(range.clone(), req.chunk) {
                let srcs = in_rank_order(rank, n, own(Loc::input(p.start)), |q| {
                    remote(q, Loc::input(p.start))
                });
                s.xfer(srcs, vec![dst(p.start)], p.len(), true);
            }
            s.barrier(rank, n);
            if req.in_place {
                for p in pieces(range, req.chunk) {
                    s.mv(local(Loc::scratch(p.start)), vec![out(p.start)], p.len());
                }
            }
        } else {
            let rounds: Vec<_> = pieces(range, req.chunk.saturating_mul(n as usize)).collect();
            let blk = |p: &std::ops::Range<usize>, q: Rank| {
                let b = &split(p.len(), n as usize)[q as usize];
                (p.start + b.start, b.len())
            };
            for p in &rounds {
                let (o, l) = blk(p, rank);
                let srcs = in_rank_order(rank, n, own(Loc::input(o)), |q| remote(q, Loc::input(o)));
                s.xfer(srcs, vec![out(o)], l, true);
            }
            s.barrier(rank, n);
            for p in &rounds {
                for k in 1..n {
                    let q = (rank + k) % n;
                    let (o, l) = blk(p, q);
                    let get = Src::Remote {
                        peer: q,
                        at: Loc::output(o),
                        pre: false,
                    };
                    s.mv(get, vec![out(o)], l);
                }
            }
            s.barrier(rank, n);
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}
