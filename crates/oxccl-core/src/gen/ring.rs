//! Ring generators.
//!
//! AllReduce is NCCL's ring: a reduce-scatter pass (send, n−2 ×
//! recv_reduce_send, recv_reduce_copy_send) then an all-gather pass (n−2 ×
//! recv_copy_send, recv), 2(n−1) steps per round. Each channel owns a
//! contiguous part of the buffer and pipelines it in rounds of at most
//! `n × chunk` elements.

use super::{pieces, split, PlanRequest};
use crate::coll::CollKind;
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src, Step, Xfer};

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    match req.coll.kind {
        CollKind::AllReduce => all_reduce(req, rank, rp),
        other => Err(CoreError::Unsupported {
            algo: "ring".into(),
            coll: other.to_string(),
        }),
    }
}

/// Position of `rank` in `ring` and its neighbours (prev, next).
fn neighbours(ring: &[Rank], rank: Rank) -> (usize, Rank, Rank) {
    let n = ring.len();
    let p = ring
        .iter()
        .position(|&r| r == rank)
        .expect("ring is a permutation");
    (p, ring[(p + n - 1) % n], ring[(p + 1) % n])
}

fn all_reduce(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    let n = req.nranks as usize;
    for (ch, range) in split(req.coll.count, req.channels as usize)
        .into_iter()
        .enumerate()
    {
        let ring = req.ring(ch as u32);
        let (p, prev, next) = neighbours(&ring, rank);
        let mut steps = Vec::new();
        for round in pieces(range, req.chunk.saturating_mul(n)) {
            let blocks = split(round.len(), n);
            // Block b of this round, as a position and length.
            let blk = |b: usize| (round.start + blocks[b].start, blocks[b].len());
            if n == 1 {
                let (off, len) = blk(0);
                steps.push(Step::Xfer(Xfer {
                    srcs: vec![Src::Local {
                        at: Loc::input(off),
                        pre: true,
                    }],
                    dsts: vec![Dst::Local(Loc::output(off))],
                    len,
                    post: true,
                }));
                continue;
            }
            let mut push = |b: usize, srcs: Vec<Src>, dsts: Vec<Dst>, post: bool| {
                let (_, len) = blk(b);
                if len > 0 {
                    steps.push(Step::Xfer(Xfer {
                        srcs,
                        dsts,
                        len,
                        post,
                    }));
                }
            };
            let input = |b: usize| Src::Local {
                at: Loc::input(blk(b).0),
                pre: true,
            };
            let output = |b: usize| Dst::Local(Loc::output(blk(b).0));
            let recv = Src::Recv { peer: prev };
            let send = Dst::Send { peer: next };
            // Reduce-scatter: position p starts with block p−1 and ends owning block p.
            let b0 = (p + n - 1) % n;
            push(b0, vec![input(b0)], vec![send], false);
            for j in 2..n {
                let b = (p + n - j) % n;
                push(b, vec![recv, input(b)], vec![send], false);
            }
            push(p, vec![recv, input(p)], vec![output(p), send], true);
            // All-gather of the reduced blocks.
            for j in 1..n - 1 {
                let b = (p + n - j) % n;
                push(b, vec![recv], vec![output(b), send], false);
            }
            let bl = (p + 1) % n;
            push(bl, vec![recv], vec![output(bl)], false);
        }
        rp.channels.push(Channel { steps });
    }
    Ok(())
}
