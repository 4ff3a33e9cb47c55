//! The copy-engine plans (`Algo::CopyEngine`): every transfer one copy
//! from one buffer to one other, so a backend may issue each as a plain
//! memory copy. Out of place (and in place but for AllToAll) they are the
//! registered all-pairs plans with one destination per step
//! (`direct_allpairs` with `push_group` 1). In-place AllToAll, whose
//! blocks trade places between ranks (a swap in the all-pairs plan), is
//! staged instead: per channel each rank copies its buffer's share into
//! its scratch, a barrier, then it copies block r of every peer q's
//! scratch into its own block q, then a barrier (peers read its scratch
//! until then). That moves twice the floor's bytes, the price of copies
//! only. No backend issues that barrier between copies on its copy
//! engines, so the staged plan runs on the executor, and the facade gives
//! it every channel (`copy_engine_staged`).

use super::{local, out, pieces, set_scratch, split, PlanRequest, Steps};
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src};

/// In-place AllToAll of `req` for `rank`, as copies through scratch.
pub(super) fn all_to_all_in_place(
    req: &PlanRequest,
    rank: Rank,
    rp: &mut RankPlan,
) -> Result<(), CoreError> {
    let (n, count) = (req.nranks, req.coll.count);
    let block = |q: Rank, off: usize| q as usize * count + off;
    set_scratch(rp, n as usize * count);
    for range in split(count, req.channels as usize) {
        let mut s = Steps::default();
        if !range.is_empty() {
            // Stage every peer's block (the own block stays put).
            for q in (0..n).filter(|&q| q != rank) {
                for p in pieces(range.clone(), req.chunk) {
                    let at = block(q, p.start);
                    s.mv(
                        local(Loc::input(at)),
                        vec![Dst::Local(Loc::scratch(at))],
                        p.len(),
                    );
                }
            }
            s.barrier(rank, n);
            for k in 1..n {
                let q = (rank + k) % n;
                for p in pieces(range.clone(), req.chunk) {
                    let src = Src::Remote {
                        peer: q,
                        at: Loc::scratch(block(rank, p.start)),
                        pre: false,
                    };
                    s.mv(src, vec![out(block(q, p.start))], p.len());
                }
            }
            s.barrier(rank, n);
        }
        rp.channels.push(Channel { steps: s.0 });
    }
    Ok(())
}
