//! Paths between GPUs (and GPU–NIC): the class `nvidia-smi topo -m` shows,
//! the bottleneck bandwidth and the hop count, plus the physical links a
//! path uses (which ring search needs to share bandwidth correctly).
//!
//! The class of a path is the worst link on it; NVLink paths (direct,
//! through the NVSwitch, or through one other GPU) win over PCIe ones,
//! and between hosts everything is `NET`.

use std::fmt;

use crate::graph::{LinkKind, NodeId, NodeKind, Topology};

/// The class of a path, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathClass {
    /// The same GPU (several ranks on one device).
    X,
    /// Direct NVLink with this many links.
    Nv(u32),
    /// Through the NVSwitch; the number is the smaller GPU's link count.
    NvSwitch(u32),
    /// NVLink through one other GPU.
    Nvb,
    /// Through at most one PCIe switch.
    Pix,
    /// Through several PCIe switches, not the host bridge.
    Pxb,
    /// Through the CPU's host bridge.
    Phb,
    /// Between host bridges of one NUMA node.
    Node,
    /// Across the inter-socket link.
    Sys,
    /// Through the network (another host).
    Net,
}

impl PathClass {
    /// Position in the order best → worst.
    pub fn rank(self) -> u8 {
        match self {
            PathClass::X => 0,
            PathClass::Nv(_) => 1,
            PathClass::NvSwitch(_) => 2,
            PathClass::Nvb => 3,
            PathClass::Pix => 4,
            PathClass::Pxb => 5,
            PathClass::Phb => 6,
            PathClass::Node => 7,
            PathClass::Sys => 8,
            PathClass::Net => 9,
        }
    }

    /// A direct NVLink or NVSwitch path (or the same GPU): the class the
    /// all-pairs algorithms and LL128 want, and that DGX-1 rings must use.
    pub fn is_nvlink(self) -> bool {
        matches!(
            self,
            PathClass::X | PathClass::Nv(_) | PathClass::NvSwitch(_)
        )
    }

    /// Whether peer-to-peer transfers work well on this class (NCCL's
    /// default: up to PXB).
    pub fn p2p_ok(self) -> bool {
        self.rank() <= PathClass::Pxb.rank()
    }
}

impl fmt::Display for PathClass {
    /// As `nvidia-smi topo -m` prints it (NVSwitch paths are `NV#` there too).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathClass::X => f.write_str("X"),
            PathClass::Nv(n) | PathClass::NvSwitch(n) => write!(f, "NV{n}"),
            PathClass::Nvb => f.write_str("NVB"),
            PathClass::Pix => f.write_str("PIX"),
            PathClass::Pxb => f.write_str("PXB"),
            PathClass::Phb => f.write_str("PHB"),
            PathClass::Node => f.write_str("NODE"),
            PathClass::Sys => f.write_str("SYS"),
            PathClass::Net => f.write_str("NET"),
        }
    }
}

/// A path between two nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    pub class: PathClass,
    /// Bottleneck bandwidth, GB/s one way.
    pub bw: f64,
    /// Links crossed.
    pub hops: u32,
    /// The links crossed, as `(index in Topology::links, forward)` where
    /// forward means from the link's `a` to its `b`. Empty for `X` and for
    /// the network part of `NET` paths.
    pub links: Vec<(usize, bool)>,
}

impl Topology {
    /// The path from `a` to `b` (GPUs or NICs).
    pub fn path(&self, a: NodeId, b: NodeId) -> Path {
        if a == b {
            return Path {
                class: PathClass::X,
                bw: self.local_bw(a),
                hops: 0,
                links: Vec::new(),
            };
        }
        if self.nodes[a].host != self.nodes[b].host {
            return self.net_path(a, b);
        }
        if self.nodes[a].kind == NodeKind::Gpu && self.nodes[b].kind == NodeKind::Gpu {
            if self.p2p_blocked(a, b) {
                // Without peer access neither NVLink nor a PCIe switch can
                // carry the traffic: it is staged through the CPU, as NCCL
                // does (so the class is at least PHB).
                return self.pci_path_inner(a, b, true);
            }
            if let Some(p) = self.nvlink_path(a, b) {
                return p;
            }
        }
        self.pci_path(a, b)
    }

