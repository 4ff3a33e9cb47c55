//! The topology graph: a tree of hosts, CPUs (NUMA nodes), PCIe switches and
//! devices, plus typed links (PCIe, NVLink, inter-socket) derived from it.
//!
//! The nodes keep the attributes of the XML elements they came from, in
//! order, so that writing NCCL's topology XML back loses nothing we did not
//! understand. Everything the rest of the crate needs (link kinds and
//! bandwidths, GPU generations) is derived from those attributes by
//! [`Topology::from_nodes`], which is the one place links are built.

use crate::consts;
/// Defined with its bandwidths in [`crate::consts`].
pub use crate::consts::NvLinkGen;

/// Index of a node in [`Topology::nodes`].
pub type NodeId = usize;

/// XML attributes in document order. Order matters only for a faithful
/// round trip; lookups are by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attrs(pub Vec<(String, String)>);

impl Attrs {
    /// Builds attributes from `(name, value)` pairs.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        Attrs(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        )
    }

    /// The value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `name`, replacing an existing value in place or appending.
    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name.to_string(), value)),
        }
    }

    /// `name` parsed as an integer, decimal or `0x` hexadecimal.
    pub fn int(&self, name: &str) -> Option<i64> {
        parse_int(self.get(name)?)
    }

    /// Whether there are no attributes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Parses decimal or `0x`-prefixed hexadecimal, trimming spaces.
pub fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A bus id normalised for comparison (`0000:1B:00.0` and `0000:1b:00.0`
/// name the same device; NVML pads the domain to 8 digits).
pub fn norm_busid(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 && dom.starts_with("0000") => {
            format!("{}:{rest}", &dom[dom.len() - 4..])
        }
        _ => s,
    }
}

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// One machine; the root of its tree. Not an XML element (see
    /// [`crate::xml`] for how several hosts are written).
    Host,
    /// A CPU socket / NUMA node (`<cpu>`).
    Cpu,
    /// A PCIe bridge or switch (`<pci>` of class 0x0604xx).
    PciSwitch,
    /// A GPU (`<pci>` of class 0x03xxxx, with or without `<gpu>`).
    Gpu,
    /// A network adapter (`<pci>` of class 0x02xxxx, or a `<nic>` without
    /// a PCI parent).
    Nic,
    /// Any other PCI device, kept so the tree round-trips.
    Pci,
    /// The NVSwitch fabric of one host: every NVLink whose target has class
    /// 0x068000 ends here. Implicit in the XML, so never written.
    NvSwitch,
}

/// Extra detail of a GPU: its `<gpu>` element and the `<nvlink>` elements
/// under it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuInfo {
    pub attrs: Attrs,
    pub nvlinks: Vec<Attrs>,
}

/// Extra detail of a NIC: its `<nic>` element and `<net>` ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicInfo {
    pub attrs: Attrs,
    pub nets: Vec<Attrs>,
}

/// One node of the tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    /// Which host (0-based) the node belongs to.
    pub host: u32,
    /// The node above in the PCIe tree (a CPU's parent is its host).
    pub parent: Option<NodeId>,
    /// Attributes of the `<cpu>` or `<pci>` element (empty for a `<nic>`
    /// straight under a CPU, and for hosts and NVSwitches).
    pub attrs: Attrs,
    /// `<gpu>` detail, where known.
    pub gpu: Option<GpuInfo>,
    /// `<nic>` detail, where known.
    pub nic: Option<NicInfo>,
}

impl Node {
    /// A node with only a kind, host and parent.
    pub fn new(kind: NodeKind, host: u32, parent: Option<NodeId>) -> Self {
        Node {
            kind,
            host,
            parent,
            attrs: Attrs::default(),
            gpu: None,
            nic: None,
        }
    }

    /// The PCI bus id, normalised, if any.
    pub fn busid(&self) -> Option<String> {
        self.attrs.get("busid").map(norm_busid)
    }

