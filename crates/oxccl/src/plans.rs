//! The plan cache.
//!
//! Every rank of a clique makes the same choice from the same inputs (see
//! `select`), so all ranks execute parts of one plan. Generated plans are
//! cached per clique, keyed by everything that shapes them, so repeated
//! calls never regenerate. Each entry also keeps what the backend made for
//! the plan (per protocol: device uploads of every rank), so after the
//! first call a collective only looks the entry up and enqueues.
//!
//! Locking: the map is read-locked for lookups (ranks do not serialise on
//! a hit) and write-locked only to insert a new entry. Backend preparation
//! runs under the entry's own lock, never the map's: a rank that is behind
//! and needs an older entry is never blocked by an upload of a newer one
//! (it may be the very rank whose kernel the upload's allocation waits for).

use std::collections::HashMap;
use std::sync::Arc;

use oxccl_core::gen::{self, PlanRequest};
use oxccl_core::plan::Rank;
use oxccl_core::{Algo, Collective, CoreError, Plan, Proto};
use parking_lot::{Mutex, RwLock};

use crate::backend::{Backend, PlanHandle};
use crate::error::Result;

/// Everything that shapes a generated plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub coll: Collective,
    pub elem_size: usize,
    pub algo: Algo,
    pub channels: u32,
    /// Largest piece in elements: the backend's FIFO message, or (for
    /// registered direct plans, which move no FIFO message) larger.
    pub chunk: usize,
    /// Largest FIFO message in elements; a plan whose messages exceed it
    /// is regenerated with `chunk = fifo_chunk`.
    pub fifo_chunk: usize,
    pub in_place: bool,
    pub registered: bool,
}

/// A generated plan and the backend's state for it, per protocol.
#[derive(Debug)]
pub(crate) struct PlanEntry {
    pub plan: Plan,
    elem_size: usize,
    handles: [Mutex<Option<Option<PlanHandle>>>; 3],
}

fn proto_slot(p: Proto) -> usize {
    match p {
        Proto::LL => 0,
        Proto::LL128 => 1,
        Proto::Simple => 2,
    }
}

impl PlanEntry {
    /// An entry for `plan` on `elem_size`-byte elements, no handle made yet.
    pub fn new(plan: Plan, elem_size: usize) -> Self {
        PlanEntry {
            plan,
            elem_size,
            handles: Default::default(),
        }
    }

    /// The backend's state for running this plan with `proto`, made on
    /// first use (by whichever rank gets here first, for every rank).
    pub fn handle(&self, backend: &dyn Backend, proto: Proto) -> Result<Option<PlanHandle>> {
        let mut slot = self.handles[proto_slot(proto)].lock();
        if let Some(h) = slot.as_ref() {
            return Ok(h.clone());
        }
        let _span = tracing::debug_span!("oxccl.prepare_plan", proto = %proto).entered();
        let h = backend.prepare_plan(&self.plan, self.elem_size, proto)?;
        *slot = Some(h.clone());
        Ok(h)
    }
}

/// The per-clique cache. The ring orders are the clique's (one per
/// channel, from the topology search), so they are not part of the key.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    rings: Vec<Vec<Rank>>,
    /// Each rank's host, for ranks on several hosts (empty: one host).
    hosts: Vec<u32>,
    /// The most outputs one pushing step writes (`Config::push_group`).
    push_group: Option<usize>,
    plans: RwLock<HashMap<PlanKey, Arc<PlanEntry>>>,
}

impl PlanCache {
    /// The cache of a clique with these rings, whose ranks are on the
    /// hosts `hosts` (empty: one host).
    pub fn new(rings: Vec<Vec<Rank>>, hosts: Vec<u32>) -> Self {
        PlanCache {
            rings,
            hosts,
            push_group: None,
            plans: RwLock::default(),
        }
    }

    /// The cache with pushing steps of at most `g` outputs (`None`: the
    /// generators' defaults).
    pub fn with_push_group(mut self, g: Option<usize>) -> Self {
        self.push_group = g;
        self
    }