    /// Paths between every pair of GPUs, indexed by GPU index.
    pub fn gpu_matrix(&self) -> Vec<Vec<Path>> {
        let gpus = self.gpus();
        gpus.iter()
            .map(|&a| gpus.iter().map(|&b| self.path(a, b)).collect())
            .collect()
    }

    /// The NIC closest to `gpu` on its host (best class, then bandwidth,
    /// then the lowest index), with the path to it.
    pub fn nearest_nic(&self, gpu: NodeId) -> Option<(NodeId, Path)> {
        let host = self.nodes[gpu].host;
        let mut best: Option<(NodeId, Path)> = None;
        for nic in self.nics() {
            if self.nodes[nic].host != host {
                continue;
            }
            let p = self.pci_path(gpu, nic);
            let better = match &best {
                None => true,
                Some((_, q)) => (p.class.rank(), -p.bw) < (q.class.rank(), -q.bw),
            };
            if better {
                best = Some((nic, p));
            }
        }
        best
    }

    fn nvlink_path(&self, a: NodeId, b: NodeId) -> Option<Path> {
        let link_idx = |x: NodeId, y: NodeId| {
            self.links.iter().position(|l| {
                matches!(l.kind, LinkKind::NvLink { .. })
                    && ((l.a == x && l.b == y) || (l.a == y && l.b == x))
            })
        };
        let fwd = |i: usize, from: NodeId| (i, self.links[i].a == from);
        let count = |i: usize| match self.links[i].kind {
            LinkKind::NvLink { count, .. } => count,
            _ => 0,
        };
        if let Some(i) = link_idx(a, b) {
            return Some(Path {
                class: PathClass::Nv(count(i)),
                bw: self.links[i].bw,
                hops: 1,
                links: vec![fwd(i, a)],
            });
        }
        let sw_a = self
            .nvlinks_of(a)
            .find(|(p, _)| self.nodes[*p].kind == NodeKind::NvSwitch)
            .map(|(p, _)| p);
        if let Some(sw) = sw_a {
            if let (Some(ia), Some(ib)) = (link_idx(a, sw), link_idx(sw, b)) {
                return Some(Path {
                    class: PathClass::NvSwitch(count(ia).min(count(ib))),
                    bw: self.links[ia].bw.min(self.links[ib].bw),
                    hops: 2,
                    links: vec![fwd(ia, a), fwd(ib, sw)],
                });
            }
        }
        let mut best: Option<Path> = None;
        for (k, _) in self.nvlinks_of(a) {
            if self.nodes[k].kind != NodeKind::Gpu
                || self.p2p_blocked(a, k)
                || self.p2p_blocked(k, b)
            {
                continue;
            }
            if let (Some(ia), Some(ib)) = (link_idx(a, k), link_idx(k, b)) {
                let bw = self.links[ia].bw.min(self.links[ib].bw);
                if best.as_ref().is_none_or(|p| bw > p.bw) {
                    best = Some(Path {
                        class: PathClass::Nvb,
                        bw,
                        hops: 2,
                        links: vec![fwd(ia, a), fwd(ib, k)],
                    });
                }
            }
        }
        best
    }

    /// Ancestors of `n`, itself first, up to the root.
    fn chain(&self, n: NodeId) -> Vec<NodeId> {
        let mut v = vec![n];
        while let Some(p) = self.nodes[*v.last().unwrap_or(&n)].parent {
            v.push(p);
        }
        v
    }

    /// The path through the PCIe tree (and the inter-socket link).
    pub fn pci_path(&self, a: NodeId, b: NodeId) -> Path {
        self.pci_path_inner(a, b, false)
    }

