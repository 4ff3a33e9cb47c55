//! Machines built in code, each usable × N hosts.
//!
//! The trees follow the vendors' published block diagrams; NVLink counts
//! are the ones `nvidia-smi topo -m` prints on those machines. Bus ids are
//! made up but stable.

use crate::consts::{gpu_by_device_id, GpuSpec};
use crate::error::{Result, TopoError};
use crate::graph::{Attrs, GpuInfo, NicInfo, Node, NodeId, NodeKind, Topology};

/// Preset names and what each describes.
pub const PRESETS: [(&str, &str); 8] = [
    (
        "dgx1",
        "DGX-1 V100: 8 GPUs, hybrid cube-mesh NVLink 2, 4 PCIe Gen3 switches, 2 sockets, 4 NICs",
    ),
    (
        "dgx-a100",
        "DGX A100: 8 GPUs, 12 NVLink 3 each to NVSwitch, 4 PCIe Gen4 switches, 8 NICs",
    ),
    (
        "hgx-h100",
        "HGX H100: 8 GPUs, 18 NVLink 4 each to NVSwitch, 8 PCIe Gen5 switches, 8 × 400 Gb/s NICs",
    ),
    ("hgx-h200", "HGX H200: as hgx-h100 with H200 GPUs"),
    (
        "hgx-b200",
        "HGX B200: 8 GPUs, 18 NVLink 5 each to NVSwitch, 8 × 400 Gb/s NICs",
    ),
    (
        "pcie-8gpu",
        "8 PCIe Gen4 GPUs (A100 PCIe) on two sockets, 2 per switch, no NVLink, 2 NICs",
    ),
    (
        "nvlink-bridge",
        "2 GPUs (RTX A6000) joined by one NVLink bridge (4 links), 1 NIC",
    ),
    ("single-gpu", "1 H200 (run several ranks on it), 1 NIC"),
];

fn canonical(name: &str) -> Option<&'static str> {
    let n: String = name
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    Some(match n.as_str() {
        "dgx1" | "dgx1v100" | "dgx1v" => "dgx1",
        "dgxa100" | "a100" => "dgx-a100",
        "hgxh100" | "h100" | "dgxh100" => "hgx-h100",
        "hgxh200" | "h200" | "dgxh200" => "hgx-h200",
        "hgxb200" | "b200" | "dgxb200" => "hgx-b200",
        "pcie8gpu" | "pcie" | "pcie8" | "pciegen4" => "pcie-8gpu",
        "nvlinkbridge" | "nvlinkbridge2gpu" | "bridge" | "2gpu" => "nvlink-bridge",
        "singlegpu" | "1gpu" | "single" => "single-gpu",
        _ => return None,
    })
}

struct Builder {
    nodes: Vec<Node>,
}

