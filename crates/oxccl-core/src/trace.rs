//! What a backend records of a plan's steps when a step trace is asked for
//! (`OXCCL_TRACE`): one record per step run, with host times (the host
//! backend) or the GPU's `%globaltimer` (the CUDA backend).

use std::time::Instant;

use crate::plan::{Dst, Rank, Src, Step};

/// A moment on one of the two clocks a step can be timed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stamp {
    Host(Instant),
    /// Nanoseconds of the GPU's global timer.
    Device(u64),
}

/// One plan step as it ran on a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRecord {
    pub channel: u32,
    /// The step's index in its channel.
    pub step: u32,
    /// What the step does (`recv_reduce_send`, `wait`, ...).
    pub name: &'static str,
    /// The peer the step waited on, else the peer it exchanged with.
    pub peer: Option<Rank>,
    /// Whether the step had to wait for that peer (known on the host
    /// backend only).
    pub waited: bool,
    /// When the step was first tried, and when it finished.
    pub start: Stamp,
    pub end: Stamp,
}

/// A step's kind in the plan IR's words (`recv_reduce_send`), and the
/// first peer it exchanges with.
pub fn describe(step: &Step) -> (&'static str, Option<Rank>) {
    match step {
        Step::Signal { peer } => ("signal", Some(*peer)),
        Step::Wait { peer } => ("wait", Some(*peer)),
        Step::Swap { peer, .. } => ("swap", Some(*peer)),
        Step::Xfer(x) => {
            let from = x.srcs.iter().find_map(|s| match *s {
                Src::Recv { peer } | Src::Remote { peer, .. } => Some(peer),
                Src::Local { .. } => None,
            });
            let to = x.dsts.iter().find_map(|d| match *d {
                Dst::Send { peer } | Dst::Remote { peer, .. } => Some(peer),
                Dst::Local(_) => None,
            });
            (
                name(from.is_some(), x.srcs.len() > 1, to.is_some()),
                from.or(to),
            )
        }
    }
}

/// A transfer's name from whether it receives, reduces and sends.
pub fn name(recv: bool, reduce: bool, send: bool) -> &'static str {
    match (recv, reduce, send) {
        (true, true, true) => "recv_reduce_send",
        (true, true, false) => "recv_reduce",
        (true, false, true) => "recv_copy_send",
        (true, false, false) => "recv",
        (false, true, true) => "reduce_send",
        (false, true, false) => "reduce",
        (false, false, true) => "send",
        (false, false, false) => "copy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Loc, Xfer};

    #[test]
    fn steps_are_named_by_what_they_move() {
        let x = Step::Xfer(Xfer {
            srcs: vec![
                Src::Recv { peer: 3 },
                Src::Local {
                    at: Loc::input(0),
                    pre: false,
                },
            ],
            dsts: vec![Dst::Send { peer: 1 }],
            len: 4,
            post: false,
        });
        assert_eq!(describe(&x), ("recv_reduce_send", Some(3)));
        assert_eq!(describe(&Step::Wait { peer: 2 }), ("wait", Some(2)));
    }
}
