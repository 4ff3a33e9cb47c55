//! What the CUDA driver says about the GPUs, as plain data, and how it is
//! merged into a detected [`Topology`].
//!
//! This crate has no unsafe code and does not link the driver: the CUDA
//! backend (`oxccl_cuda::driver_facts`) fills a [`DriverFacts`] and calls
//! [`Topology::merge_driver_facts`]. Tests build facts by hand.
//!
//! The driver is the authority on three things NVML and sysfs cannot give:
//! the CUDA ordinal of each GPU (which `CUDA_VISIBLE_DEVICES` reorders and
//! filters), GPUs hidden from both (some containers and VMs), and whether
//! two GPUs can reach each other peer to peer at all.

use std::collections::BTreeMap;

use crate::graph::{
    norm_busid, preorder, Attrs, GpuInfo, Node, NodeId, NodeKind, Topology, MEM_PEAK_ATTR,
    P2P_BLOCKED_ATTR,
};

/// One device as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverGpu {
    /// CUDA device ordinal (`cuDeviceGet`), after `CUDA_VISIBLE_DEVICES`.
    pub ordinal: u32,
    /// `cuDeviceGetPCIBusId`, e.g. `0000:1B:00.0` (any case, 4 or 8 digit
    /// domain).
    pub pci_bus_id: String,
    /// Compute capability `(major, minor)`.
    pub sm: (u32, u32),
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceTotalMem`.
    pub memory_bytes: u64,
    /// `CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH`, bits (0: unknown).
    pub mem_bus_bits: u32,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE`, kHz (0: unknown).
    pub mem_clock_khz: u32,
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` (0: unknown).
    pub sm_count: u32,
}

impl DriverGpu {
    /// Peak memory bandwidth from the bus width and memory clock, GB/s
    /// (read and write together; HBM and GDDR transfer twice per clock),
    /// or `None` where the driver gave neither.
    pub fn peak_mem_gbps(&self) -> Option<f64> {
        (self.mem_bus_bits > 0 && self.mem_clock_khz > 0)
            .then(|| f64::from(self.mem_bus_bits) / 8.0 * f64::from(self.mem_clock_khz) * 2.0 / 1e6)
    }
}

/// Peer-to-peer capability from one device to another
/// (`cuDeviceGetP2PAttribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pFacts {
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access_supported: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better).
    pub performance_rank: i32,
}

/// Everything the driver told us. `p2p[i][j]` describes access from
/// `devices[i]` to `devices[j]`; the diagonal is ignored, and a matrix
/// of the wrong shape is ignored with a warning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverFacts {
    pub devices: Vec<DriverGpu>,
    pub p2p: Vec<Vec<P2pFacts>>,
}

impl DriverFacts {
    /// Whether the matrix has one row and one column per device.
    fn p2p_well_formed(&self) -> bool {
        let n = self.devices.len();
        self.p2p.len() == n && self.p2p.iter().all(|r| r.len() == n)
    }
}

