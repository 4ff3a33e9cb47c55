//! [`Communicator::shrink`]: a communicator of the ranks that remain when
//! some are excluded, made by the remaining ranks alone (NCCL's
//! `ncclCommShrink`): the excluded ones never call it, and may be dead.
//!
//! Ranks as processes meet in a new rendezvous served by the lowest
//! remaining rank on its bootstrap listener (`Bootstrap::subset_id`), so
//! nothing passes through an excluded rank; ranks as threads meet on the
//! clique's split board with only the remaining ranks expected. Either
//! way a remaining rank that never calls makes the others fail at the
//! configured deadline, naming what they waited for.

use std::sync::Arc;

use oxccl_bootstrap::Bootstrap;

use crate::comm::Communicator;
use crate::error::map_bootstrap;
use crate::error::{Error, Result};

/// The ranks of an `nranks`-rank communicator that remain once `exclude`
/// is left out, ascending; repeats in `exclude` are allowed, ranks out of
/// range and excluding everyone are not.
pub(crate) fn remaining(nranks: u32, exclude: &[u32]) -> Result<Vec<u32>> {
    if let Some(r) = exclude.iter().find(|&&r| r >= nranks) {
        return Err(Error::InvalidUsage(format!(
            "excluded rank {r} is out of range for {nranks} ranks"
        )));
    }
    let left: Vec<u32> = (0..nranks).filter(|r| !exclude.contains(r)).collect();
    if left.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "excluding {exclude:?} leaves none of the {nranks} ranks"
        )));
    }
    Ok(left)
}

impl Communicator {
    /// A new communicator of this one's ranks without `exclude`, numbered
    /// in their order here (NCCL's `ncclCommShrink`). Only the remaining
    /// ranks call it, each with the same list; an excluded rank that calls
    /// it gets `Ok(None)` at once and takes no part. It works on a failed
    /// communicator (a peer's process died: exclude it): only a destroyed
    /// one is refused. Blocks until every remaining rank has joined, at
    /// most the configured deadline.
    pub fn shrink(&self, exclude: &[u32]) -> Result<Option<Communicator>> {
        let _nvtx = crate::observe::range(crate::observe::Func::CommShrink, || self.tool_args());
        self.check_not_destroyed()?;
        let cl = self.clique();
        let members = remaining(cl.nranks, exclude)?;
        let Some(new_rank) = members.iter().position(|&r| r == self.rank()) else {
            return Ok(None);
        };
        let Some(boot) = cl.boot.as_ref() else {
            return crate::split_threads::shrink(self, &members).map(Some);
        };
        let id = boot.subset_id(&members).map_err(map_bootstrap)?;
        let child = Bootstrap::init(
            &id,
            members.len() as u32,
            new_rank as u32,
            &cl.config
                .bootstrap_settings()
                .device_info(None, String::new()),
            cl.config.deadline,
        )
        .map_err(map_bootstrap)?;
        Communicator::on_bootstrap(Arc::new(child), self.child_config()).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_ranks_are_checked() {
        assert_eq!(remaining(4, &[3]).unwrap(), [0, 1, 2]);
        assert_eq!(remaining(4, &[1, 1, 2]).unwrap(), [0, 3]);
        assert_eq!(remaining(4, &[]).unwrap(), [0, 1, 2, 3]);
        assert!(matches!(remaining(4, &[4]), Err(Error::InvalidUsage(_))));
        assert!(matches!(remaining(2, &[0, 1]), Err(Error::InvalidUsage(_))));
    }
}
