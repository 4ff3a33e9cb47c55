//! Text reports: the GPU matrix in the style of `nvidia-smi topo -m` (with
//! bandwidths) and NUMA/NIC affinity. Kept here so every front end prints
//! the same thing.

use std::fmt::Write as _;

use crate::graph::{NodeKind, Topology};

impl Topology {
    /// A one-paragraph summary: hosts, CPUs, GPUs, NICs, NVSwitches.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let gpus = self.gpus();
        let _ = writeln!(
            s,
            "{} host(s), {} NUMA node(s), {} GPUs, {} NICs{}",
            self.nhosts(),
            self.cpus().len(),
            gpus.len(),
            self.nics().len(),
            if self.of_kind(NodeKind::NvSwitch).is_empty() {
                String::new()
            } else {
                format!(
                    ", NVSwitch on {} host(s)",
                    self.of_kind(NodeKind::NvSwitch).len()
                )
            }
        );
        if let Some(&g) = gpus.first() {
            let n = &self.nodes[g];
            let name = n
                .attrs
                .int("device")
                .and_then(|d| crate::consts::gpu_by_device_id(d as u32))
                .map_or("GPU", |s| s.name);
            let sm = n.sm();
            let _ = writeln!(
                s,
                "GPU model: {name}{}",
                if sm > 0 {
                    format!(" (sm{sm})")
                } else {
                    String::new()
                }
            );
        }
        s
    }

    /// The GPU matrix of one host: classes, then a second table of
    /// bottleneck bandwidths, then NUMA and NIC affinity per GPU.
    pub fn matrix_report(&self, host: u32) -> String {
        let mut s = String::new();
        let gpus = self.gpus_of_host(host);
        let all = self.gpus();
        let idx = |g| all.iter().position(|&x| x == g).unwrap_or(0);
        if gpus.is_empty() {
            let _ = writeln!(s, "host{host}: 0 GPUs");
        } else {
            let head: String = gpus
                .iter()
                .map(|&g| format!("{:>7}", format!("GPU{}", idx(g))))
                .collect();
            let _ = writeln!(s, "{:8}{head}   {:>5}  NIC (class, GB/s)", "", "NUMA");
            for &a in &gpus {
                let row: String = gpus
                    .iter()
                    .map(|&b| format!("{:>7}", self.path(a, b).class.to_string()))
                    .collect();
                let nic = match self.nearest_nic(a) {
                    Some((n, p)) => format!(
                        "{} ({}, {:.1})",
                        self.label(n),
                        p.class,
                        p.bw.min(self.nic_bw(n))
                    ),
                    None => "-".to_string(),
                };
                let _ = writeln!(
                    s,
                    "{:8}{row}   {:>5}  {nic}",
                    format!("GPU{}", idx(a)),
                    self.numa_of(a)
                );
            }
            let _ = writeln!(
                s,
                "\nbottleneck bandwidth, GB/s one way (X: the GPU's own memory copy rate)"
            );
            let _ = writeln!(s, "{:8}{head}", "");
            for &a in &gpus {
                let row: String = gpus
                    .iter()
                    .map(|&b| format!("{:>7.1}", self.path(a, b).bw))
                    .collect();
                let _ = writeln!(s, "{:8}{row}", format!("GPU{}", idx(a)));
            }
        }
        let cpus: Vec<_> = self
            .cpus()
            .into_iter()
            .filter(|&c| self.nodes[c].host == host)
            .collect();
        let _ = writeln!(s);
        for c in cpus {
            let a = &self.nodes[c].attrs;
            let gp: Vec<String> = gpus
                .iter()
                .filter(|&&g| self.cpu_of(g) == Some(c))
                .map(|&g| format!("GPU{}", idx(g)))
                .collect();
            let nics: Vec<String> = self
                .nics()
                .into_iter()
                .filter(|&n| self.cpu_of(n) == Some(c))
                .map(|n| format!("{} {:.1} GB/s", self.label(n), self.nic_bw(n)))
                .collect();
            let _ = writeln!(
                s,
                "NUMA {} ({} {}, affinity {}): GPUs [{}], NICs [{}]",
                a.get("numaid").unwrap_or("?"),
                a.get("vendor").unwrap_or("?"),
                a.get("arch").unwrap_or(""),
                a.get("affinity").unwrap_or("?"),
                gp.join(" "),
                nics.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "\nLegend: X same GPU; NV# # NVLinks (direct, or through the NVSwitch: see summary); \
             NVB NVLink through a GPU; PIX one PCIe switch; PXB several PCIe switches; \
             PHB the CPU's host bridge; NODE within a NUMA node; SYS across sockets; NET another host"
        );
        s
    }
}
