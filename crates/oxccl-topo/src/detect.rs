//! Live detection: sysfs (NUMA nodes, the PCIe tree, link speeds, NICs)
//! and NVML (GPUs, compute capability, NVLinks and their remote ends).
//!
//! Every source is optional. A missing one is logged with `tracing::warn!`
//! and detection goes on with what the others give; on a machine without a
//! GPU the result is the host and its NUMA nodes with zero GPUs. NVML is
//! loaded at run time (`libnvidia-ml.so`), so the binary runs whether or
//! not the driver is installed.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path as FsPath, PathBuf};

use crate::graph::{
    norm_busid, preorder, Attrs, GpuInfo, NicInfo, Node, NodeId, NodeKind, Topology,
};

/// What NVML told us about one GPU.
#[derive(Clone, Debug)]
struct NvmlGpu {
    busid: String,
    device_id: u32,
    sm: u32,
    /// Remote bus id of each active link.
    links: Vec<String>,
}

fn read_trim(p: impl AsRef<FsPath>) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn nvml_gpus() -> Option<Vec<NvmlGpu>> {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("topology detection: NVML unavailable ({e}); GPUs come from sysfs only");
            return None;
        }
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("topology detection: NVML device count failed: {e}");
            return None;
        }
    };
    let mut out = Vec::new();
    for i in 0..count {
        let dev = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("topology detection: NVML device {i}: {e}");
                continue;
            }
        };
        let Ok(pci) = dev.pci_info() else {
            tracing::warn!("topology detection: NVML device {i}: no PCI info");
            continue;
        };
        let sm = dev
            .cuda_compute_capability()
            .map(|c| (c.major * 10 + c.minor).max(0) as u32)
            .unwrap_or(0);
        let mut links = Vec::new();
        // NVML numbers links from 0; 18 is the most any GPU has had.
        for l in 0..18 {
            let link = dev.link_wrapper_for(l);
            if link.is_active().unwrap_or(false) {
                if let Ok(r) = link.remote_pci_info() {
                    links.push(norm_busid(&r.bus_id));
                }
            }
        }
        out.push(NvmlGpu {
            busid: norm_busid(&pci.bus_id),
            device_id: pci.pci_device_id >> 16,
            sm,
            links,
        });
    }
    Some(out)
}

/// One PCI device from sysfs.
#[derive(Clone, Debug)]
struct SysPci {
    busid: String,
    class: u32,
    attrs: Attrs,
    numa: i64,
    /// Bus ids of the bridges above it, top first.
    bridges: Vec<String>,
}

fn sys_pci(root: &FsPath, busid: &str) -> Option<SysPci> {
    let dir = root.join("bus/pci/devices").join(busid);
    let class = read_trim(dir.join("class")).and_then(|c| crate::graph::parse_int(&c))? as u32;
    let mut attrs = Attrs::from_pairs(&[("busid", busid)]);
    attrs.set("class", format!("0x{class:06x}"));
    for (k, f) in [
        ("vendor", "vendor"),
        ("device", "device"),
        ("subsystem_vendor", "subsystem_vendor"),
        ("subsystem_device", "subsystem_device"),
        ("link_speed", "max_link_speed"),
        ("link_width", "max_link_width"),
    ] {
        let Some(v) = read_trim(dir.join(f)) else {
            continue;
        };
        // The XML reader requires these to be numbers; a value sysfs got
        // wrong is left out (as if absent) so the graph writes and reads back.
        let numeric = matches!(k, "vendor" | "device" | "link_width");
        if numeric && !v.is_empty() && crate::graph::parse_int(&v).is_none() {
            tracing::warn!("{busid}: {f}={v:?} is not a number; ignored");
            continue;
        }
        attrs.set(k, v);
    }
    let numa = read_trim(dir.join("numa_node"))
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or(-1);
    let real: PathBuf = fs::canonicalize(&dir).unwrap_or(dir);
    let mut bridges = Vec::new();
    for comp in real.components() {
        let c = comp.as_os_str().to_string_lossy();
        if c.len() == 12 && c.as_bytes()[4] == b':' && c != busid {
            let bclass = read_trim(root.join("bus/pci/devices").join(c.as_ref()).join("class"))
                .and_then(|x| crate::graph::parse_int(&x))
                .unwrap_or(0);
            if bclass >> 8 == 0x0604 {
                bridges.push(c.to_string());
            }
        }
    }
    Some(SysPci {
        busid: busid.to_string(),
        class,
        attrs,
        numa,
        bridges,
    })
}