    /// As [`Topology::pci_path`]; `via_cpu` forces the path up to the
    /// CPUs (no peer-to-peer shortcut under a shared switch).
    fn pci_path_inner(&self, a: NodeId, b: NodeId, via_cpu: bool) -> Path {
        let ca = self.chain(a);
        let cb = self.chain(b);
        let lca = ca
            .iter()
            .copied()
            .find(|x| cb.contains(x))
            .filter(|_| !via_cpu);
        let mut links = Vec::new();
        let mut switches = 0u32;
        let climb =
            |chain: &[NodeId], stop: Option<NodeId>, links: &mut Vec<(usize, bool)>, up: bool| {
                let mut sw = 0;
                for &n in chain {
                    if Some(n) == stop || self.nodes[n].kind == NodeKind::Cpu {
                        break;
                    }
                    if let Some(i) = self.uplink_index(n) {
                        // Uplinks run parent (a) → child (b): going up is backward.
                        links.push((i, !up));
                    }
                    if n != chain[0] && self.nodes[n].kind == NodeKind::PciSwitch {
                        sw += 1;
                    }
                }
                sw
            };
        let class = match lca {
            Some(l) if self.nodes[l].kind != NodeKind::Host => {
                switches += climb(&ca, Some(l), &mut links, true);
                let mut down = Vec::new();
                switches += climb(&cb, Some(l), &mut down, false);
                down.reverse();
                links.extend(down);
                if self.nodes[l].kind == NodeKind::PciSwitch {
                    switches += 1;
                }
                match self.nodes[l].kind {
                    NodeKind::Cpu => PathClass::Phb,
                    _ if switches <= 1 => PathClass::Pix,
                    _ => PathClass::Pxb,
                }
            }
            _ => {
                climb(&ca, None, &mut links, true);
                let cpu_a = self.cpu_of(a);
                let cpu_b = self.cpu_of(b);
                if let (Some(x), Some(y)) = (cpu_a, cpu_b) {
                    if let Some(i) = self.links.iter().position(|l| {
                        l.kind == LinkKind::Smp
                            && ((l.a == x && l.b == y) || (l.a == y && l.b == x))
                    }) {
                        links.push((i, self.links[i].a == x));
                    }
                }
                let mut down = Vec::new();
                climb(&cb, None, &mut down, false);
                down.reverse();
                links.extend(down);
                if cpu_a.is_some() && cpu_a == cpu_b {
                    PathClass::Phb
                } else if self.numa_of(a) == self.numa_of(b) && self.numa_of(a) >= 0 {
                    PathClass::Node
                } else {
                    PathClass::Sys
                }
            }
        };
        let bw = links
            .iter()
            .map(|&(i, _)| self.links[i].bw)
            .fold(f64::INFINITY, f64::min);
        Path {
            class,
            bw: if bw.is_finite() {
                bw
            } else {
                crate::consts::pcie_bw(0, 0)
            },
            hops: links.len() as u32,
            links,
        }
    }

    fn net_path(&self, a: NodeId, b: NodeId) -> Path {
        let side = |x: NodeId| -> (f64, u32, Vec<(usize, bool)>) {
            if self.nodes[x].kind == NodeKind::Nic {
                return (self.nic_bw(x), 0, Vec::new());
            }
            match self.nearest_nic(x) {
                Some((nic, p)) => (p.bw.min(self.nic_bw(nic)), p.hops, p.links),
                None => (crate::consts::NET_DEFAULT_BW, 0, Vec::new()),
            }
        };
        let (bwa, ha, mut la) = side(a);
        let (bwb, hb, lb) = side(b);
        // b's links were computed from b outwards; reverse them to run toward b.
        la.extend(lb.into_iter().rev().map(|(i, f)| (i, !f)));
        Path {
            class: PathClass::Net,
            bw: bwa.min(bwb),
            hops: ha + hb + 2,
            links: la,
        }
    }
}