    /// The GPU's compute capability ×10 (e.g. 90), from `<gpu sm>` or else
    /// from a known PCI device id; 0 when unknown.
    pub fn sm(&self) -> u32 {
        if let Some(sm) = self.gpu.as_ref().and_then(|g| g.attrs.int("sm")) {
            return u32::try_from(sm).unwrap_or(0);
        }
        self.attrs
            .int("device")
            .and_then(|d| consts::gpu_by_device_id(d as u32))
            .map_or(0, |g| g.sm)
    }
}

impl NvLinkGen {
    /// The generation used by a GPU of compute capability `sm` (×10).
    pub fn for_sm(sm: u32) -> Self {
        match sm {
            0..=79 => NvLinkGen::V2,
            80..=85 => NvLinkGen::V3,
            86..=89 => NvLinkGen::V3Bridge,
            90..=99 => NvLinkGen::V4,
            _ => NvLinkGen::V5,
        }
    }
}

/// What a link is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinkKind {
    /// `count` NVLinks of one generation.
    NvLink { gen: NvLinkGen, count: u32 },
    /// A PCIe link; `gen` 0 means the speed was not given.
    Pcie { gen: u8, width: u8 },
    /// The inter-socket link (UPI, xGMI...) between two CPUs of one host.
    Smp,
}

/// A link between two nodes, full duplex, `bw` GB/s in each direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub a: NodeId,
    pub b: NodeId,
    pub kind: LinkKind,
    pub bw: f64,
}

/// The machine (or machines) as a graph. Build one with
/// [`Topology::detect`], [`Topology::from_xml_str`], [`Topology::preset`]
/// or [`Topology::from_nodes`].
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// Attributes of `<system>` (normally `version="1"`).
    pub system: Attrs,
    /// All nodes; children always come after their parent.
    pub nodes: Vec<Node>,
    /// All links, derived from the nodes.
    pub links: Vec<Link>,
    /// For each node, the index in `links` of the link to its parent.
    uplink: Vec<Option<usize>>,
    /// GPU pairs `(low, high)` between which peer access is not possible
    /// (the driver said so; see [`P2P_BLOCKED_ATTR`]). Derived from the
    /// nodes, like `links`.
    no_p2p: std::collections::BTreeSet<(NodeId, NodeId)>,
}

/// Attribute of `<gpu>` listing, space separated, the bus ids of GPUs this
/// one cannot access peer to peer (`cuDeviceGetP2PAttribute` said no:
/// typical of VMs and of some multi-socket PCIe boxes). Not an NCCL
/// attribute; NCCL keeps unknown attributes, so files stay loadable there.
pub const P2P_BLOCKED_ATTR: &str = "nop2p";

/// GPU attribute: the memory's peak bandwidth in GB/s, from the driver's
/// bus width and memory clock ([`crate::DriverGpu::peak_mem_gbps`]).
pub const MEM_PEAK_ATTR: &str = "mem_peak_gbps";

