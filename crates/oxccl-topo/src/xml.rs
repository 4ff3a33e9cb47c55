//! NCCL's topology XML (`NCCL_TOPO_FILE`, `<system version="1">`), read and
//! written.
//!
//! Reading accepts hint files (bare `<pci>` nodes, empty `link_speed`,
//! placeholder bus ids) as well as full dumps (`<gpu>`, `<nvlink>`, `<nic>`,
//! `<net>`), keeps unknown attributes and skips unknown elements with a
//! warning. Writing emits what was read, so read → write → read gives an
//! equal [`Topology`].
//!
//! Several hosts: NCCL's format describes one machine. We write a `host`
//! attribute on each `<cpu>` when there is more than one host (NCCL ignores
//! unknown attributes), and read it back; a missing one means host 0.

use std::fmt::Write as _;

use crate::error::{Result, TopoError};
use crate::graph::{Attrs, GpuInfo, NicInfo, Node, NodeId, NodeKind, Topology};

fn attrs_of(e: roxmltree::Node<'_, '_>) -> Attrs {
    Attrs(
        e.attributes()
            .map(|a| (a.name().to_string(), a.value().to_string()))
            .collect(),
    )
}

fn err_at(doc: &roxmltree::Document<'_>, e: roxmltree::Node<'_, '_>, msg: String) -> TopoError {
    let pos = doc.text_pos_at(e.range().start);
    TopoError::Xml {
        line: pos.row,
        col: pos.col,
        msg,
    }
}

