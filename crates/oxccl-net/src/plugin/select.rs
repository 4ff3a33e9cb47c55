//! Which network a communicator uses, as NCCL chooses: the plugins
//! `NCCL_NET_PLUGIN` names (a comma-separated list; unset, the
//! `libnccl-net.so` the loader finds, if any; `none`, no plugin), each
//! loaded and initialised, then the built-in TCP transport; `NCCL_NET`
//! picks one of them by name, else the first that works. A plugin that
//! cannot be loaded, exports no supported version, fails `init` or has no
//! usable device is named in a WARN and skipped.

use std::sync::Arc;

use super::load::{open, NEWEST, OLDEST};
use super::net::PluginNet;
use crate::api::Net;
use crate::error::NetError;

/// The built-in transport's name, as `NCCL_NET` picks it.
pub const BUILT_IN: &str = "Socket";

/// What [`select`] chose, and what it warned about on the way.
#[derive(Debug)]
pub struct Selection {
    /// The plugin network to use; `None`: the built-in TCP transport.
    pub net: Option<Arc<PluginNet>>,
    /// Every WARN logged while choosing (each names its plugin).
    pub warnings: Vec<String>,
    /// Every network that could be used, by name, the chosen one among
    /// them (plugins in the order named, then the built-in one).
    pub available: Vec<String>,
}

/// Chooses the network for a communicator: `plugins` is `NCCL_NET_PLUGIN`
/// (`None`: unset), `want` is `NCCL_NET`, `comm_id` names the
/// communicator to plugins of v11 and later.
///
/// Fails only where `want` names no network that works here (NCCL's
/// behaviour too); every other problem falls back, with a WARN.
pub fn select(
    plugins: Option<&str>,
    want: Option<&str>,
    comm_id: u64,
) -> Result<Selection, NetError> {
    let mut warnings = Vec::new();
    let mut warn = |msg: String| {
        tracing::warn!("{msg}");
        warnings.push(msg);
    };
    let (entries, implicit): (Vec<&str>, bool) = match plugins.map(str::trim) {
        None | Some("") => (vec!["libnccl-net.so"], true),
        Some(s) if s.eq_ignore_ascii_case("none") => (Vec::new(), false),
        Some(s) => (
            s.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .collect(),
            false,
        ),
    };
    let mut nets: Vec<Arc<PluginNet>> = Vec::new();
    for entry in entries {
        let lib = match open(entry) {
            Ok(lib) => lib,
            Err(fail) if implicit && !fail.found => {
                tracing::info!(
                    "NET/Plugin: no plugin found ({fail}): using the built-in {BUILT_IN}"
                );
                continue;
            }
            Err(fail) => {
                warn(format!(
                    "NET/Plugin: could not load net plugin {entry:?} ({fail}); \
                     it is skipped, the built-in {BUILT_IN} transport remains"
                ));
                continue;
            }
        };
        let what = format!(
            "net plugin {entry:?} ({}, ncclNetPlugin_v{} of v{OLDEST} to v{NEWEST}, network {:?})",
            lib.path, lib.version, lib.name
        );
        match PluginNet::new(lib, comm_id) {
            Ok(net) if net.devices() == 0 => {
                warn(format!("NET/Plugin: {what} has no devices; it is skipped"));
            }
            Ok(net) => {
                // Connections use device 0, and oxccl's data is in host
                // memory.
                if !net.properties(0).is_ok_and(|p| p.ptr_host) {
                    warn(format!(
                        "NET/Plugin: {what} takes no host memory on device 0 (oxccl stages \
                         through host memory); it is skipped"
                    ));
                    continue;
                }
                tracing::info!("NET/Plugin: Loaded {what}");
                for d in 0..net.devices() {
                    if let Ok(p) = net.properties(d) {
                        tracing::info!(
                            "NET/{}: device {d}: {} (pci {}), {} Mb/s, latency {:?}, ptrSupport {}{}{}, maxRecvs {}, maxComms {}",
                            net.name(),
                            p.name,
                            p.pci_path.as_deref().unwrap_or("none"),
                            p.speed_mbps,
                            p.latency,
                            if p.ptr_host { "host" } else { "" },
                            if p.ptr_cuda { "|cuda" } else { "" },
                            if p.ptr_dmabuf { "|dmabuf" } else { "" },
                            p.max_recvs,
                            p.max_comms
                        );
                    }
                }
                nets.push(Arc::new(net));
            }
            Err(e) => warn(format!(
                "NET/Plugin: {what} could not be initialised ({e}); it is skipped, \
                 the built-in {BUILT_IN} transport remains"
            )),
        }
    }
    let mut available: Vec<String> = nets.iter().map(|n| n.name().to_string()).collect();
    available.push(BUILT_IN.to_string());
    let net = match want.map(str::trim).filter(|w| !w.is_empty()) {
        None => nets.first().cloned(),
        Some(w) if w.eq_ignore_ascii_case(BUILT_IN) => None,
        Some(w) => match nets.iter().find(|n| n.name().eq_ignore_ascii_case(w)) {
            Some(n) => Some(n.clone()),
            None => {
                return Err(NetError::InvalidArgument(format!(
                    "NCCL_NET={w:?} names no network here (available: {}){}",
                    available.join(", "),
                    if warnings.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", warnings.join("; "))
                    }
                )))
            }
        },
    };
    Ok(Selection {
        net,
        warnings,
        available,
    })
}