impl Topology {
    /// Builds the graph from a node tree: drops any NVSwitch nodes given,
    /// adds one NVSwitch per host that has NVLinks to class 0x068000, and
    /// derives every link. Declarations that cannot be resolved (an NVLink
    /// to a bus id not in the tree, or to the GPU itself, as some cloud
    /// hint files have) are kept in the nodes but make no link.
    pub fn from_nodes(system: Attrs, nodes: Vec<Node>) -> Self {
        let mut nodes: Vec<Node> = nodes;
        // Renumbering would be needed if an NVSwitch sat in the middle;
        // they are only ever appended, so truncating the tail is enough.
        while nodes.last().is_some_and(|n| n.kind == NodeKind::NvSwitch) {
            nodes.pop();
        }
        let mut links = Vec::new();
        let mut uplink = vec![None; nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            let Some(p) = n.parent else { continue };
            if n.kind == NodeKind::Cpu {
                continue;
            }
            let (gen, width) = pcie_of(n);
            uplink[i] = Some(links.len());
            links.push(Link {
                a: p,
                b: i,
                kind: LinkKind::Pcie { gen, width },
                bw: consts::pcie_bw(gen, width),
            });
        }
        let cpus: Vec<NodeId> = (0..nodes.len())
            .filter(|&i| nodes[i].kind == NodeKind::Cpu)
            .collect();
        for (x, &a) in cpus.iter().enumerate() {
            for &b in &cpus[x + 1..] {
                if nodes[a].host == nodes[b].host {
                    let vendor = nodes[a].attrs.get("vendor").unwrap_or("");
                    links.push(Link {
                        a,
                        b,
                        kind: LinkKind::Smp,
                        bw: consts::smp_bw(vendor),
                    });
                }
            }
        }
        // NVLinks: one link per GPU pair, one per GPU to its host's switch.
        let mut switch_of_host: std::collections::BTreeMap<u32, NodeId> = Default::default();
        let mut pair_done = std::collections::BTreeSet::new();
        let gpus: Vec<NodeId> = (0..nodes.len())
            .filter(|&i| nodes[i].kind == NodeKind::Gpu)
            .collect();
        // (host, bus id) → GPU, so that resolving NVLink targets stays
        // linear on thousand-host simulations.
        let by_bus: std::collections::HashMap<(u32, String), NodeId> = gpus
            .iter()
            .filter_map(|&g| Some(((nodes[g].host, nodes[g].busid()?), g)))
            .collect();
        for &g in &gpus {
            let sm = nodes[g].sm();
            let gen = NvLinkGen::for_sm(sm);
            let own = nodes[g].busid();
            let decls = nodes[g]
                .gpu
                .as_ref()
                .map(|x| x.nvlinks.clone())
                .unwrap_or_default();
            let mut to_switch = 0u32;
            for d in &decls {
                let count = d.int("count").unwrap_or(1).max(0) as u32;
                let target = d.get("target").map(norm_busid);
                let tclass = d.int("tclass").unwrap_or(0);
                if tclass >> 8 == 0x0680 {
                    to_switch += count;
                    continue;
                }
                if target.is_none() || target == own {
                    continue;
                }
                let peer = target.and_then(|t| by_bus.get(&(nodes[g].host, t)).copied());
                let Some(peer) = peer.filter(|&p| p != g) else {
                    continue;
                };
                if pair_done.insert((g.min(peer), g.max(peer))) {
                    links.push(Link {
                        a: g,
                        b: peer,
                        kind: LinkKind::NvLink { gen, count },
                        bw: f64::from(count) * consts::nvlink_bw(gen),
                    });
                }
            }
            if to_switch > 0 {
                let host = nodes[g].host;
                let sw = *switch_of_host.entry(host).or_insert_with(|| {
                    nodes.push(Node::new(NodeKind::NvSwitch, host, None));
                    uplink.push(None);
                    nodes.len() - 1
                });
                links.push(Link {
                    a: g,
                    b: sw,
                    kind: LinkKind::NvLink {
                        gen,
                        count: to_switch,
                    },
                    bw: f64::from(to_switch) * consts::nvlink_bw(gen),
                });
            }
        }
        let mut no_p2p = std::collections::BTreeSet::new();
        for &g in &gpus {
            let blocked = nodes[g]
                .gpu
                .as_ref()
                .and_then(|x| x.attrs.get(P2P_BLOCKED_ATTR))
                .unwrap_or("");
            for t in blocked.split_whitespace() {
                if let Some(&peer) = by_bus.get(&(nodes[g].host, norm_busid(t))) {
                    if peer != g {
                        no_p2p.insert((g.min(peer), g.max(peer)));
                    }
                }
            }
        }
        Topology {
            system,
            nodes,
            links,
            uplink,
            no_p2p,
        }
    }

    /// Whether peer access between GPUs `a` and `b` is known to be
    /// impossible (in either direction), so traffic between them goes
    /// through host memory.
    pub fn p2p_blocked(&self, a: NodeId, b: NodeId) -> bool {
        self.no_p2p.contains(&(a.min(b), a.max(b)))
    }

