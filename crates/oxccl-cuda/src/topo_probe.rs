//! The CUDA driver's part of topology detection: device ordinals, PCI bus
//! ids, compute capability and peer-to-peer capability, handed to
//! `oxccl-topo` as plain data ([`oxccl_topo::DriverFacts`]).
//!
//! Nothing here creates a context: every query is a device query, valid
//! after `cuInit`.

use std::ffi::{c_char, c_int, CStr};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice_P2PAttribute as P2p, CUdevice_attribute as A};
use oxccl_topo::{DriverFacts, DriverGpu, P2pFacts, Topology};

use crate::driver::{self, guarded};
use crate::error::{CudaError, Result};

/// Reads every visible device and every ordered pair's P2P attributes.
/// Without a driver (or with a driver that fails) returns the error; never
/// panics (cudarc's panics on missing symbols are contained).
pub fn driver_facts() -> Result<DriverFacts> {
    let n = driver::device_count()?;
    guarded("topology probe", || {
        let devs = (0..n)
            .map(|i| result::device::get(i).map_err(|e| CudaError::driver("cuDeviceGet", e)))
            .collect::<Result<Vec<_>>>()?;
        let devices = devs
            .iter()
            .enumerate()
            .map(|(i, &d)| describe(i as u32, d))
            .collect::<Result<Vec<_>>>()?;
        let p2p = devs
            .iter()
            .map(|&a| devs.iter().map(|&b| pair(a, b)).collect())
            .collect::<Result<Vec<Vec<_>>>>()?;
        Ok(DriverFacts { devices, p2p })
    })
}

/// [`Topology::from_file_or_detect`] (`file`: the facade's
/// `OXCCL_TOPO_FILE`/`NCCL_TOPO_FILE`, else sysfs and NVML) with the
/// driver's facts merged in. Without a usable driver the topology is
/// returned as detected, with a warning.
pub fn detect_topology(file: Option<&std::path::Path>) -> Topology {
    let mut t = Topology::from_file_or_detect(file);
    match driver_facts() {
        Ok(f) => t.merge_driver_facts(&f),
        Err(e) => tracing::warn!(
            "topology detection: CUDA driver not used ({e}); ordinals and peer access unknown"
        ),
    }
    t
}

fn describe(ordinal: u32, dev: sys::CUdevice) -> Result<DriverGpu> {
    let attr = |a: A| {
        // SAFETY: `dev` came from cuDeviceGet after cuInit.
        unsafe { result::device::get_attribute(dev, a) }
            .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))
    };
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let name =
        result::device::get_name(dev).map_err(|e| CudaError::driver("cuDeviceGetName", e))?;
    // SAFETY: as above.
    let memory = unsafe { result::device::total_mem(dev) }
        .map_err(|e| CudaError::driver("cuDeviceTotalMem", e))?;
    Ok(DriverGpu {
        ordinal,
        pci_bus_id: bus_id(dev)?,
        sm: (major.max(0) as u32, minor.max(0) as u32),
        name,
        memory_bytes: memory as u64,
        mem_bus_bits: attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?.max(0) as u32,
        mem_clock_khz: attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?.max(0) as u32,
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32,
    })
}

/// `cuDeviceGetPCIBusId`: `domain:bus:device.function`.
fn bus_id(dev: sys::CUdevice) -> Result<String> {
    // 13 characters and a NUL is the documented minimum; leave room for
    // an 8-digit domain.
    let mut buf = [0 as c_char; 32];
    // SAFETY: `buf` is writable for the length passed; `dev` is valid.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) }
        .result()
        .map_err(|e| CudaError::driver("cuDeviceGetPCIBusId", e))?;
    let last = buf.len() - 1;
    buf[last] = 0;
    // SAFETY: `buf` is NUL-terminated (forced just above) and lives across the call.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().into_owned())
}

/// P2P attributes from `a` to `b` (all false on the diagonal, which the
/// driver refuses to answer for).
fn pair(a: sys::CUdevice, b: sys::CUdevice) -> Result<P2pFacts> {
    if a == b {
        return Ok(P2pFacts {
            access_supported: false,
            native_atomics: false,
            performance_rank: 0,
        });
    }
    let get = |attr: P2p| -> Result<c_int> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; both devices are valid and distinct.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, a, b) }
            .result()
            .map_err(|e| CudaError::driver("cuDeviceGetP2PAttribute", e))?;
        Ok(v)
    };
    Ok(P2pFacts {
        access_supported: get(P2p::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
        native_atomics: get(P2p::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        performance_rank: get(P2p::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a GPU machine the driver's facts are coherent and merged into
    /// the live topology. Without a driver it skips (and fails under
    /// `OXCCL_REQUIRE_GPU=1`); only then is the live machine left unread.
    #[test]
    fn probe_or_skip() {
        let Some(f) = crate::device::skip_or_fail("probe_or_skip", driver_facts()) else {
            return;
        };
        let t = detect_topology(None);
        assert_eq!(t.nhosts(), 1);
        let n = f.devices.len();
        assert_eq!(f.p2p.len(), n);
        for (i, d) in f.devices.iter().enumerate() {
            assert_eq!(d.ordinal as usize, i);
            assert_eq!(d.pci_bus_id.matches(':').count(), 2, "{}", d.pci_bus_id);
            assert!(d.sm.0 >= 3 && d.memory_bytes > 0);
            assert_eq!(f.p2p[i].len(), n);
        }
        // Every visible device is in the merged topology, by ordinal.
        assert!(t.gpus().len() >= n);
        let g = t.gpus();
        for d in &f.devices {
            let node = &t.nodes[g[d.ordinal as usize]];
            assert_eq!(
                node.busid(),
                Some(oxccl_topo::graph::norm_busid(&d.pci_bus_id))
            );
        }
    }
}
