//! (in progress)
use super::PlanRequest;
use crate::error::CoreError;
use crate::plan::{Rank, RankPlan};

pub(super) fn build(req: &PlanRequest, _rank: Rank, _rp: &mut RankPlan) -> Result<(), CoreError> {
    Err(CoreError::Unsupported {
        algo: req.algo.to_string(),
        coll: req.coll.kind.to_string(),
    })
}