    /// An empty topology (no hosts); [`Topology::detect`] never returns one.
    pub fn empty() -> Self {
        Topology::from_nodes(Attrs::from_pairs(&[("version", "1")]), Vec::new())
    }

    /// Number of hosts.
    pub fn nhosts(&self) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Host)
            .count() as u32
    }

    /// Every GPU, host by host in tree order: the index into this list is
    /// the "GPU index" used everywhere else in the crate.
    ///
    /// Within a host, GPUs are ordered by their `<gpu dev>` number when
    /// every GPU has one (as detection and full dumps give), else in tree
    /// order (hint files).
    pub fn gpus(&self) -> Vec<NodeId> {
        let mut v = self.of_kind(NodeKind::Gpu);
        let dev = |g: NodeId| self.nodes[g].gpu.as_ref().and_then(|i| i.attrs.int("dev"));
        if v.iter().all(|&g| dev(g).is_some()) {
            v.sort_by_key(|&g| (self.nodes[g].host, dev(g), g));
        } else {
            v.sort_by_key(|&g| (self.nodes[g].host, g));
        }
        v
    }

    /// GPUs of one host, in order.
    pub fn gpus_of_host(&self, host: u32) -> Vec<NodeId> {
        self.gpus()
            .into_iter()
            .filter(|&g| self.nodes[g].host == host)
            .collect()
    }

    /// Every NIC, in order.
    pub fn nics(&self) -> Vec<NodeId> {
        self.of_kind(NodeKind::Nic)
    }

    /// Every CPU (NUMA node), in order.
    pub fn cpus(&self) -> Vec<NodeId> {
        self.of_kind(NodeKind::Cpu)
    }

    /// Every node of `kind`, in order.
    pub fn of_kind(&self, kind: NodeKind) -> Vec<NodeId> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].kind == kind)
            .collect()
    }

    /// The link from `n` to its parent.
    pub fn uplink(&self, n: NodeId) -> Option<&Link> {
        self.uplink
            .get(n)
            .copied()
            .flatten()
            .map(|i| &self.links[i])
    }

    /// Index in `links` of the link from `n` to its parent.
    pub fn uplink_index(&self, n: NodeId) -> Option<usize> {
        self.uplink.get(n).copied().flatten()
    }

    /// The CPU above `n`, if any.
    pub fn cpu_of(&self, n: NodeId) -> Option<NodeId> {
        let mut cur = Some(n);
        while let Some(c) = cur {
            if self.nodes[c].kind == NodeKind::Cpu {
                return Some(c);
            }
            cur = self.nodes[c].parent;
        }
        None
    }

    /// The NUMA id of the CPU above `n` (-1 when unknown).
    pub fn numa_of(&self, n: NodeId) -> i64 {
        self.cpu_of(n)
            .and_then(|c| self.nodes[c].attrs.int("numaid"))
            .unwrap_or(-1)
    }

    /// A short name for a node: `GPU3`, `NIC0`, `CPU1`, `host2`...
    pub fn label(&self, n: NodeId) -> String {
        let node = &self.nodes[n];
        let idx = |k: NodeKind| self.of_kind(k).iter().position(|&x| x == n).unwrap_or(0);
        match node.kind {
            NodeKind::Host => format!("host{}", node.host),
            NodeKind::Cpu => format!("CPU{}", idx(NodeKind::Cpu)),
            NodeKind::PciSwitch => format!("PCISW{}", idx(NodeKind::PciSwitch)),
            NodeKind::Gpu => format!("GPU{}", idx(NodeKind::Gpu)),
            NodeKind::Nic => format!("NIC{}", idx(NodeKind::Nic)),
            NodeKind::Pci => format!("PCI{}", idx(NodeKind::Pci)),
            NodeKind::NvSwitch => format!("NVSWITCH{}", node.host),
        }
    }

    /// The NVLinks of GPU `g`: `(peer node, link)`.
    pub fn nvlinks_of(&self, g: NodeId) -> impl Iterator<Item = (NodeId, &Link)> + '_ {
        self.links.iter().filter_map(move |l| {
            if !matches!(l.kind, LinkKind::NvLink { .. }) {
                return None;
            }
            if l.a == g {
                Some((l.b, l))
            } else if l.b == g {
                Some((l.a, l))
            } else {
                None
            }
        })
    }

    /// The NIC's bandwidth in GB/s: the port speed where given (Mb/s in
    /// the XML), else its PCIe link, else the default network bandwidth.
    pub fn nic_bw(&self, nic: NodeId) -> f64 {
        let node = &self.nodes[nic];
        let port: f64 = node
            .nic
            .as_ref()
            .map(|i| {
                i.nets
                    .iter()
                    .filter_map(|n| n.int("speed"))
                    .map(|mbps| mbps as f64 / 8000.0)
                    .sum()
            })
            .unwrap_or(0.0);
        if port > 0.0 {
            return port;
        }
        match self.uplink(nic) {
            Some(l) if matches!(l.kind, LinkKind::Pcie { gen, .. } if gen > 0) => l.bw,
            _ => consts::NET_DEFAULT_BW,
        }
    }

    /// Copy bandwidth of a GPU's own memory (GB/s of data moved), which
    /// bounds traffic between ranks that share the GPU: from the device's
    /// memory bus width and clock where the driver gave them (a copy moves
    /// each byte twice, at [`consts::COPY_EFFICIENCY`] of the peak), else
    /// the table of known GPUs, else a guess from the compute capability.
    pub fn local_bw(&self, g: NodeId) -> f64 {
        let node = &self.nodes[g];
        let peak = node
            .gpu
            .as_ref()
            .and_then(|i| i.attrs.get(MEM_PEAK_ATTR))
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|p| *p > 0.0);
        if let Some(peak) = peak {
            return peak * consts::COPY_EFFICIENCY / 2.0;
        }
        node.attrs
            .int("device")
            .and_then(|d| consts::gpu_by_device_id(d as u32))
            .map(|s| s.copy_gbps)
            .unwrap_or_else(|| consts::copy_bw_for_sm(node.sm()))
    }
}

