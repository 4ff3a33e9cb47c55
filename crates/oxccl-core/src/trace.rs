//! What a backend records of a plan's steps when a step trace is asked for
//! (`OXCCL_TRACE`): one record per step run, with host times.

use std::time::Instant;

use crate::plan::Rank;

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
    /// Whether the step had to wait for that peer.
    pub waited: bool,
    /// When the step was first tried, and when it finished.
    pub start: Instant,
    pub end: Instant,
}
