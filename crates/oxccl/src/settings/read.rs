//! Reading the tree from a lookup: each variable of [`super::SETTINGS`]
//! parsed into its typed place, errors naming the variable.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use oxccl_bootstrap::iface::IfaceSettings;
use oxccl_bootstrap::BootstrapSettings;
use oxccl_cuda::GateMode;
use oxccl_host::SocketSettings;

use crate::backend::BackendKind;
use crate::config::{
    parse_algo_filter, parse_bool, parse_bytes, parse_positive, parse_proto_filter, parse_size,
    Config, CudaSettings, DebugLevel, HostSettings, ProcsPath, NO_DEADLINE,
};
use crate::error::{Error, Result};

type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

/// `ox`'s value, else its NCCL twin's, with the name that was set.
fn pick(
    get: Get<'_>,
    ox: &'static str,
    nccl: Option<&'static str>,
) -> Option<(&'static str, String)> {
    get(ox)
        .map(|v| (ox, v))
        .or_else(|| nccl.and_then(|n| get(n).map(|v| (n, v))))
}

/// As [`pick`], an empty value counting as unset.
fn pick_set(
    get: Get<'_>,
    ox: &'static str,
    nccl: Option<&'static str>,
) -> Option<(&'static str, String)> {
    let set = |k: &'static str| get(k).filter(|v| !v.trim().is_empty()).map(|v| (k, v));
    set(ox).or_else(|| nccl.and_then(set))
}

fn bad(var: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        var: var.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// The whole tree from `get`.
pub(super) fn config(get: Get<'_>) -> Result<Config> {
    let mut c = facade(get)?;
    c.push_group = push_group(get);
    c.p2p_direct = get("OXCCL_P2P_DIRECT").is_none_or(|v| v.trim() != "0");
    c.host = host(get)?;
    c.cuda = cuda(get)?;
    c.bootstrap = bootstrap(get)?;
    c.topology_file =
        pick_set(get, "OXCCL_TOPO_FILE", Some("NCCL_TOPO_FILE")).map(|(_, v)| PathBuf::from(v));
    c.trace = trace(get)?;
    Ok(c)
}

/// What the builder also sets: filters, channels, deadline, chunk,
/// backend, the call check, logging.
fn facade(get: Get<'_>) -> Result<Config> {
    let mut c = Config::default();
    if let Some((var, v)) = pick(get, "OXCCL_ALGO", Some("NCCL_ALGO")) {
        c.algo = parse_algo_filter(var, &v)?;
    }
    if let Some((var, v)) = pick(get, "OXCCL_PROTO", Some("NCCL_PROTO")) {
        c.proto = parse_proto_filter(var, &v)?;
    }
    if let Some((var, v)) = pick(get, "OXCCL_CHANNELS", Some("NCCL_MAX_NCHANNELS")) {
        c.channels = Some(parse_positive(var, &v)?);
    }
    if let Some((var, v)) = pick(get, "OXCCL_DEADLINE_MS", None) {
        c.deadline = match v.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "none" => NO_DEADLINE,
            _ => Duration::from_millis(
                parse_positive(var, &v)
                    .map_err(|_| {
                        bad(
                            var,
                            &v,
                            "expected milliseconds (1 to 4294967295), or 0, off or none for no deadline",
                        )
                    })?
                    .into(),
            ),
        };
    }
    if let Some((var, v)) = pick(get, "OXCCL_WAIT_WARN_MS", None) {
        c.wait_warn.first = Duration::from_millis(parse_positive(var, &v)?.into());
    }
    if let Some((var, v)) = pick(get, "OXCCL_WAIT_WARN_EVERY_MS", None) {
        c.wait_warn.every = Duration::from_millis(parse_positive(var, &v)?.into());
    }
    if let Some((var, v)) = pick(get, "OXCCL_CHUNK_BYTES", None) {
        c.chunk_bytes = Some(parse_bytes(var, &v)?);
    }
    if let Some((var, v)) = pick(get, "OXCCL_LL1_BYTES", None) {
        c.ll1_bytes = crate::config::parse_size(&v).map_err(|reason| bad(var, &v, reason))?;
    }
    if let Some((var, v)) = pick(get, "OXCCL_BACKEND", None) {
        c.backend =
            BackendKind::from_str(&v).map_err(|_| bad(var, &v, "expected host, cuda or auto"))?;
    }
    if let Some((var, v)) = pick(get, "OXCCL_CHECK_CALLS", None) {
        let all = v.trim().eq_ignore_ascii_case("all");
        c.check_calls = all
            || parse_bool(var, &v).map_err(|_| {
                bad(
                    var,
                    &v,
                    "expected 1 or 0 (true/false, on/off, yes/no), or all (across hosts too)",
                )
            })?;
        c.check_calls_across_hosts = all;
    }
    if let Some((var, v)) = pick(get, "OXCCL_DEBUG", Some("NCCL_DEBUG")) {
        c.debug = Some(DebugLevel::parse(var, &v)?);
    }
    if let Some((var, v)) = pick_set(get, "OXCCL_DEBUG_SUBSYS", Some("NCCL_DEBUG_SUBSYS")) {
        c.debug_subsys = crate::config::Subsystems::parse(var, &v)?;
    }
    if let Some((var, v)) = pick(get, "OXCCL_DETERMINISTIC", None) {
        c.deterministic = parse_bool(var, &v)?;
    }
    Ok(c)
}

