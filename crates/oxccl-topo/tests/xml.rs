//! NCCL topology XML: real files, full dumps, errors, round trips.

use oxccl_topo::{PathClass, TopoError, Topology};
use proptest::prelude::*;

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/topologies");

fn round_trip(t: &Topology) {
    let x = t.to_xml_string();
    let back = Topology::from_xml_str(&x).unwrap_or_else(|e| panic!("{e}\n{x}"));
    assert_eq!(&back, t, "\n{x}");
    // Stable: writing again gives the same text.
    assert_eq!(back.to_xml_string(), x);
}

#[test]
fn presets_round_trip() {
    for name in Topology::preset_names() {
        for hosts in [1, 3] {
            round_trip(&Topology::preset(name, hosts).unwrap());
        }
    }
}

#[test]
fn shared_files_round_trip() {
    for f in [
        "azure-ndv2.xml",
        "azure-ndv4.xml",
        "azure-ndv5.xml",
        "azure-ncv4.xml",
    ] {
        let t = Topology::from_xml_file(format!("{SHARED}/{f}")).unwrap();
        round_trip(&t);
        // Attributes we do not interpret survive (e.g. subsystem ids).
        let x = t.to_xml_string();
        if f == "azure-ndv5.xml" {
            assert!(x.contains("subsystem_vendor=\"0x0000\""));
        }
        if f == "azure-ncv4.xml" {
            assert!(x.contains("maxconn=\"65536\""));
            assert!(
                x.contains("<nvlink target=\"0001:00:00.0\" count=\"12\" tclass=\"0x030200\"/>")
            );
        }
    }
}

/// An `NCCL_TOPO_DUMP_FILE`-style dump with an NVSwitch system, a C2C
/// link, and attributes and elements the parser does not know (kept on
/// write).
const FULL_DUMP: &str = include_str!("fixtures/full_dump.xml");

#[test]
fn full_dump_with_nvswitch_and_unknowns() {
    let t = Topology::from_xml_str(FULL_DUMP).unwrap();
    assert_eq!(t.gpus().len(), 2);
    let m = t.gpu_matrix();
    assert_eq!(m[0][1].class, PathClass::NvSwitch(18));
    assert!((m[0][1].bw - 18.0 * 20.6).abs() < 1e-9);
    assert!((t.nic_bw(t.nics()[0]) - 50.0).abs() < 1e-9);
    let x = t.to_xml_string();
    assert!(x.contains("future=\"x\""));
    assert!(x.contains("extra=\"kept\""));
    assert!(x.contains("coll=\"1\""));
    round_trip(&t);
}

#[test]
fn malformed_xml_reports_line_and_column() {
    let bad =
        "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"x\" </cpu>\n</system>";
    match Topology::from_xml_str(bad) {
        Err(TopoError::Xml { line, col, .. }) => {
            assert_eq!(line, 3);
            assert!(col > 1);
        }
        other => panic!("expected an XML error, got {other:?}"),
    }
    let bad_value = "<system version=\"1\">\n<cpu numaid=\"0\">\n  <pci busid=\"0000:01:00.0\" class=\"0x030200\">\n    <gpu dev=\"0\" sm=\"90\">\n      <nvlink target=\"0000:02:00.0\" count=\"many\"/>\n";
    let bad_value = format!("{bad_value}    </gpu>\n  </pci>\n</cpu>\n</system>\n");
    match Topology::from_xml_str(&bad_value) {
        Err(TopoError::Xml { line, col, msg }) => {
            assert_eq!((line, col), (5, 7), "{msg}");
            assert!(msg.contains("count"));
        }
        other => panic!("expected an XML error, got {other:?}"),
    }
    assert!(matches!(
        Topology::from_xml_str("<gpu/>"),
        Err(TopoError::Xml {
            line: 1,
            col: 1,
            ..
        })
    ));
}

/// A named file is read; one that cannot be read falls back to detection.
/// (Which variable names the file is the facade's settings' business.)
#[test]
fn a_topology_file_is_honoured() {
    let dir = std::env::temp_dir().join(format!("oxccl-topo-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.xml");
    Topology::preset("dgx1", 1)
        .unwrap()
        .to_xml_file(&p)
        .unwrap();
    let ndv4 = std::path::PathBuf::from(format!("{SHARED}/azure-ndv4.xml"));
    let dgx1 = Topology::preset("dgx1", 1).unwrap();
    assert_eq!(Topology::from_file_or_detect(Some(&p)), dgx1);
    let t = Topology::from_file_or_detect(Some(&ndv4));
    assert_eq!(t.gpus().len(), 8);
    assert_ne!(t, dgx1);
    let missing = dir.join("missing.xml");
    assert_eq!(
        Topology::from_file_or_detect(Some(&missing)),
        Topology::from_file_or_detect(None)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A random machine: hosts × CPUs × (switch or not) × GPUs and NICs, with
/// random NVLinks, odd attribute values included.
fn random_xml() -> impl Strategy<Value = String> {
    (1usize..3, 1usize..3, 1usize..4, proptest::collection::vec((0usize..8, 0usize..8, 1u32..5), 0..6), "[a-zA-Z0-9 <>&\"']{0,8}", any::<bool>())
        .prop_map(|(hosts, cpus, gpus_per, nvl, weird, switch)| {
            let mut s = String::from("<system version=\"1\">\n");
            for h in 0..hosts {
                for c in 0..cpus {
                    let esc = weird.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
                    s += &format!("<cpu host=\"{h}\" numaid=\"{c}\" note=\"{esc}\">\n");
                    if switch {
                        s += &format!("<pci busid=\"{h:04x}:{c:02x}:00.0\" class=\"0x060400\" link_speed=\"16 GT/s\" link_width=\"16\">\n");
                    }
                    for g in 0..gpus_per {
                        let idx = c * gpus_per + g;
                        s += &format!("<pci busid=\"{h:04x}:{:02x}:00.0\" class=\"0x030200\" link_speed=\"\" link_width=\"0\"><gpu dev=\"{idx}\" sm=\"80\">", 0x40 + idx);
                        for (a, b, n) in &nvl {
                            if *a == idx && b != a {
                                s += &format!("<nvlink target=\"{h:04x}:{:02x}:00.0\" count=\"{n}\" tclass=\"0x030200\"/>", 0x40 + b);
                            }
                            if *a == idx && b == a {
                                s += &format!("<nvlink target=\"{h:04x}:c0:00.0\" count=\"{n}\" tclass=\"0x068000\"/>");
                            }
                        }
                        s += "</gpu></pci>\n";
                    }
                    s += &format!("<pci busid=\"{h:04x}:{:02x}:00.0\" class=\"0x020700\"/>\n", 0xa0 + c);
                    if switch {
                        s += "</pci>\n";
                    }
                    s += "</cpu>\n";
                }
            }
            s + "</system>\n"
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_graphs_round_trip(x in random_xml()) {
        let t = Topology::from_xml_str(&x).unwrap();
        let back = Topology::from_xml_str(&t.to_xml_string()).unwrap();
        prop_assert_eq!(&back, &t);
        // Paths exist between every pair and are symmetric in class.
        let m = t.gpu_matrix();
        for (i, row) in m.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                prop_assert_eq!(p.class, m[j][i].class);
                prop_assert!(p.bw > 0.0);
            }
        }
    }
}
