//! [`BootstrapSettings`]: what the rendezvous takes from the user's
//! settings. This crate never reads the environment: the facade reads
//! `NCCL_COMM_ID`, `OXCCL_COMM_SECRET`, `NCCL_SOCKET_IFNAME`,
//! `NCCL_SOCKET_FAMILY` and `NCCL_HOSTID` with its other settings and
//! passes them here.

use crate::iface::IfaceSettings;
use crate::DeviceInfo;

/// The bootstrap's settings (defaults: a fresh root in this process, any
/// interface, the machine's own identity).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootstrapSettings {
    /// `NCCL_COMM_ID=host:port`: every rank derives the id from this
    /// address and rank 0 runs the root there ([`crate::UniqueId::new_with`]).
    pub comm_id: Option<String>,
    /// `OXCCL_COMM_SECRET`: a secret every rank of the job shares, for the
    /// rendezvous to prove membership with.
    pub comm_secret: Option<String>,
    /// `NCCL_SOCKET_IFNAME`/`NCCL_SOCKET_FAMILY`: where listeners bind.
    pub iface: IfaceSettings,
    /// `OXCCL_HOSTID`/`NCCL_HOSTID`: replaces the machine's identity
    /// ([`crate::host_identity`]).
    pub host_id: Option<String>,
}

impl BootstrapSettings {
    /// This rank's [`DeviceInfo`] for `device` at `bus_id`, carrying the
    /// host identity and interface these settings name.
    pub fn device_info(&self, device: Option<i32>, bus_id: String) -> DeviceInfo {
        DeviceInfo {
            device,
            bus_id,
            host_id: self.host_id.clone(),
            iface: self.iface.clone(),
        }
    }
}