/// `OXCCL_TRACE` (a path; empty is off) and `OXCCL_TRACE_CALLS`.
fn trace(get: Get<'_>) -> Result<Option<crate::config::TraceSettings>> {
    let Some((_, path)) = pick_set(get, "OXCCL_TRACE", None) else {
        return Ok(None);
    };
    let calls = match pick(get, "OXCCL_TRACE_CALLS", None) {
        Some((var, v)) => parse_positive(var, &v)? as usize,
        None => crate::config::DEFAULT_TRACE_CALLS,
    };
    Ok(Some(crate::config::TraceSettings {
        path: PathBuf::from(path),
        calls,
    }))
}

/// `OXCCL_PUSH_GROUP`: a count of at least 1; anything else is ignored
/// with a warning (an experiment knob).
fn push_group(get: Get<'_>) -> Option<usize> {
    let v = get("OXCCL_PUSH_GROUP")?;
    match v.trim().parse::<usize>() {
        Ok(g) if g >= 1 => Some(g),
        _ => {
            tracing::warn!("OXCCL_PUSH_GROUP={v:?} is not a count of at least 1: ignored");
            None
        }
    }
}

fn net_err(e: oxccl_host::NetError) -> Error {
    match e {
        oxccl_host::NetError::Config(b) => bad(b.var, &b.value, b.reason),
        e => Error::Config {
            var: "network settings".into(),
            value: String::new(),
            reason: e.to_string(),
        },
    }
}

/// A 0/1 flag.
fn flag(get: Get<'_>, ox: &'static str, nccl: Option<&'static str>) -> Result<Option<bool>> {
    match pick_set(get, ox, nccl) {
        None => Ok(None),
        Some((var, v)) => match v.trim() {
            "1" => Ok(Some(true)),
            "0" => Ok(Some(false)),
            _ => Err(bad(var, &v, "expected 0 or 1")),
        },
    }
}

fn host(get: Get<'_>) -> Result<HostSettings> {
    let max = oxccl_host::MAX_NET_CHANNELS;
    let net_channels = match get("OXCCL_NET_CHANNELS") {
        None => None,
        Some(v) => Some(
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    bad(
                        "OXCCL_NET_CHANNELS",
                        &v,
                        format!("expected an integer from 1 to {max}"),
                    )
                })?,
        ),
    };
    let p2p_off = flag(get, "OXCCL_P2P_DISABLE", Some("NCCL_P2P_DISABLE"))?.unwrap_or(false);
    let shm_off = flag(get, "OXCCL_SHM_DISABLE", Some("NCCL_SHM_DISABLE"))?.unwrap_or(false);
    Ok(HostSettings {
        net_channels,
        net_send_by_reference: flag(get, "OXCCL_NET_SEND_BY_REF", None)?,
        net_receive_in_place: flag(get, "OXCCL_NET_RECV_IN_PLACE", None)?,
        sockets: SocketSettings::from_vars(get).map_err(net_err)?,
        force_network: p2p_off && shm_off,
        net_plugin: text(get, "NCCL_NET_PLUGIN"),
        net_name: text(get, "NCCL_NET"),
    })
}