/// PCIe generation and width of the link above `n`, from its
/// `link_speed` / `link_width` attributes (0 where missing or empty).
fn pcie_of(n: &Node) -> (u8, u8) {
    let speed = n.attrs.get("link_speed").unwrap_or("");
    let gts: f64 = speed
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    let gen = match gts {
        x if x >= 60.0 => 6,
        x if x >= 30.0 => 5,
        x if x >= 15.0 => 4,
        x if x >= 7.0 => 3,
        x if x >= 4.0 => 2,
        x if x > 0.0 => 1,
        _ => 0,
    };
    let width = n.attrs.int("link_width").unwrap_or(0).clamp(0, 32) as u8;
    (gen, width)
}

/// Reorders nodes so that each subtree is contiguous and follows its
/// parent (the order XML reading produces), keeping sibling order.
pub(crate) fn preorder(nodes: Vec<Node>) -> Vec<Node> {
    let n = nodes.len();
    let mut kids: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut roots = Vec::new();
    for (i, nd) in nodes.iter().enumerate() {
        match nd.parent {
            Some(p) => kids[p].push(i),
            None => roots.push(i),
        }
    }
    // Hosts first (as the XML reader creates them), then their subtrees.
    let mut order = roots.clone();
    for &r in &roots {
        let mut stack: Vec<usize> = kids[r].iter().rev().copied().collect();
        while let Some(x) = stack.pop() {
            order.push(x);
            stack.extend(kids[x].iter().rev());
        }
    }
    let mut newidx = vec![0; n];
    for (new, &old) in order.iter().enumerate() {
        newidx[old] = new;
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    order
        .iter()
        .map(|&old| {
            let mut nd = slots[old]
                .take()
                .unwrap_or_else(|| Node::new(NodeKind::Pci, 0, None));
            nd.parent = nd.parent.map(|p| newidx[p]);
            nd
        })
        .collect()
}