impl Topology {
    /// Merges the driver's view of the local machine (host 0):
    ///
    /// - GPUs are matched by PCI bus id. Each matched GPU takes the CUDA
    ///   ordinal as its `<gpu dev>` and, where unknown, its compute
    ///   capability. GPUs the driver does not show (hidden by
    ///   `CUDA_VISIBLE_DEVICES`) stay in the graph but are numbered after
    ///   the visible ones, so GPU index `i` in [`Topology::gpus`] is CUDA
    ///   device `i` for every visible device.
    /// - GPUs the driver shows but NVML and sysfs missed are added under
    ///   the first CPU (NUMA unknown, PCIe link unknown).
    /// - A pair without peer access (either direction) is recorded with
    ///   the [`P2P_BLOCKED_ATTR`] attribute; its path then goes through
    ///   the CPU (at least PHB, see [`Topology::path`]) and never over
    ///   NVLink. A pair the driver says has access loses any such mark.
    ///
    /// Name, memory size, native atomics and the performance rank are not
    /// used by the model and are not stored in the graph.
    pub fn merge_driver_facts(&mut self, facts: &DriverFacts) {
        if facts.devices.is_empty() {
            return;
        }
        let mut nodes: Vec<Node> = self.nodes.clone();
        // NVSwitch nodes are derived (and always last); from_nodes re-adds them.
        while nodes.last().is_some_and(|n| n.kind == NodeKind::NvSwitch) {
            nodes.pop();
        }
        if !nodes.iter().any(|n| n.kind == NodeKind::Host) {
            nodes.push(Node::new(NodeKind::Host, 0, None));
        }
        let host0 = nodes
            .iter()
            .position(|n| n.kind == NodeKind::Host && n.host == 0)
            .unwrap_or(0);
        let by_bus: BTreeMap<String, NodeId> = (0..nodes.len())
            .filter(|&i| nodes[i].kind == NodeKind::Gpu && nodes[i].host == 0)
            .filter_map(|i| Some((nodes[i].busid()?, i)))
            .collect();
        // The driver's GPUs, as node ids, in facts order.
        let mut node_of = Vec::with_capacity(facts.devices.len());
        for d in &facts.devices {
            let bus = norm_busid(&d.pci_bus_id);
            let id = match by_bus.get(&bus) {
                Some(&i) => i,
                None => {
                    tracing::warn!(
                        "topology: CUDA device {} ({bus}) unknown to NVML/sysfs; \
                         placing it under the first CPU",
                        d.ordinal
                    );
                    let parent = (0..nodes.len())
                        .find(|&i| nodes[i].kind == NodeKind::Cpu && nodes[i].host == 0)
                        .unwrap_or_else(|| {
                            nodes.push(Node {
                                attrs: Attrs::from_pairs(&[("numaid", "-1")]),
                                ..Node::new(NodeKind::Cpu, 0, Some(host0))
                            });
                            nodes.len() - 1
                        });
                    let mut attrs = Attrs::from_pairs(&[("busid", &bus), ("class", "0x030200")]);
                    attrs.set("vendor", "0x10de");
                    nodes.push(Node {
                        attrs,
                        ..Node::new(NodeKind::Gpu, 0, Some(parent))
                    });
                    nodes.len() - 1
                }
            };
            let info = nodes[id].gpu.get_or_insert_with(GpuInfo::default);
            info.attrs.set("dev", d.ordinal.to_string());
            let sm = d.sm.0 * 10 + d.sm.1;
            if sm > 0 && info.attrs.int("sm").is_none_or(|s| s <= 0) {
                info.attrs.set("sm", sm.to_string());
            }
            // The memory's peak bandwidth and the SM count, from the
            // device's own attributes: the model's local bandwidth of a
            // GPU no table names (see `Topology::local_bw`).
            if let Some(peak) = d.peak_mem_gbps() {
                info.attrs.set(MEM_PEAK_ATTR, format!("{peak:.0}"));
            }
            if d.sm_count > 0 {
                info.attrs.set("sm_count", d.sm_count.to_string());
            }
            node_of.push(id);
        }
        // Hidden GPUs of host 0 go after the visible ones, in their old order.
        let mut next = facts
            .devices
            .iter()
            .map(|d| d.ordinal + 1)
            .max()
            .unwrap_or(0);
        for g in self.gpus_of_host(0) {
            if !node_of.contains(&g) {
                nodes[g]
                    .gpu
                    .get_or_insert_with(GpuInfo::default)
                    .attrs
                    .set("dev", next.to_string());
                next += 1;
            }
        }
        if facts.p2p_well_formed() {
            record_p2p(&mut nodes, &node_of, facts);
        } else if !facts.p2p.is_empty() {
            tracing::warn!(
                "topology: driver P2P matrix is {}x? for {} devices; ignored",
                facts.p2p.len(),
                facts.devices.len()
            );
        }
        *self = Topology::from_nodes(self.system.clone(), preorder(nodes));
    }
}

/// Writes the blocked pairs into each GPU's [`P2P_BLOCKED_ATTR`].
fn record_p2p(nodes: &mut [Node], node_of: &[NodeId], facts: &DriverFacts) {
    for (i, &a) in node_of.iter().enumerate() {
        let mut blocked: Vec<String> = nodes[a]
            .gpu
            .as_ref()
            .and_then(|g| g.attrs.get(P2P_BLOCKED_ATTR))
            .unwrap_or("")
            .split_whitespace()
            .map(norm_busid)
            .collect();
        for (j, &b) in node_of.iter().enumerate() {
            if i == j || a == b {
                continue;
            }
            let Some(bus) = nodes[b].busid() else {
                continue;
            };
            let ok = facts.p2p[i][j].access_supported && facts.p2p[j][i].access_supported;
            blocked.retain(|x| *x != bus);
            if !ok {
                blocked.push(bus);
            }
        }
        blocked.sort();
        let info = nodes[a].gpu.get_or_insert_with(GpuInfo::default);
        if blocked.is_empty() {
            info.attrs.0.retain(|(k, _)| k != P2P_BLOCKED_ATTR);
        } else {
            info.attrs.set(P2P_BLOCKED_ATTR, blocked.join(" "));
        }
    }
}