/// A variable's value, trimmed; `None` where unset or blank.
fn text(get: Get<'_>, var: &str) -> Option<String> {
    get(var)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn cuda(get: Get<'_>) -> Result<CudaSettings> {
    let block_smem = match get("OXCCL_BLOCK_SMEM") {
        None => 0,
        Some(v) => v.trim().parse::<u32>().unwrap_or_else(|_| {
            tracing::warn!("OXCCL_BLOCK_SMEM={v:?} is not a byte count: 0");
            0
        }),
    };
    let heap_bytes = match get("OXCCL_PROC_HEAP").as_deref().map(str::trim) {
        None | Some("") => 0,
        Some(v) => parse_size(v)
            .and_then(|b| match b {
                0 => Err("must be at least 1".into()),
                b => Ok(b),
            })
            .map_err(|reason| bad("OXCCL_PROC_HEAP", v, reason))?,
    };
    let procs_path = match get("OXCCL_CUDA_PROCS").as_deref().map(str::trim) {
        None | Some("") => None,
        Some("device") => Some(ProcsPath::Device),
        Some("staged") => Some(ProcsPath::Staged),
        Some(v) => return Err(bad("OXCCL_CUDA_PROCS", v, "expected device or staged")),
    };
    Ok(CudaSettings {
        relaunch: flag(get, "OXCCL_RELAUNCH", None)?.unwrap_or(false),
        launch_gate: GateMode::parse(get("OXCCL_LAUNCH_GATE").as_deref()),
        block_smem,
        cache_dir: get("OXCCL_CACHE_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from),
        heap_bytes,
        procs_path,
        // Not variables: the caller's choice (the builder, the C ABI's
        // current device), and what a parent tells its split children.
        co_resident: 0,
        device: None,
    })
}

fn bootstrap(get: Get<'_>) -> Result<BootstrapSettings> {
    let iface = IfaceSettings::parse(
        get("NCCL_SOCKET_IFNAME").as_deref(),
        get("NCCL_SOCKET_FAMILY").as_deref(),
    )
    .map_err(crate::error::map_bootstrap)?;
    Ok(BootstrapSettings {
        comm_id: get("NCCL_COMM_ID").filter(|v| !v.is_empty()),
        comm_secret: get("OXCCL_COMM_SECRET").filter(|v| !v.is_empty()),
        iface,
        host_id: pick_set(get, "OXCCL_HOSTID", Some("NCCL_HOSTID"))
            .map(|(_, v)| v.trim().to_string()),
        // `Config::wait_warn` decides (`Config::bootstrap_settings`).
        ..BootstrapSettings::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_bootstrap::env::from_pairs;

    fn read(pairs: &[(&str, &str)]) -> Result<Config> {
        config(&from_pairs(pairs))
    }

    #[test]
    fn every_branch_takes_its_variables() {
        let c = read(&[
            ("OXCCL_NET_CHANNELS", "7"),
            ("OXCCL_NET_SEND_BY_REF", "0"),
            ("NCCL_SOCKET_NTHREADS", "3"),
            ("NCCL_P2P_DISABLE", "1"),
            ("OXCCL_SHM_DISABLE", "1"),
            ("OXCCL_LAUNCH_GATE", "on"),
            ("OXCCL_RELAUNCH", "1"),
            ("OXCCL_BLOCK_SMEM", "4096"),
            ("OXCCL_CACHE_DIR", "/tmp/k"),
            ("OXCCL_PROC_HEAP", "1G"),
            ("OXCCL_CUDA_PROCS", "staged"),
            ("NCCL_COMM_ID", "127.0.0.1:29500"),
            ("OXCCL_COMM_SECRET", "s3"),
            ("NCCL_SOCKET_IFNAME", "^docker"),
            ("NCCL_SOCKET_FAMILY", "AF_INET"),
            ("NCCL_HOSTID", "a"),
            ("OXCCL_HOSTID", " b "),
            ("NCCL_TOPO_FILE", "/n.xml"),
            ("OXCCL_TOPO_FILE", "/o.xml"),
            ("OXCCL_PUSH_GROUP", "16"),
            ("OXCCL_P2P_DIRECT", "0"),
            ("NCCL_NET_PLUGIN", " ofi,/opt/p/libx.so "),
            ("NCCL_NET", "AWS Libfabric"),
        ])
        .unwrap();
        assert_eq!(c.host.net_channels, Some(7));
        assert_eq!(c.host.net_plugin.as_deref(), Some("ofi,/opt/p/libx.so"));
        assert_eq!(c.host.net_name.as_deref(), Some("AWS Libfabric"));
        let hc = c.host.apply(oxccl_host::HostConfig::default());
        assert_eq!(hc.net_plugin.as_deref(), Some("ofi,/opt/p/libx.so"));
        assert_eq!(hc.net_name.as_deref(), Some("AWS Libfabric"));
        assert_eq!(c.host.net_send_by_reference, Some(false));
        assert_eq!(c.host.net_receive_in_place, None);
        assert_eq!(c.host.sockets.nthreads, Some(3));
        assert!(c.host.force_network);
        assert_eq!(c.cuda.launch_gate, GateMode::On);
        assert!(c.cuda.relaunch);
        assert_eq!(c.cuda.block_smem, 4096);
        assert_eq!(c.cuda.cache_dir, Some(PathBuf::from("/tmp/k")));
        assert_eq!(c.cuda.heap_bytes, 1 << 30);
        assert_eq!(c.cuda.procs_path, Some(ProcsPath::Staged));
        assert_eq!(c.bootstrap.comm_id.as_deref(), Some("127.0.0.1:29500"));
        assert_eq!(c.bootstrap.comm_secret.as_deref(), Some("s3"));
        assert_eq!(c.bootstrap.iface.ifname.as_deref(), Some("^docker"));
        assert_eq!(
            c.bootstrap.iface.family,
            Some(oxccl_bootstrap::iface::Family::V4)
        );
        assert_eq!(c.bootstrap.host_id.as_deref(), Some("b"));
        assert_eq!(c.topology_file, Some(PathBuf::from("/o.xml")));
        assert_eq!(c.push_group, Some(16));
        assert!(!c.p2p_direct);
    }

    #[test]
    fn blank_plugin_settings_are_unset() {
        let c = read(&[("NCCL_NET_PLUGIN", "  "), ("NCCL_NET", "")]).unwrap();
        assert_eq!((c.host.net_plugin, c.host.net_name), (None, None));
    }

    #[test]
    fn defaults_and_half_set_pairs() {
        let c = read(&[
            ("NCCL_P2P_DISABLE", "1"),
            ("OXCCL_TOPO_FILE", ""),
            ("NCCL_TOPO_FILE", "/n.xml"),
        ])
        .unwrap();
        // One of the two is not enough to force the network.
        assert!(!c.host.force_network);
        // An empty value is no value: the twin applies.
        assert_eq!(c.topology_file, Some(PathBuf::from("/n.xml")));
        let d = read(&[]).unwrap();
        assert_eq!(d.host, HostSettings::default());
        assert_eq!(d.cuda, CudaSettings::default());
        assert_eq!(d.bootstrap, BootstrapSettings::default());
        assert!(d.p2p_direct && d.push_group.is_none() && d.topology_file.is_none());
        assert!(!d.deterministic);
        assert!(read(&[("OXCCL_DETERMINISTIC", "1")]).unwrap().deterministic);
        assert!(
            !read(&[("OXCCL_DETERMINISTIC", "off")])
                .unwrap()
                .deterministic
        );
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (k, v) in [
            ("OXCCL_NET_CHANNELS", "0"),
            ("OXCCL_NET_CHANNELS", "33"),
            ("OXCCL_NET_RECV_IN_PLACE", "yes please"),
            ("NCCL_SHM_DISABLE", "2"),
            ("NCCL_SOCKET_NTHREADS", "17"),
            ("OXCCL_NSOCKS_PERTHREAD", "0"),
            ("OXCCL_PROC_HEAP", "0"),
            ("OXCCL_PROC_HEAP", "lots"),
            ("OXCCL_CUDA_PROCS", "gpu"),
            ("OXCCL_DETERMINISTIC", "2"),
            ("NCCL_SOCKET_FAMILY", "AF_UNIX"),
        ] {
            match read(&[(k, v)]) {
                Err(Error::Config { var, .. }) => assert_eq!(var, k, "{k}={v}"),
                other => panic!("{k}={v}: {other:?}"),
            }
        }
    }
}
