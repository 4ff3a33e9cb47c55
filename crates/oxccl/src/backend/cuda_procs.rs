//! CUDA ranks as processes of one host: which GPU each rank
//! drives and which path its collectives take.
//!
//! Placement ([`super::placement`]): a rank drives the device it named
//! (`CudaSettings::device`: the C ABI names the calling thread's current
//! device, as NCCL), else GPU `local % visible`, where `local` is its
//! index among the clique's ranks on its host (by rank), so launchers that
//! start one process per GPU get one GPU each and more processes than GPUs
//! share them round-robin (the testbed runs every rank on one H200).
//!
//! Path: kernels of two processes that spin on each other's counters make
//! progress together only if they run at once: with MPS, or on different
//! GPUs. Without MPS, processes sharing a GPU are time-sliced (4.5 ms per
//! round trip measured on the H200, against 0.71 µs with MPS). So:
//!
//! - `device`: the in-process executor over links shared by IPC
//!   ([`super::cuda::create_procs`]), when MPS is active on every rank
//!   or no GPU holds two ranks;
//! - `staged`: otherwise ([`super::cuda_staged`]: buffers staged through
//!   host memory, the plan on the host backend; no kernel waits on another
//!   process). The selector sees the host backend's costs there.
//!
//! `OXCCL_CUDA_PROCS=device|staged` forces a path (for measuring both);
//! every rank states its choice in one all-gather and `device` is taken
//! only if all chose it. If sharing the links fails on any rank, every
//! rank falls back to `staged` together.

use std::sync::Arc;

use oxccl_bootstrap::Bootstrap;

use super::{Backend, BackendOptions};
use crate::config::branches::ProcsPath;
use crate::error::map_bootstrap;
use crate::error::Error;

