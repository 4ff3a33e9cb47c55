//! The network device a communicator talks through (a net plugin's device,
//! or the built-in TCP's interface), placed in the topology as a NIC node
//! so the model prices what the device states.
//!
//! A plugin describes its device by name, PCI path (a sysfs path whose
//! last bus-id component is the NIC's PCI function), speed (Mb/s) and
//! latency (µs). Where the path names a PCI device of the graph, that
//! device becomes the NIC (or, already a NIC, gains the port); otherwise
//! the NIC hangs off the host's first CPU, as NCCL attaches a device whose
//! PCI path it cannot place.

use crate::graph::{norm_busid, Attrs, NicInfo, Node, NodeId, NodeKind, Topology};

/// One network device as its transport states it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetDevice {
    /// The device's name (`mlx5_0`, `eth0`, a plugin's own).
    pub name: String,
    /// Its PCI path in sysfs, where it has one.
    pub pci_path: Option<String>,
    /// Link speed, Mb/s (0: not stated).
    pub speed_mbps: u32,
    /// One-way latency the device promises, µs (0: not stated).
    pub latency_us: f64,
}

/// The PCI bus id at the end of a sysfs path (`.../0000:05:00.0`),
/// normalised; `None` where the last component is not one.
pub fn busid_of_path(path: &str) -> Option<String> {
    let last = path.trim_end_matches('/').rsplit('/').next()?;
    let (dom, rest) = last.split_once(':')?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(dom, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)).then(|| norm_busid(last))
}

/// Attribute of a `<net>` port: the latency its device states, µs. NCCL's
/// XML carries `latency` on `<net>` too.
pub const NET_LATENCY_ATTR: &str = "latency";

impl Topology {
    /// This topology with `dev` on host `host` as a NIC, and that NIC's
    /// node. Where `dev`'s PCI path names a NIC or plain PCI device of the
    /// host, that node becomes the NIC with `dev` as its only port; otherwise a new NIC is attached to
    /// the host's first CPU (the host and a CPU are added where the graph
    /// has none, as the empty topology of ranks without GPUs).
    pub fn with_net_device(&self, host: u32, dev: &NetDevice) -> (Topology, NodeId) {
        let mut nodes = self.nodes.clone();
        // Implicit NVSwitch nodes sit at the tail and are rebuilt by
        // `from_nodes`; nothing hangs below them, so dropping them keeps
        // every other node's id.
        while nodes.last().is_some_and(|n| n.kind == NodeKind::NvSwitch) {
            nodes.pop();
        }
        let port = port_attrs(dev);
        let found = dev
            .pci_path
            .as_deref()
            .and_then(busid_of_path)
            .and_then(|b| {
                nodes.iter().position(|n| {
                    n.host == host
                        && matches!(n.kind, NodeKind::Nic | NodeKind::Pci)
                        && n.busid().as_deref() == Some(b.as_str())
                })
            });
        let nic = match found {
            Some(i) => {
                let node = &mut nodes[i];
                node.kind = NodeKind::Nic;
                // The transport's view of the device replaces the ports
                // detection saw: it is what the communicator runs on.
                node.nic.get_or_insert_with(NicInfo::default).nets = vec![port];
                i
            }
            None => {
                let cpu = cpu_of_host(&mut nodes, host);
                nodes.push(Node {
                    nic: Some(NicInfo {
                        attrs: Attrs::default(),
                        nets: vec![port],
                    }),
                    ..Node::new(NodeKind::Nic, host, Some(cpu))
                });
                nodes.len() - 1
            }
        };
        (Topology::from_nodes(self.system.clone(), nodes), nic)
    }

    /// The latency a NIC's ports state, µs (the first port that states
    /// one); `None` where none does.
    pub fn nic_latency_us(&self, nic: NodeId) -> Option<f64> {
        self.nodes
            .get(nic)?
            .nic
            .as_ref()?
            .nets
            .iter()
            .find_map(|n| {
                n.get(NET_LATENCY_ATTR)
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|l| *l > 0.0)
            })
    }

    /// One line for the logs: `NIC0 mlx5_0 (pci 0000:05:00.0 under CPU0):
    /// 12.5 GB/s, latency 2 us`.
    pub fn nic_line(&self, nic: NodeId) -> String {
        let node = &self.nodes[nic];
        let name = node
            .nic
            .as_ref()
            .and_then(|i| i.nets.first())
            .and_then(|n| n.get("name"))
            .unwrap_or("?");
        let pci = node.busid().unwrap_or_else(|| "none".into());
        let above = node
            .parent
            .map_or_else(|| "nothing".into(), |p| self.label(p));
        let lat = self
            .nic_latency_us(nic)
            .map_or_else(|| "not stated".into(), |l| format!("{l} us"));
        let stated = node
            .nic
            .as_ref()
            .is_some_and(|i| i.nets.iter().any(|n| n.int("speed").is_some_and(|v| v > 0)));
        // Without a stated speed `nic_bw` falls back to the PCIe link or
        // a default; say so rather than print a figure nobody stated.
        let speed = if stated {
            format!("{:.1} GB/s", self.nic_bw(nic))
        } else {
            "speed not stated".into()
        };
        format!(
            "{} {name} (pci {pci} under {above}): {speed}, latency {lat}",
            self.label(nic)
        )
    }
}

