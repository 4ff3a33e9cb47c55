//! The branches of the settings tree ([`super::Config`]) that the facade hands to the lower
//! crates at init, each applied to that crate's own configuration.

use std::path::PathBuf;

use oxccl_cuda::{GateMode, WorldConfig};
use oxccl_host::HostConfig;
use oxccl_host::SocketSettings;

/// The host backend's settings, over [`HostConfig`]'s defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSettings {
    /// Channels connected per peer over the network (`OXCCL_NET_CHANNELS`).
    pub net_channels: Option<usize>,
    /// `OXCCL_NET_SEND_BY_REF` (an experiment; on by default).
    pub net_send_by_reference: Option<bool>,
    /// `OXCCL_NET_RECV_IN_PLACE` (an experiment; on by default).
    pub net_receive_in_place: Option<bool>,
    /// Threads and sockets per network connection the user set.
    pub sockets: SocketSettings,
    /// Ranks of one host talk over the network (`NCCL_P2P_DISABLE=1` and
    /// `NCCL_SHM_DISABLE=1`, or their `OXCCL_` twins).
    pub force_network: bool,
    /// `NCCL_NET_PLUGIN`: the network plugins to load (`none`: none).
    pub net_plugin: Option<String>,
    /// `NCCL_NET`: the network to use, by name.
    pub net_name: Option<String>,
}

impl HostSettings {
    /// `cfg` with these settings applied.
    pub(crate) fn apply(&self, mut cfg: HostConfig) -> HostConfig {
        cfg.net_channels = self.net_channels.unwrap_or(cfg.net_channels);
        cfg.net_send_by_reference = self
            .net_send_by_reference
            .unwrap_or(cfg.net_send_by_reference);
        cfg.net_receive_in_place = self
            .net_receive_in_place
            .unwrap_or(cfg.net_receive_in_place);
        cfg.net_sockets = self.sockets;
        cfg.force_network |= self.force_network;
        cfg.net_plugin = self.net_plugin.clone().or(cfg.net_plugin);
        cfg.net_name = self.net_name.clone().or(cfg.net_name);
        cfg
    }
}

/// Which path CUDA ranks as processes take (`OXCCL_CUDA_PROCS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcsPath {
    /// Kernels of different processes share links by IPC.
    Device,
    /// Data is staged through host memory and the host backend.
    Staged,
}

/// The CUDA backend's settings, over [`WorldConfig`]'s defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaSettings {
    /// `OXCCL_LAUNCH_GATE` (an experiment).
    pub launch_gate: GateMode,
    /// `OXCCL_RELAUNCH`: no kernel waits for a peer's (for
    /// compute-sanitizer; `WorldConfig::relaunch`).
    pub relaunch: bool,
    /// `OXCCL_BLOCK_SMEM` bytes (an experiment; 0 by default).
    pub block_smem: u32,
    /// `OXCCL_CACHE_DIR`: where compiled kernels are cached.
    pub cache_dir: Option<PathBuf>,
    /// `OXCCL_PROC_HEAP`: each rank's heap when ranks are processes (0:
    /// the default share of the device).
    pub heap_bytes: usize,
    /// `OXCCL_CUDA_PROCS`: force a path for ranks as processes.
    pub procs_path: Option<ProcsPath>,
    /// The device this process's rank runs on (ranks as processes). The C
    /// ABI sets the calling thread's current device, as NCCL does; `None`
    /// (the Rust default) places ranks of one host round-robin over the
    /// visible devices by their index among that host's ranks. Split and
    /// shrink give each child rank its parent's device.
    pub device: Option<i32>,
    /// Ranks known to share each device with a communicator's own: set on
    /// a split or shrunk child to its parent's ranks on the busiest device
    /// (not a setting; see `WorldConfig::co_resident`).
    pub co_resident: u32,
}

impl CudaSettings {
    /// Applies the settings every world takes (the heap is for ranks as
    /// processes only: their backend sets it).
    pub(crate) fn apply(&self, cfg: &mut WorldConfig) {
        cfg.launch_gate = self.launch_gate;
        cfg.relaunch = self.relaunch;
        cfg.block_smem = self.block_smem;
        cfg.co_resident = self.co_resident;
        cfg.cache_dir.clone_from(&self.cache_dir);
    }
}

/// When a long wait for peers warns: first after `first`, then every
/// `every` (10 s and a minute by default). The bootstrap's own type: the
/// rendezvous at init warns on the same schedule as a call's wait.
pub use oxccl_bootstrap::WaitWarn;
