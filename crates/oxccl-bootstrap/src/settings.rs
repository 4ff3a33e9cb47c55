//! [`BootstrapSettings`]: what the rendezvous takes from the user's
//! settings. This crate never reads the environment: the facade reads
//! `NCCL_COMM_ID`, `OXCCL_COMM_SECRET`, `NCCL_SOCKET_IFNAME`,
//! `NCCL_SOCKET_FAMILY` and `NCCL_HOSTID` with its other settings and
//! passes them here.

use std::time::Duration;

use crate::iface::IfaceSettings;
use crate::DeviceInfo;

/// When a rendezvous still waiting for ranks says so on stderr (the
/// facade's `OXCCL_WAIT_WARN_MS` and `OXCCL_WAIT_WARN_EVERY_MS`): first
/// after `first`, then every `every`, naming the ranks not yet joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitWarn {
    pub first: Duration,
    pub every: Duration,
}

impl WaitWarn {
    /// Says `msg` as a WARN where tracing shows warnings, else on stderr:
    /// a wait with no deadline must never be silent.
    pub(crate) fn say(msg: &str) {
        if tracing::enabled!(tracing::Level::WARN) {
            tracing::warn!("{msg}");
        } else {
            eprintln!("oxccl WARN {msg}");
        }
    }
}

impl Default for WaitWarn {
    /// 10 s, then every minute.
    fn default() -> WaitWarn {
        WaitWarn {
            first: Duration::from_secs(10),
            every: Duration::from_secs(60),
        }
    }
}

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
    /// When a root still waiting for ranks warns.
    pub wait_warn: WaitWarn,
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
            wait_warn: self.wait_warn,
        }
    }
}
