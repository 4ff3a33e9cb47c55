//! CUDA ranks as processes of one host (issue 11): which GPU each rank
//! drives and which path its collectives take.
//!
//! Placement: a rank drives GPU `local % visible`, where `local` is its
//! index among the clique's ranks on its host (by rank), so launchers that
//! start one process per GPU get one GPU each and more processes than GPUs
//! share them round-robin (the testbed runs every rank on one H200).
//!
//! Path: every rank runs [`super::cuda_staged`] (host staging, no kernel
//! waits on another process), correct with and without MPS.

use std::sync::Arc;

use oxccl_bootstrap::Bootstrap;

use super::{Backend, BackendOptions};
use crate::error::Error;
use crate::init::map_bootstrap;

/// Where this rank runs: `(device ordinal, ranks of the clique on it)`.
pub(crate) fn placement(boot: &Bootstrap, visible: i32) -> (i32, u32) {
    let me = boot.rank() as usize;
    let descs = boot.descs();
    let host = &descs[me].host;
    let local: Vec<usize> = (0..descs.len())
        .filter(|&r| &descs[r].host == host)
        .collect();
    let visible = visible.max(1) as usize;
    let idx = local.iter().position(|&r| r == me).unwrap_or(0);
    let dev = idx % visible;
    let here = (0..local.len()).filter(|i| i % visible == dev).count();
    (dev as i32, here as u32)
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

/// The CUDA backend of this process's rank of a process clique.
pub(crate) fn create(boot: &Bootstrap, opts: &BackendOptions) -> Result<Arc<dyn Backend>, Error> {
    let info = oxccl_cuda::available().map_err(|e| Error::BackendUnavailable(e.to_string()))?;
    let (device, here) = placement(boot, info.devices.len() as i32);
    super::cuda_staged::create(boot, opts, device, here)
}