/// Checks that an integer attribute, when present and non-empty, parses.
fn check_int(
    doc: &roxmltree::Document<'_>,
    e: roxmltree::Node<'_, '_>,
    names: &[&str],
) -> Result<()> {
    for name in names {
        if let Some(v) = e.attribute(*name) {
            if !v.trim().is_empty() && crate::graph::parse_int(v).is_none() {
                return Err(err_at(
                    doc,
                    e,
                    format!(
                        "<{}> attribute {name}={v:?} is not a number",
                        e.tag_name().name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Topology {
    /// Parses NCCL topology XML.
    pub fn from_xml_str(text: &str) -> Result<Topology> {
        let doc = roxmltree::Document::parse(text).map_err(|e| {
            let pos = e.pos();
            TopoError::Xml {
                line: pos.row,
                col: pos.col,
                msg: e.to_string(),
            }
        })?;
        let root = doc.root_element();
        if root.tag_name().name() != "system" {
            return Err(err_at(
                &doc,
                root,
                format!("expected <system>, found <{}>", root.tag_name().name()),
            ));
        }
        let mut nodes: Vec<Node> = Vec::new();
        let mut hosts: std::collections::BTreeMap<u32, NodeId> = Default::default();
        // Hosts come first, in order of the host numbers, so that GPU
        // indices run host by host whatever the element order.
        let mut host_ids: Vec<u32> = Vec::new();
        for cpu in root.children().filter(|c| c.has_tag_name("cpu")) {
            check_int(&doc, cpu, &["host", "numaid"])?;
            let h = cpu
                .attribute("host")
                .and_then(crate::graph::parse_int)
                .unwrap_or(0);
            let h = u32::try_from(h).map_err(|_| err_at(&doc, cpu, format!("bad host {h}")))?;
            if !host_ids.contains(&h) {
                host_ids.push(h);
            }
        }
        host_ids.sort_unstable();
        if host_ids.is_empty() {
            host_ids.push(0);
        }
        for &h in &host_ids {
            hosts.insert(h, nodes.len());
            nodes.push(Node::new(NodeKind::Host, h, None));
        }
        for &h in &host_ids {
            for child in root.children().filter(|c| c.is_element()) {
                match child.tag_name().name() {
                    "cpu" => {
                        let ch = child
                            .attribute("host")
                            .and_then(crate::graph::parse_int)
                            .unwrap_or(0);
                        if ch != i64::from(h) {
                            continue;
                        }
                        let mut attrs = attrs_of(child);
                        attrs.0.retain(|(k, _)| k != "host");
                        let id = nodes.len();
                        nodes.push(Node {
                            attrs,
                            ..Node::new(NodeKind::Cpu, h, Some(hosts[&h]))
                        });
                        for c in child.children().filter(|c| c.is_element()) {
                            read_device(&doc, c, id, h, &mut nodes)?;
                        }
                    }
                    other if h == host_ids[0] => {
                        tracing::warn!("topology XML: ignoring <{other}> under <system>");
                    }
                    _ => {}
                }
            }
        }
        Ok(Topology::from_nodes(attrs_of(root), nodes))
    }

    /// Reads a topology XML file.
    pub fn from_xml_file(path: impl AsRef<std::path::Path>) -> Result<Topology> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TopoError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Topology::from_xml_str(&text)
    }

    /// Writes NCCL topology XML.
    pub fn to_xml_string(&self) -> String {
        let mut out = String::new();
        out.push_str("<system");
        let system = if self.system.is_empty() {
            Attrs::from_pairs(&[("version", "1")])
        } else {
            self.system.clone()
        };
        write_attrs(&mut out, &system);
        out.push_str(">\n");
        let multi = self.nhosts() > 1;
        for cpu in self.cpus() {
            let mut attrs = self.nodes[cpu].attrs.clone();
            if multi {
                attrs
                    .0
                    .insert(0, ("host".into(), self.nodes[cpu].host.to_string()));
            }
            self.write_elem(&mut out, cpu, "cpu", &attrs, 1);
        }
        out.push_str("</system>\n");
        out
    }

    /// Writes the XML to a file.
    pub fn to_xml_file(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_xml_string()).map_err(|source| TopoError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    fn children_of(&self, n: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        (n + 1..self.nodes.len()).filter(move |&c| self.nodes[c].parent == Some(n))
    }

    fn write_elem(&self, out: &mut String, n: NodeId, tag: &str, attrs: &Attrs, depth: usize) {
        let node = &self.nodes[n];
        let mut inner = String::new();
        if let Some(g) = &node.gpu {
            open_close(&mut inner, "gpu", &g.attrs, depth + 1, |s| {
                for l in &g.nvlinks {
                    empty_elem(s, "nvlink", l, depth + 2);
                }
            });
        }
        if let Some(nic) = &node.nic {
            let nic_depth = if node.attrs.is_empty() {
                depth
            } else {
                depth + 1
            };
            let target = if node.attrs.is_empty() {
                &mut *out
            } else {
                &mut inner
            };
            open_close(target, "nic", &nic.attrs, nic_depth, |s| {
                for net in &nic.nets {
                    empty_elem(s, "net", net, nic_depth + 1);
                }
            });
            if node.attrs.is_empty() {
                return;
            }
        }
        for c in self.children_of(n) {
            let a = self.nodes[c].attrs.clone();
            self.write_elem(&mut inner, c, "pci", &a, depth + 1);
        }
        open_close(out, tag, attrs, depth, |s| s.push_str(&inner));
    }
}

fn open_close(
    out: &mut String,
    tag: &str,
    attrs: &Attrs,
    depth: usize,
    body: impl FnOnce(&mut String),
) {
    let pad = "  ".repeat(depth);
    let mut inner = String::new();
    body(&mut inner);
    let _ = write!(out, "{pad}<{tag}");
    write_attrs(out, attrs);
    if inner.is_empty() {
        out.push_str("/>\n");
    } else {
        let _ = write!(out, ">\n{inner}{pad}</{tag}>\n");
    }
}

fn empty_elem(out: &mut String, tag: &str, attrs: &Attrs, depth: usize) {
    open_close(out, tag, attrs, depth, |_| {});
}

fn write_attrs(out: &mut String, attrs: &Attrs) {
    for (k, v) in &attrs.0 {
        let _ = write!(out, " {k}=\"{}\"", escape(v));
    }
}

fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '&' => s.push_str("&amp;"),
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '"' => s.push_str("&quot;"),
            '\n' => s.push_str("&#10;"),
            '\t' => s.push_str("&#9;"),
            '\r' => s.push_str("&#13;"),
            c => s.push(c),
        }
    }
    s
}

/// Reads one element under a `<cpu>` or `<pci>`.
fn read_device(
    doc: &roxmltree::Document<'_>,
    e: roxmltree::Node<'_, '_>,
    parent: NodeId,
    host: u32,
    nodes: &mut Vec<Node>,
) -> Result<()> {
    match e.tag_name().name() {
        "pci" => {
            check_int(doc, e, &["class", "link_width", "vendor", "device"])?;
            let attrs = attrs_of(e);
            let class = attrs.int("class").unwrap_or(0);
            let gpu_elem = e.children().find(|c| c.has_tag_name("gpu"));
            let nic_elem = e.children().find(|c| c.has_tag_name("nic"));
            let kind = if gpu_elem.is_some() || class >> 16 == 0x03 {
                NodeKind::Gpu
            } else if nic_elem.is_some() || class >> 16 == 0x02 {
                NodeKind::Nic
            } else if class >> 8 == 0x0604 {
                NodeKind::PciSwitch
            } else {
                NodeKind::Pci
            };
            let id = nodes.len();
            let mut node = Node {
                attrs,
                ..Node::new(kind, host, Some(parent))
            };
            if let Some(g) = gpu_elem {
                check_int(doc, g, &["dev", "sm", "rank", "gdr"])?;
                let mut info = GpuInfo {
                    attrs: attrs_of(g),
                    nvlinks: Vec::new(),
                };
                for l in g.children().filter(|c| c.is_element()) {
                    if l.has_tag_name("nvlink") {
                        check_int(doc, l, &["count", "tclass"])?;
                        info.nvlinks.push(attrs_of(l));
                    } else {
                        tracing::warn!("topology XML: ignoring <{}> in <gpu>", l.tag_name().name());
                    }
                }
                node.gpu = Some(info);
            }
            if let Some(n) = nic_elem {
                node.nic = Some(read_nic(doc, n)?);
            }
            nodes.push(node);
            for c in e.children().filter(|c| c.is_element()) {
                if c.has_tag_name("pci") {
                    read_device(doc, c, id, host, nodes)?;
                } else if !c.has_tag_name("gpu") && !c.has_tag_name("nic") {
                    tracing::warn!("topology XML: ignoring <{}> in <pci>", c.tag_name().name());
                }
            }
        }
        "nic" => {
            let info = read_nic(doc, e)?;
            nodes.push(Node {
                nic: Some(info),
                ..Node::new(NodeKind::Nic, host, Some(parent))
            });
        }
        other => tracing::warn!("topology XML: ignoring <{other}>"),
    }
    Ok(())
}

fn read_nic(doc: &roxmltree::Document<'_>, e: roxmltree::Node<'_, '_>) -> Result<NicInfo> {
    let mut info = NicInfo {
        attrs: attrs_of(e),
        nets: Vec::new(),
    };
    for n in e.children().filter(|c| c.is_element()) {
        if n.has_tag_name("net") {
            check_int(doc, n, &["speed", "port", "dev", "maxconn", "gdr"])?;
            info.nets.push(attrs_of(n));
        } else {
            tracing::warn!("topology XML: ignoring <{}> in <nic>", n.tag_name().name());
        }
    }
    Ok(info)
}
