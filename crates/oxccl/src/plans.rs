//! Plan selection and the plan cache.
//!
//! Every rank of a clique makes the same choice from the same inputs (the
//! call's shape and the clique's configuration), so all ranks execute parts
//! of one plan. Generated plans are cached per clique, keyed by everything
//! that shapes them, so repeated calls never regenerate.

use std::collections::HashMap;
use std::sync::Arc;

use oxccl_core::gen::{self, PlanRequest};
use oxccl_core::{Algo, CollKind, Collective, CoreError, Plan, Proto};
use parking_lot::Mutex;

use crate::config::Config;
use crate::error::{Error, Result};

/// What was chosen for one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub algo: Algo,
    pub proto: Proto,
    pub channels: u32,
    /// The cost model's prediction, when a selector made the choice.
    pub predicted_us: Option<f64>,
}

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

/// The per-clique cache.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
}

impl PlanCache {
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

/// Algorithms in the order the fixed default tries them: ring serves every
/// collective, then the direct ones, then trees.
const DEFAULT_ORDER: [Algo; 7] = [
    Algo::Ring,
    Algo::AllPairs,
    Algo::DoubleBinaryTree,
    Algo::TwoShot,
    Algo::OneShot,
    Algo::Chain,
    Algo::BinaryTree,
];

/// The algorithms `config` allows for `kind` that have a generator, in
/// preference order.
pub(crate) fn allowed_algos(config: &Config, kind: CollKind) -> Vec<Algo> {
    config
        .algo
        .allowed(kind, &DEFAULT_ORDER)
        .into_iter()
        .filter(|a| gen::supports(*a, kind))
        .collect()
}

/// Chooses algorithm, protocol and channels for a call moving
/// `bytes_per_rank` bytes: the configuration's overrides, else a fixed
/// default (the first allowed algorithm, Simple, 1 to 4 channels by size).
pub(crate) fn choose(
    config: &Config,
    kind: CollKind,
    bytes_per_rank: usize,
    max_channels: u32,
) -> Result<Choice> {
    let algos = allowed_algos(config, kind);
    let Some(&algo) = algos.first() else {
        return Err(Error::NoAlgorithm {
            coll: kind,
            allowed: describe_filter(config, kind),
        });
    };
    let protos = config.proto.allowed(kind, &Proto::ALL);
    let small = bytes_per_rank < 64 << 10;
    let proto = if small && protos.contains(&Proto::LL) {
        Proto::LL
    } else {
        protos.first().copied().ok_or_else(|| Error::Config {
            var: "NCCL_PROTO".into(),
            value: format!("{:?}", config.proto),
            reason: format!("excludes every protocol for {kind}"),
        })?
    };
    let by_size = match bytes_per_rank {
        0..65_536 => 1,
        65_536..1_048_576 => 2,
        _ => 4,
    };
    let channels = config
        .channels
        .unwrap_or(by_size)
        .clamp(1, max_channels.max(1));
    Ok(Choice {
        algo,
        proto,
        channels,
        predicted_us: None,
    })
}

fn describe_filter(config: &Config, kind: CollKind) -> String {
    let names: Vec<&str> = config
        .algo
        .allowed(kind, &Algo::ALL)
        .iter()
        .map(|a| a.name())
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(",")
    }
}