/// The `<net>` element of `dev`.
fn port_attrs(dev: &NetDevice) -> Attrs {
    let mut a = Attrs::from_pairs(&[("name", &dev.name), ("dev", "0")]);
    if dev.speed_mbps > 0 {
        a.set("speed", dev.speed_mbps.to_string());
    }
    if dev.latency_us > 0.0 {
        a.set(NET_LATENCY_ATTR, dev.latency_us.to_string());
    }
    a
}

/// The first CPU of `host` in `nodes`, adding the host and a CPU (NUMA
/// node 0) where there is none.
fn cpu_of_host(nodes: &mut Vec<Node>, host: u32) -> NodeId {
    if let Some(c) = nodes
        .iter()
        .position(|n| n.kind == NodeKind::Cpu && n.host == host)
    {
        return c;
    }
    let h = match nodes
        .iter()
        .position(|n| n.kind == NodeKind::Host && n.host == host)
    {
        Some(h) => h,
        None => {
            nodes.push(Node::new(NodeKind::Host, host, None));
            nodes.len() - 1
        }
    };
    nodes.push(Node {
        attrs: Attrs::from_pairs(&[("numaid", "0")]),
        ..Node::new(NodeKind::Cpu, host, Some(h))
    });
    nodes.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(pci: Option<&str>) -> NetDevice {
        NetDevice {
            name: "ofi0".into(),
            pci_path: pci.map(str::to_string),
            speed_mbps: 100_000,
            latency_us: 7.5,
        }
    }

    #[test]
    fn bus_ids_come_from_the_last_path_component_only() {
        assert_eq!(
            busid_of_path("/sys/devices/pci0000:00/0000:00:01.0/0000:05:00.0").as_deref(),
            Some(norm_busid("0000:05:00.0").as_str())
        );
        assert_eq!(
            busid_of_path("/sys/devices/pci0000:00/0000:05:00.0/"),
            busid_of_path("0000:05:00.0")
        );
        assert_eq!(busid_of_path("/sys/devices/virtual/net/lo"), None);
        assert_eq!(busid_of_path("0000:05:00"), None);
        assert_eq!(busid_of_path("zzzz:05:00.0"), None);
    }

    #[test]
    fn a_device_without_a_pci_path_hangs_off_a_cpu_even_in_an_empty_graph() {
        let (t, nic) = Topology::empty().with_net_device(0, &dev(None));
        assert_eq!(t.nics(), vec![nic]);
        assert_eq!(t.nodes[t.nodes[nic].parent.unwrap()].kind, NodeKind::Cpu);
        assert!((t.nic_bw(nic) - 12.5).abs() < 1e-9);
        assert_eq!(t.nic_latency_us(nic), Some(7.5));
        let line = t.nic_line(nic);
        assert!(
            line.starts_with("NIC0 ofi0 (pci none under CPU0): 12.5 GB/s, latency 7.5 us"),
            "{line}"
        );
        let quiet = NetDevice {
            speed_mbps: 0,
            latency_us: 0.0,
            ..dev(None)
        };
        let (t, nic) = Topology::empty().with_net_device(0, &quiet);
        assert_eq!(
            t.nic_line(nic),
            "NIC0 ofi0 (pci none under CPU0): speed not stated, latency not stated"
        );
    }

    #[test]
    fn a_device_whose_path_names_a_nic_of_the_graph_is_that_nic() {
        let base = Topology::preset("hgx-h100", 1).unwrap();
        let first = base.nics()[0];
        let bus = base.nodes[first].busid().unwrap();
        let path = format!("/sys/devices/pci0000:00/{bus}");
        let (t, nic) = base.with_net_device(0, &dev(Some(&path)));
        assert_eq!(nic, first);
        assert_eq!(t.nics().len(), base.nics().len());
        assert_eq!(t.gpus(), base.gpus());
        assert_eq!(t.nic_latency_us(nic), Some(7.5));
        // The device's own figures replace what the preset said.
        assert!((base.nic_bw(first) - 12.5).abs() > 1.0);
        assert!((t.nic_bw(nic) - 12.5).abs() < 1e-9);
        // A path naming no device of the graph adds a NIC under a CPU.
        let (t2, other) =
            base.with_net_device(0, &dev(Some("/sys/devices/pci0000:00/0000:ee:00.0")));
        assert_eq!(t2.nics().len(), base.nics().len() + 1);
        assert_eq!(
            t2.nodes[t2.nodes[other].parent.unwrap()].kind,
            NodeKind::Cpu
        );
        assert_eq!(t2.gpus(), base.gpus());
    }
}
