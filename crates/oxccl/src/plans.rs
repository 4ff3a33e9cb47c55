//! The plan cache.
//!
//! Every rank of a clique makes the same choice from the same inputs (see
//! `select`), so all ranks execute parts of one plan. Generated plans are
//! cached per clique, keyed by everything that shapes them, so repeated
//! calls never regenerate.

use std::collections::HashMap;
use std::sync::Arc;

use oxccl_core::gen::{self, PlanRequest};
use oxccl_core::plan::Rank;
use oxccl_core::{Algo, Collective, CoreError, Plan};
use parking_lot::Mutex;

/// Everything that shapes a generated plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub coll: Collective,
    pub elem_size: usize,
    pub algo: Algo,
    pub channels: u32,
    pub chunk: usize,
    pub in_place: bool,
    pub registered: bool,
}

/// The per-clique cache. The ring orders are the clique's (one per
/// channel, from the topology search), so they are not part of the key.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    rings: Vec<Vec<Rank>>,
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
}

impl PlanCache {
    pub fn new(rings: Vec<Vec<Rank>>) -> Self {
        PlanCache {
            rings,
            plans: Mutex::default(),
        }
    }

    /// The plan for `key`, generated on first use. Generation happens under
    /// the lock, so ranks asking at once wait for one generation.
    pub fn get(&self, nranks: u32, key: PlanKey) -> Result<Arc<Plan>, CoreError> {
        let mut plans = self.plans.lock();
        if let Some(p) = plans.get(&key) {
            return Ok(p.clone());
        }
        let req = PlanRequest {
            channels: key.channels,
            chunk: key.chunk,
            in_place: key.in_place,
            registered: key.registered,
            rings: self.rings.clone(),
            ..PlanRequest::new(key.coll, nranks, key.algo)
        };
        let plan = Arc::new(gen::generate(&req)?);
        plans.insert(key, plan.clone());
        Ok(plan)
    }

    pub fn len(&self) -> usize {
        self.plans.lock().len()
    }
}