    /// The plan for `key`, generated on first use. Generation happens under
    /// the write lock, so ranks asking at once wait for one generation.
    pub fn get(&self, nranks: u32, key: PlanKey) -> Result<Arc<PlanEntry>, CoreError> {
        if let Some(p) = self.plans.read().get(&key) {
            return Ok(p.clone());
        }
        let mut plans = self.plans.write();
        if let Some(p) = plans.get(&key) {
            return Ok(p.clone());
        }
        let _span = tracing::debug_span!("oxccl.generate", algo = %key.algo, channels = key.channels, chunk = key.chunk).entered();
        let mut plan = gen::generate(&self.request(nranks, &key, key.chunk))?;
        if key.chunk > key.fifo_chunk && plan.ranks.iter().any(|r| r.max_message() > key.fifo_chunk)
        {
            plan = gen::generate(&self.request(nranks, &key, key.fifo_chunk))?;
        }
        let entry = Arc::new(PlanEntry::new(plan, key.elem_size));
        plans.insert(key, entry.clone());
        Ok(entry)
    }

    fn request(&self, nranks: u32, key: &PlanKey, chunk: usize) -> PlanRequest {
        PlanRequest {
            channels: key.channels,
            chunk,
            in_place: key.in_place,
            registered: key.registered,
            rings: self.rings.clone(),
            hosts: self.hosts.clone(),
            push_group: self.push_group,
            ..PlanRequest::new(key.coll, nranks, key.algo)
        }
    }

    pub fn len(&self) -> usize {
        self.plans.read().len()
    }
}

#[cfg(test)]
mod tests {
    use oxccl_core::CollKind;

    use super::*;
    use crate::backend::null::NullBackend;

    fn key(count: usize) -> PlanKey {
        PlanKey {
            coll: Collective::new(CollKind::AllReduce, count, 0),
            elem_size: 4,
            algo: Algo::OneShot,
            channels: 2,
            chunk: 1 << 20,
            fifo_chunk: 256,
            in_place: false,
            registered: true,
        }
    }

    #[test]
    fn a_plan_is_generated_and_prepared_once_per_protocol() {
        let backend = NullBackend::new(4, 1 << 10);
        let cache = PlanCache::new(vec![vec![0, 1, 2, 3]; 2], Vec::new());
        for _ in 0..100 {
            for rank in 0..4 {
                let e = cache.get(4, key(1000)).unwrap();
                assert!(e.handle(&backend, Proto::Simple).unwrap().is_some());
                assert_eq!(e.plan.ranks[rank].rank as usize, rank);
            }
        }
        assert_eq!(cache.len(), 1);
        assert_eq!(backend.prepared(), 1);
        cache
            .get(4, key(1000))
            .unwrap()
            .handle(&backend, Proto::LL)
            .unwrap();
        assert_eq!(backend.prepared(), 2);
    }

    #[test]
    fn registered_direct_plans_take_large_pieces_fifo_plans_do_not() {
        let cache = PlanCache::new(vec![vec![0, 1, 2, 3]; 2], Vec::new());
        // One-shot on registered buffers moves no FIFO message: one piece
        // per channel of 500 elements, above the 256-element FIFO chunk.
        let direct = cache.get(4, key(1000)).unwrap();
        let steps = direct.plan.ranks[0].step_count();
        let ring = cache
            .get(
                4,
                PlanKey {
                    algo: Algo::Ring,
                    ..key(1000)
                },
            )
            .unwrap();
        // Ring moves FIFO messages: regenerated at the FIFO chunk.
        assert!(ring.plan.ranks.iter().all(|r| r.max_message() <= 256));
        let small = PlanCache::new(vec![vec![0, 1, 2, 3]; 2], Vec::new())
            .get(
                4,
                PlanKey {
                    chunk: 256,
                    ..key(1000)
                },
            )
            .unwrap();
        assert!(steps < small.plan.ranks[0].step_count(), "{steps}");
    }
}