/// NVLinks of a GPU: target bus id, link count, the target's PCI class.
type NvLinks = Vec<(String, u32, &'static str)>;

impl Builder {
    fn push(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn cpu(&mut self, host: NodeId, numa: u32, intel: bool) -> NodeId {
        let h = self.nodes[host].host;
        let (vendor, family, model) = if intel {
            ("GenuineIntel", "6", "143")
        } else {
            ("AuthenticAMD", "23", "49")
        };
        let numa = numa.to_string();
        self.push(Node {
            attrs: Attrs::from_pairs(&[
                ("numaid", &numa),
                ("arch", "x86_64"),
                ("vendor", vendor),
                ("familyid", family),
                ("modelid", model),
            ]),
            ..Node::new(NodeKind::Cpu, h, Some(host))
        })
    }

    fn switch(&mut self, parent: NodeId, bus: &str, gen: u8) -> NodeId {
        let h = self.nodes[parent].host;
        self.push(Node {
            attrs: pci_attrs(bus, "0x060400", None, gen),
            ..Node::new(NodeKind::PciSwitch, h, Some(parent))
        })
    }

    /// GPU `index` of its host: device number `index`, at bus
    /// [`gpu_bus`]`(host, index)`.
    fn gpu(
        &mut self,
        parent: NodeId,
        index: usize,
        spec: GpuSpec,
        gen: u8,
        nvlinks: NvLinks,
    ) -> NodeId {
        let h = self.nodes[parent].host;
        let dev = index.to_string();
        let sm = spec.sm.to_string();
        let nvlinks = nvlinks
            .iter()
            .map(|(t, c, class)| {
                Attrs::from_pairs(&[("target", t), ("count", &c.to_string()), ("tclass", class)])
            })
            .collect();
        self.push(Node {
            attrs: pci_attrs(&gpu_bus(h, index), "0x030200", Some(spec.device_id), gen),
            gpu: Some(GpuInfo {
                attrs: Attrs::from_pairs(&[("dev", &dev), ("sm", &sm), ("gdr", "1")]),
                nvlinks,
            }),
            ..Node::new(NodeKind::Gpu, h, Some(parent))
        })
    }

    fn nic(&mut self, parent: NodeId, bus: &str, gbps: u32, gen: u8, dev: u32) -> NodeId {
        let h = self.nodes[parent].host;
        let speed = (gbps * 1000).to_string();
        let name = format!("mlx5_{dev}");
        let dev = dev.to_string();
        self.push(Node {
            attrs: pci_attrs(bus, "0x020700", Some(0x101b), gen),
            nic: Some(NicInfo {
                attrs: Attrs::default(),
                nets: vec![Attrs::from_pairs(&[
                    ("name", &name),
                    ("dev", &dev),
                    ("speed", &speed),
                    ("port", "1"),
                    ("gdr", "1"),
                ])],
            }),
            ..Node::new(NodeKind::Nic, h, Some(parent))
        })
    }
}

fn pci_attrs(bus: &str, class: &str, device: Option<u32>, gen: u8) -> Attrs {
    let speed = match gen {
        3 => "8.0 GT/s PCIe",
        4 => "16.0 GT/s PCIe",
        5 => "32.0 GT/s PCIe",
        _ => "",
    };
    let mut a = Attrs::from_pairs(&[("busid", bus), ("class", class)]);
    if let Some(d) = device {
        a.set(
            "vendor",
            if class == "0x020700" {
                "0x15b3"
            } else {
                "0x10de"
            },
        );
        a.set("device", format!("0x{d:04x}"));
    }
    a.set("link_speed", speed);
    a.set("link_width", "16");
    a
}

fn spec(id: u32) -> GpuSpec {
    // The table is a compile-time constant that contains these ids.
    gpu_by_device_id(id).unwrap_or(crate::consts::GPUS[0])
}

fn gpu_bus(h: u32, i: usize) -> String {
    format!("{:04x}:{:02x}:00.0", h, 0x18 + 0x10 * i)
}

/// DGX-1 V100 NVLink counts (`nvidia-smi topo -m` on that machine).
const DGX1_NV: [[u32; 8]; 8] = [
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
];

fn build_host(b: &mut Builder, which: &str, host: NodeId) {
    let h = b.nodes[host].host;
    let sw_bus = |i: usize| format!("{:04x}:{:02x}:00.0", h, 0x10 + 0x10 * i);
    let nic_bus = |i: usize| format!("{:04x}:{:02x}:00.0", h, 0x1a + 0x10 * i);
    let nvswitch_links = |spec: GpuSpec, counts: &[u32]| -> Vec<(String, u32, &'static str)> {
        let _ = spec;
        counts
            .iter()
            .enumerate()
            .map(|(k, &c)| (format!("{:04x}:{:02x}:00.0", h, 0xc0 + k), c, "0x068000"))
            .collect()
    };
    // The 8-GPU machines: two CPUs, each with `nsw / 2` PCIe switches
    // (numbered across both CPUs); `fill` hangs GPUs and NICs off switch
    // `swn`, `after_cpu` what hangs off CPU `cpu_i` once its switches are
    // built. Nodes are pushed in that order.
    let two_sockets = |b: &mut Builder,
                       intel: bool,
                       nsw: usize,
                       gen: u8,
                       fill: &mut dyn FnMut(&mut Builder, NodeId, usize),
                       after_cpu: &mut dyn FnMut(&mut Builder, NodeId, u32)| {
        for cpu_i in 0..2u32 {
            let cpu = b.cpu(host, cpu_i, intel);
            for sw_k in 0..nsw / 2 {
                let swn = cpu_i as usize * (nsw / 2) + sw_k;
                let sw = b.switch(cpu, &sw_bus(swn), gen);
                fill(b, sw, swn);
            }
            after_cpu(b, cpu, cpu_i);
        }
    };
    match which {
        "dgx1" => {
            let s = spec(0x1db1);
            let mut fill = |b: &mut Builder, sw: NodeId, swn: usize| {
                for (g, row) in DGX1_NV.iter().enumerate().skip(swn * 2).take(2) {
                    let nvlinks = (0..8)
                        .filter(|&o| row[o] > 0)
                        .map(|o| (gpu_bus(h, o), row[o], "0x030200"))
                        .collect();
                    b.gpu(sw, g, s, 3, nvlinks);
                }
                b.nic(sw, &nic_bus(swn), 100, 3, swn as u32);
            };
            two_sockets(b, true, 4, 3, &mut fill, &mut |_, _, _| {});
        }
        "dgx-a100" | "hgx-h100" | "hgx-h200" | "hgx-b200" => {
            let (id, counts, gen, per_sw, intel, nic_gbps): (u32, &[u32], u8, usize, bool, u32) =
                match which {
                    "dgx-a100" => (0x20b2, &[2, 2, 2, 2, 2, 2], 4, 2, false, 200),
                    "hgx-h100" => (0x2330, &[5, 4, 4, 5], 5, 1, true, 400),
                    "hgx-h200" => (0x2335, &[5, 4, 4, 5], 5, 1, true, 400),
                    _ => (0x2901, &[9, 9], 5, 1, true, 400),
                };
            let s = spec(id);
            let mut fill = |b: &mut Builder, sw: NodeId, swn: usize| {
                for g in swn * per_sw..(swn + 1) * per_sw {
                    b.gpu(sw, g, s, gen, nvswitch_links(s, counts));
                    let bus = format!("{:04x}:{:02x}:00.0", h, 0x1a + 0x10 * g);
                    b.nic(sw, &bus, nic_gbps, gen, g as u32);
                }
            };
            two_sockets(b, intel, 8 / per_sw, gen, &mut fill, &mut |_, _, _| {});
        }
        "pcie-8gpu" => {
            let s = spec(0x20b5);
            let mut fill = |b: &mut Builder, sw: NodeId, swn: usize| {
                for g in swn * 2..swn * 2 + 2 {
                    b.gpu(sw, g, s, 4, vec![]);
                }
            };
            let mut nics = |b: &mut Builder, cpu: NodeId, cpu_i: u32| {
                b.nic(cpu, &nic_bus(4 + cpu_i as usize), 100, 4, cpu_i);
            };
            two_sockets(b, true, 4, 4, &mut fill, &mut nics);
        }
        "nvlink-bridge" => {
            let s = spec(0x2230);
            let cpu = b.cpu(host, 0, true);
            for g in 0..2usize {
                let nvlinks = vec![(gpu_bus(h, 1 - g), 4, "0x030200")];
                b.gpu(cpu, g, s, 4, nvlinks);
            }
            b.nic(cpu, &nic_bus(2), 100, 4, 0);
        }
        _ => {
            let s = spec(0x2335);
            let cpu = b.cpu(host, 0, true);
            let sw = b.switch(cpu, &sw_bus(0), 5);
            b.gpu(sw, 0, s, 5, vec![]);
            b.nic(sw, &nic_bus(0), 400, 5, 0);
        }
    }
}

impl Topology {
    /// A built-in machine (see [`PRESETS`]) repeated on `nodes` hosts joined
    /// by a non-blocking network.
    pub fn preset(name: &str, nodes: u32) -> Result<Topology> {
        let which = canonical(name).ok_or_else(|| {
            TopoError::UnknownPreset(
                name.to_string(),
                PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", "),
            )
        })?;
        if nodes == 0 {
            return Err(TopoError::Invalid(
                "a preset needs at least one host".into(),
            ));
        }
        let mut b = Builder { nodes: Vec::new() };
        let hosts: Vec<NodeId> = (0..nodes)
            .map(|h| b.push(Node::new(NodeKind::Host, h, None)))
            .collect();
        for host in hosts {
            build_host(&mut b, which, host);
        }
        Ok(Topology::from_nodes(
            Attrs::from_pairs(&[("version", "1")]),
            b.nodes,
        ))
    }

    /// Names of the presets.
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS.iter().map(|p| p.0).collect()
    }
}
