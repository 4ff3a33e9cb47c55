//! Each rank's memo of its recent call shapes, so a repeated collective
//! skips selection and the clique's plan cache.
//!
//! The clique-wide caches (`select::Chooser`'s memo, `plans::PlanCache`
//! and each entry's per-protocol handle) are shared by every rank's
//! thread: a lookup there takes a shared lock, hashes the key and bumps
//! reference counts that all ranks write, so ranks calling at once bounce
//! those cache lines between cores. What a call shape resolves to never
//! changes for a clique (its configuration and backend are fixed, plans
//! are never evicted, a handle once made is kept), so each communicator
//! keeps the last few shapes it ran with everything the launch needs,
//! behind its own lock that only its thread takes. A hit touches nothing
//! another rank writes.

use std::sync::Arc;

use oxccl_core::plan::RankPlan;
use oxccl_core::Collective;

use crate::backend::PlanHandle;
use crate::plans::PlanEntry;
use crate::select::Choice;

/// Distinct call shapes remembered per rank (a program alternating
/// between a handful of sizes, or the sweep's out-of-place and in-place
/// rows, keeps hitting).
const SLOTS: usize = 8;

/// What identifies a call's plan and choice, given the clique: everything
/// else in the plan key follows from the choice and the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallShape {
    pub coll: Collective,
    pub elem_size: usize,
    pub in_place: bool,
    /// Whether both buffers are backend memory (see `validate::Checked`).
    pub backend_memory: bool,
}

/// A resolved call shape: the shared plan, the choice (with the algorithm
/// actually generated) and the backend's handle for its protocol.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub shape: CallShape,
    pub entry: Arc<PlanEntry>,
    pub choice: Choice,
    pub handle: Option<PlanHandle>,
}

impl Resolved {
    pub fn rank_plan(&self, rank: u32) -> &RankPlan {
        &self.entry.plan.ranks[rank as usize]
    }
}

/// One communicator's recent shapes and its last choice (for reports).
#[derive(Debug, Default)]
pub(crate) struct Recent {
    pub last_choice: Option<Choice>,
    slots: [Option<Arc<Resolved>>; SLOTS],
    /// The slot the next miss replaces (round robin).
    next: usize,
}

impl Recent {
    /// The resolved call for `shape`, if this rank ran it recently. The
    /// returned handle is this rank's own reference count, not a shared one.
    pub fn find(&self, shape: &CallShape) -> Option<Arc<Resolved>> {
        self.slots
            .iter()
            .flatten()
            .find(|r| r.shape == *shape)
            .cloned()
    }

    /// Remembers `r`, replacing the oldest insertion when full.
    pub fn insert(&mut self, r: Arc<Resolved>) {
        self.slots[self.next] = Some(r);
        self.next = (self.next + 1) % SLOTS;
    }
}

#[cfg(test)]
mod tests {
    use oxccl_core::gen::{generate, PlanRequest};
    use oxccl_core::{Algo, CollKind, Proto};

    use super::*;

    fn shape(count: usize) -> CallShape {
        CallShape {
            coll: Collective::new(CollKind::AllReduce, count, 0),
            elem_size: 4,
            in_place: false,
            backend_memory: true,
        }
    }

    fn resolved(count: usize) -> Arc<Resolved> {
        let s = shape(count);
        let plan = generate(&PlanRequest::new(s.coll, 2, Algo::Ring)).unwrap();
        Arc::new(Resolved {
            shape: s,
            entry: Arc::new(PlanEntry::new(plan, 4)),
            choice: Choice {
                algo: Algo::Ring,
                proto: Proto::Simple,
                channels: 1,
                transport: crate::select::Transport::Fifo,
                predicted_us: None,
                forced: false,
            },
            handle: None,
        })
    }

    #[test]
    fn finds_what_it_holds_and_forgets_the_oldest() {
        let mut r = Recent::default();
        for count in 1..=SLOTS {
            r.insert(resolved(count));
        }
        for count in 1..=SLOTS {
            assert_eq!(r.find(&shape(count)).unwrap().shape, shape(count));
        }
        assert!(r.find(&shape(SLOTS + 1)).is_none());
        r.insert(resolved(SLOTS + 1));
        assert!(r.find(&shape(1)).is_none(), "the oldest is replaced");
        assert!(r.find(&shape(2)).is_some());
        assert!(r.find(&shape(SLOTS + 1)).is_some());
        // Any field of the shape tells calls apart.
        let other = CallShape {
            in_place: true,
            ..shape(2)
        };
        assert!(r.find(&other).is_none());
    }
}
