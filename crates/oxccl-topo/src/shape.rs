//! [`Shape`]: what the cost model knows of a communicator's placement,
//! made by the selector and read by the model.

use crate::consts::HopClass;

/// What the model needs to know about a communicator's placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Hosts spanned.
    pub nnodes: u32,
    /// Ranks on the busiest host.
    pub ranks_per_node: u32,
    /// Ranks on the busiest GPU (they share its copy engines).
    pub ranks_per_gpu: u32,
    /// Bus bandwidth rings reach inside a host with enough channels
    /// (GB/s per rank, shared among ranks of one GPU).
    pub intra_bw: f64,
    /// Latency class of a hop inside a host.
    pub intra_hop: HopClass,
    /// Network bandwidth of one host (its NICs the GPUs use), GB/s.
    pub inter_bw: f64,
    /// Every pair of ranks is same-GPU, direct NVLink or NVSwitch, on one
    /// host: the all-pairs algorithms apply.
    pub direct_ok: bool,
    /// What one rank can push to all its peers at once (all-pairs), GB/s.
    pub direct_bw: f64,
    /// LL128 is safe: every intra-host path is NVLink class.
    pub ll128_ok: bool,
}