/// Where every rank runs: `(device ordinal, ranks of its host on it)`,
/// from each rank's named device (one all-gather) and its host.
fn placements(boot: &Bootstrap, mine: Option<i32>, visible: i32) -> Result<Vec<(i32, u32)>, Error> {
    let all = boot
        .all_gather(&mine.unwrap_or(-1).to_le_bytes())
        .map_err(map_bootstrap)?;
    let descs = boot.descs();
    let asks = all
        .iter()
        .zip(descs.iter())
        .enumerate()
        .map(|(r, (b, d))| {
            let dev = <[u8; 4]>::try_from(b.as_slice()).map_err(|_| {
                Error::Bootstrap(format!(
                    "rank {r} sent a device record of {} bytes",
                    b.len()
                ))
            })?;
            let dev = i32::from_le_bytes(dev);
            Ok(super::placement::Ask {
                host: d.host.as_str(),
                device: (dev >= 0).then_some(dev),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(super::placement::place(&asks, visible)?
        .into_iter()
        .map(|p| (p.device, p.sharing))
        .collect())
}

/// Whether every rank can use CUDA: each says so in one all-gather, so all
/// decide alike. `Err` names the first rank that cannot (with its reason)
/// when `required`; otherwise any such rank makes it `Ok(false)`.
pub(crate) fn every_rank_has_cuda(boot: &Bootstrap, required: bool) -> Result<bool, Error> {
    let mine = match oxccl_cuda::available() {
        Ok(_) => Vec::new(),
        Err(e) => {
            let mut m = e.to_string().into_bytes();
            m.truncate(512);
            m.insert(0, b'!');
            m
        }
    };
    let all = boot.all_gather(&mine).map_err(map_bootstrap)?;
    match all.iter().position(|m| !m.is_empty()) {
        None => Ok(true),
        Some(r) if required => Err(Error::BackendUnavailable(format!(
            "rank {r} of {} has no usable CUDA device: {}",
            all.len(),
            String::from_utf8_lossy(&all[r][1..])
        ))),
        Some(_) => Ok(false),
    }
}

/// The variable that forces a path.
pub const PATH_VAR: &str = "OXCCL_CUDA_PROCS";

/// Whether an MPS control daemon serves this process: its pipe directory
/// (`CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`) names a live
/// daemon in `nvidia-cuda-mps-control.pid` (the `control` socket stays
/// behind after the daemon quits: seen on the H200), or, without a pid
/// file, has a `control` socket. Clients connect through that directory,
/// so a daemon elsewhere does not serve us.
pub fn mps_active() -> bool {
    let dir = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "/tmp/nvidia-mps".into());
    mps_serves(std::path::Path::new(&dir))
}

fn mps_serves(dir: &std::path::Path) -> bool {
    match std::fs::read_to_string(dir.join("nvidia-cuda-mps-control.pid")) {
        Ok(pid) => pid
            .trim()
            .parse::<u32>()
            .is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists()),
        Err(_) => dir.join("control").exists(),
    }
}

/// This rank's wish: `device` (true) or `staged`, as [`PATH_VAR`] asked
/// (`asked`), else from MPS and whether its GPU is shared. Over the network
/// (ranks on several hosts, or `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`)
/// only `staged` carries the data, through the host backend's network
/// transport: the device path's IPC links work within one host only and
/// would bypass the transport the user forced.
fn wish(
    asked: Option<ProcsPath>,
    shared_gpu: bool,
    mps: bool,
    network: bool,
) -> Result<bool, Error> {
    match asked.map(|p| p == ProcsPath::Device) {
        Some(true) if network => Err(Error::Config {
            var: PATH_VAR.into(),
            value: "device".into(),
            reason: "the ranks talk over the network (ranks on several hosts, or \
                     NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), which only the staged path uses"
                .into(),
        }),
        _ if network => Ok(false),
        Some(d) => Ok(d),
        None => Ok(!shared_gpu || mps),
    }
}

/// The CUDA backend of this process's rank of a process clique.
pub(crate) fn create(boot: &Bootstrap, opts: &BackendOptions) -> Result<Arc<dyn Backend>, Error> {
    let info = oxccl_cuda::available().map_err(|e| Error::BackendUnavailable(e.to_string()))?;
    let visible = info.devices.len() as i32;
    let places = placements(boot, opts.cuda.device, visible)?;
    let (device, here) = places[boot.rank() as usize];
    let any_shared = places.iter().any(|p| p.1 > 1);
    let network = oxccl_host::HostFabric::network_wanted(boot, opts.host.force_network);
    let mine = wish(opts.cuda.procs_path, any_shared, mps_active(), network);
    let all = boot
        .all_gather(&[u8::from(*mine.as_ref().unwrap_or(&false))])
        .map_err(map_bootstrap)?;
    mine?;
    if all.iter().all(|v| v.as_slice() == [1]) {
        let devices = places.iter().map(|p| p.0).collect();
        match super::cuda::create_procs(boot, opts, devices) {
            Ok(b) => return Ok(b),
            Err(e) => tracing::warn!(
                rank = boot.rank(),
                error = %e,
                "oxccl: sharing links between processes failed; staging through host memory"
            ),
        }
    }
    super::cuda_staged::create(boot, opts, device, here)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_takes_the_staged_path() {
        use ProcsPath::{Device, Staged};
        // (asked, shared GPU, MPS, network) -> device?
        for (asked, shared, mps, want) in [
            (None, false, false, true),
            (None, true, false, false),
            (None, true, true, true),
            (Some(Staged), false, true, false),
            (Some(Device), true, false, true),
        ] {
            assert_eq!(
                wish(asked, shared, mps, false).unwrap(),
                want,
                "{asked:?} {shared} {mps}"
            );
            // Over the network: staged, whatever MPS or the GPUs say.
            if asked != Some(Device) {
                assert!(
                    !wish(asked, shared, mps, true).unwrap(),
                    "{asked:?} {shared} {mps}"
                );
            }
        }
        let e = wish(Some(Device), false, true, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("network") && e.contains(PATH_VAR), "{e}");
    }

    #[test]
    fn mps_is_active_only_with_a_live_daemon() {
        let dir = std::env::temp_dir().join(format!("oxccl-mps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!mps_serves(&dir), "empty directory");
        std::fs::write(dir.join("control"), b"").unwrap();
        assert!(mps_serves(&dir), "a control socket and no pid file");
        let pid = dir.join("nvidia-cuda-mps-control.pid");
        std::fs::write(&pid, format!("{}\n", std::process::id())).unwrap();
        assert!(mps_serves(&dir), "a live daemon");
        std::fs::write(&pid, "999999999\n").unwrap();
        assert!(!mps_serves(&dir), "a daemon that quit left its files");
        std::fs::write(&pid, "garbage").unwrap();
        assert!(!mps_serves(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