fn cpu_attrs(root: &FsPath, numa: i64) -> Attrs {
    let mut a = Attrs::from_pairs(&[("numaid", &numa.to_string())]);
    if let Some(map) = read_trim(root.join(format!("devices/system/node/node{numa}/cpumap"))) {
        a.set("affinity", map);
    }
    a.set("arch", std::env::consts::ARCH);
    if let Some(info) = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .filter(|_| root == FsPath::new("/sys"))
    {
        let field = |name: &str| {
            info.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        };
        if let Some(v) = field("vendor_id") {
            a.set("vendor", v);
        }
        if let Some(v) = field("cpu family") {
            a.set("familyid", v);
        }
        if let Some(v) = field("model\t") {
            a.set("modelid", v);
        }
    }
    a
}

/// Detects the machine under a sysfs root (normally `/sys`; tests point
/// it at a fake tree), with or without NVML.
pub fn detect_with(sys_root: &FsPath, use_nvml: bool) -> Topology {
    detect_from(sys_root, if use_nvml { nvml_gpus() } else { None })
}

/// Detection from a sysfs root and what NVML reported (if it loaded).
fn detect_from(sys_root: &FsPath, nvml: Option<Vec<NvmlGpu>>) -> Topology {
    let mut numas: Vec<i64> = fs::read_dir(sys_root.join("devices/system/node"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("node")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    if numas.is_empty() {
        tracing::warn!("topology detection: no NUMA information in sysfs; assuming one node");
        numas.push(0);
    }
    numas.sort_unstable();
    let pci_dir = sys_root.join("bus/pci/devices");
    let mut devices: Vec<SysPci> = Vec::new();
    match fs::read_dir(&pci_dir) {
        Ok(rd) => {
            let mut ids: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect();
            ids.sort();
            for id in ids {
                if let Some(d) = sys_pci(sys_root, &id) {
                    let vendor = d.attrs.int("vendor").unwrap_or(0);
                    let gpu = d.class >> 16 == 0x03 && vendor == 0x10de;
                    let nic = d.class >> 16 == 0x02 && d.class >> 8 != 0x0280;
                    if gpu || nic {
                        devices.push(d);
                    }
                }
            }
        }
        Err(e) => tracing::warn!("topology detection: cannot read {}: {e}", pci_dir.display()),
    }
    // GPUs NVML knows but sysfs hides (some VMs): placed under NUMA node 0.
    if let Some(list) = &nvml {
        for g in list {
            if !devices.iter().any(|d| norm_busid(&d.busid) == g.busid) {
                let mut attrs = Attrs::from_pairs(&[("busid", &g.busid), ("class", "0x030200")]);
                attrs.set("vendor", "0x10de");
                attrs.set("device", format!("0x{:04x}", g.device_id));
                devices.push(SysPci {
                    busid: g.busid.clone(),
                    class: 0x030200,
                    attrs,
                    numa: -1,
                    bridges: Vec::new(),
                });
            }
        }
    }
    let mut nodes = vec![Node::new(NodeKind::Host, 0, None)];
    let mut cpu_of: BTreeMap<i64, NodeId> = BTreeMap::new();
    for &n in &numas {
        cpu_of.insert(n, nodes.len());
        nodes.push(Node {
            attrs: cpu_attrs(sys_root, n),
            ..Node::new(NodeKind::Cpu, 0, Some(0))
        });
    }
    let mut bridge_node: BTreeMap<String, NodeId> = BTreeMap::new();
    let mut gpu_dev = 0u32;
    for d in &devices {
        let numa = if cpu_of.contains_key(&d.numa) {
            d.numa
        } else {
            numas[0]
        };
        let mut parent = cpu_of[&numa];
        let mut prev_ids: Option<(String, String)> = None;
        for b in &d.bridges {
            let battrs = sys_pci(sys_root, b).map(|x| x.attrs).unwrap_or_default();
            let ids = (
                battrs.get("vendor").unwrap_or("").to_string(),
                battrs.get("device").unwrap_or("").to_string(),
            );
            // A switch shows as an upstream port with downstream ports of
            // the same vendor:device below it; count it once.
            if prev_ids.as_ref() == Some(&ids) {
                continue;
            }
            prev_ids = Some(ids);
            parent = *bridge_node.entry(b.clone()).or_insert_with(|| {
                nodes.push(Node {
                    attrs: battrs,
                    ..Node::new(NodeKind::PciSwitch, 0, Some(parent))
                });
                nodes.len() - 1
            });
        }
        let is_gpu = d.class >> 16 == 0x03;
        let mut node = Node {
            attrs: d.attrs.clone(),
            ..Node::new(
                if is_gpu { NodeKind::Gpu } else { NodeKind::Nic },
                0,
                Some(parent),
            )
        };
        if is_gpu {
            let info = nvml
                .as_ref()
                .and_then(|l| l.iter().find(|g| g.busid == norm_busid(&d.busid)));
            if let Some(g) = info {
                let mut per_target: BTreeMap<String, u32> = BTreeMap::new();
                for t in &g.links {
                    *per_target.entry(t.clone()).or_default() += 1;
                }
                let nvlinks = per_target
                    .into_iter()
                    .map(|(t, c)| {
                        let is_gpu = devices
                            .iter()
                            .any(|x| norm_busid(&x.busid) == t && x.class >> 16 == 0x03);
                        Attrs::from_pairs(&[
                            ("target", &t),
                            ("count", &c.to_string()),
                            ("tclass", if is_gpu { "0x030200" } else { "0x068000" }),
                        ])
                    })
                    .collect();
                node.gpu = Some(GpuInfo {
                    attrs: Attrs::from_pairs(&[
                        ("dev", &gpu_dev.to_string()),
                        ("sm", &g.sm.to_string()),
                    ]),
                    nvlinks,
                });
            }
            gpu_dev += 1;
        } else {
            node.nic = Some(nic_info(sys_root, &d.busid));
        }
        nodes.push(node);
    }
    let t = Topology::from_nodes(Attrs::from_pairs(&[("version", "1")]), preorder(nodes));
    if t.gpus().is_empty() {
        tracing::info!("topology detection: no GPU found");
    }
    t
}

fn nic_info(sys_root: &FsPath, busid: &str) -> NicInfo {
    let mut nets = Vec::new();
    let net_dir = sys_root.join("bus/pci/devices").join(busid).join("net");
    if let Ok(rd) = fs::read_dir(net_dir) {
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().to_string();
            let speed = read_trim(sys_root.join("class/net").join(&name).join("speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&s| s > 0);
            let mut a = Attrs::from_pairs(&[("name", &name)]);
            if let Some(s) = speed {
                a.set("speed", s.to_string());
            }
            nets.push(a);
        }
    }
    NicInfo {
        attrs: Attrs::default(),
        nets,
    }
}

impl Topology {
    /// Detects the live machine. Never panics: missing sources are logged
    /// and skipped.
    pub fn detect() -> Topology {
        detect_with(FsPath::new("/sys"), true)
    }

    /// The machine `file` describes (`OXCCL_TOPO_FILE`/`NCCL_TOPO_FILE`, as
    /// the facade read them), else [`Topology::detect`]. A file that cannot
    /// be read is logged and detection is used instead.
    pub fn from_file_or_detect(file: Option<&std::path::Path>) -> Topology {
        if let Some(path) = file.filter(|p| !p.as_os_str().is_empty()) {
            match Topology::from_xml_file(path) {
                Ok(t) => return t,
                Err(e) => tracing::warn!("{}: {e}; detecting instead", path.display()),
            }
        }
        Topology::detect()
    }
}

#[cfg(test)]
mod tests {
    use oxccl_core::{Algo, CollKind, Proto};

    use super::*;
    use crate::driver::{DriverFacts, DriverGpu, P2pFacts};
    use crate::paths::PathClass;
    use crate::select::Selector;

    /// A VM: NVML sees one H200 (device id 0x2335), sysfs has no PCI tree
    /// and no NUMA nodes.
    fn vm_one_gpu() -> Topology {
        let nvml = vec![NvmlGpu {
            busid: "0000:00:05.0".into(),
            device_id: 0x2335,
            sm: 90,
            links: Vec::new(),
        }];
        detect_from(FsPath::new("/nonexistent-sysfs-root"), Some(nvml))
    }

    #[test]
    fn vm_nvml_without_sysfs_four_ranks_on_one_gpu() {
        let t = vm_one_gpu();
        assert_eq!(t.gpus().len(), 1);
        assert_eq!(t.nodes[t.gpus()[0]].sm(), 90);
        let s = Selector::new(&t, &[0, 0, 0, 0]);
        for a in 0..4 {
            for b in 0..4 {
                assert_eq!(s.class_between(a, b), Some(PathClass::X), "{a}-{b}");
            }
        }
        assert_eq!(s.class_between(0, 4), None);
        assert_eq!(s.shape().nnodes, 1);
        assert_eq!(s.shape().ranks_per_node, 4);
        assert!(
            s.shape().direct_ok,
            "ranks on one GPU reach each other directly"
        );
        // Four ranks share one GPU's memory bandwidth.
        assert!(s.shape().intra_bw <= t.local_bw(t.gpus()[0]) / 4.0 + 1e-9);
        let protos = [Proto::Simple, Proto::LL];
        let small = s.choose(CollKind::AllReduce, 8, 4, &Algo::ALL, &protos);
        // Small: one direct step over shared memory, low-latency protocol.
        assert_eq!(
            (small.algo, small.proto),
            (Algo::OneShot, Proto::LL),
            "{small}"
        );
        assert!(small.us().is_finite() && small.us() > 0.0);
        let large = s.choose(CollKind::AllReduce, 1 << 30, 4, &Algo::ALL, &protos);
        assert_eq!(
            (large.algo, large.proto),
            (Algo::Ring, Proto::Simple),
            "{large}"
        );
        assert!(large.us() > small.us());
        // Every ring holds the four ranks.
        for r in s.rings() {
            let mut v = r.clone();
            v.sort_unstable();
            assert_eq!(v, vec![0, 1, 2, 3]);
        }
    }

    /// Same VM, and the driver confirms the GPU by bus id (different
    /// case, 8-digit domain): nothing is added.
    #[test]
    fn vm_driver_facts_match_nvml_gpu() {
        let mut t = vm_one_gpu();
        let facts = DriverFacts {
            devices: vec![DriverGpu {
                ordinal: 0,
                pci_bus_id: "00000000:00:05.0".into(),
                sm: (9, 0),
                name: "NVIDIA H200".into(),
                memory_bytes: 150_000_000_000,
                mem_bus_bits: 6144,
                mem_clock_khz: 3_201_000,
                sm_count: 132,
            }],
            p2p: vec![vec![P2pFacts {
                access_supported: false,
                native_atomics: false,
                performance_rank: 0,
            }]],
        };
        t.merge_driver_facts(&facts);
        assert_eq!(t.gpus().len(), 1);
        // The memory bandwidth comes from the bus width and clock: the
        // H200's measured copy rate (2015-2105 GB/s).
        let bw = t.local_bw(t.gpus()[0]);
        assert!((2050.0..2150.0).contains(&bw), "{bw}");
        let s = Selector::new(&t, &[0, 0]);
        assert_eq!(s.class_between(0, 1), Some(PathClass::X));
    }
}
