//! Path classes and bottleneck bandwidths on every preset and shared file.

use oxccl_topo::{PathClass, Topology};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/topologies");

fn shared(name: &str) -> Topology {
    Topology::from_xml_file(format!("{SHARED}/{name}")).expect(name)
}

fn classes(t: &Topology) -> Vec<String> {
    t.gpu_matrix()
        .iter()
        .map(|row| {
            row.iter()
                .map(|p| p.class.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn bws(t: &Topology) -> Vec<Vec<f64>> {
    t.gpu_matrix()
        .iter()
        .map(|row| row.iter().map(|p| (p.bw * 10.0).round() / 10.0).collect())
        .collect()
}

#[test]
fn dgx1_matrix() {
    let t = Topology::preset("dgx1", 1).unwrap();
    assert_eq!(
        classes(&t),
        [
            "X NV1 NV1 NV2 NV2 NVB NVB NVB",
            "NV1 X NV2 NV1 NVB NV2 NVB NVB",
            "NV1 NV2 X NV2 NVB NVB NV1 NVB",
            "NV2 NV1 NV2 X NVB NVB NVB NV1",
            "NV2 NVB NVB NVB X NV1 NV1 NV2",
            "NVB NV2 NVB NVB NV1 X NV2 NV1",
            "NVB NVB NV1 NVB NV1 NV2 X NV2",
            "NVB NVB NVB NV1 NV2 NV1 NV2 X",
        ]
    );
    let b = bws(&t);
    assert_eq!(b[0][1], 20.0);
    assert_eq!(b[0][3], 40.0);
    // NVB through GPU 3 or 4: both NV2 hops (0-4, 4-7) give 40.
    assert_eq!(b[0][7], 40.0);
    assert_eq!(b[0][5], 20.0);
    let m = t.gpu_matrix();
    assert_eq!(m[0][1].hops, 1);
    assert_eq!(m[0][5].hops, 2);
    // The NIC next to GPU 0 is behind the same PLX switch.
    let g0 = t.gpus()[0];
    let (nic, p) = t.nearest_nic(g0).unwrap();
    assert_eq!(t.label(nic), "NIC0");
    assert_eq!(p.class, PathClass::Pix);
}

#[test]
fn nvswitch_presets_are_all_nvswitch_class() {
    for (name, links, bw) in [
        ("hgx-h100", 18, 370.8),
        ("hgx-h200", 18, 370.8),
        ("dgx-a100", 12, 240.0),
        ("hgx-b200", 18, 720.0),
    ] {
        let t = Topology::preset(name, 1).unwrap();
        let m = t.gpu_matrix();
        assert_eq!(m.len(), 8);
        for (i, row) in m.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if i == j {
                    assert_eq!(p.class, PathClass::X);
                } else {
                    assert_eq!(p.class, PathClass::NvSwitch(links), "{name} {i}-{j}");
                    assert!((p.bw - bw).abs() < 1e-6, "{name} {i}-{j}: {}", p.bw);
                    assert_eq!(p.hops, 2);
                }
            }
        }
    }
}

#[test]
fn pcie_8gpu_matrix() {
    let t = Topology::preset("pcie-8gpu", 1).unwrap();
    let row0 = "X PIX PHB PHB SYS SYS SYS SYS";
    assert_eq!(classes(&t)[0], row0);
    assert_eq!(classes(&t)[5], "SYS SYS SYS SYS PIX X PHB PHB");
    let b = bws(&t);
    assert_eq!(b[0][1], 24.0);
    assert_eq!(b[0][2], 24.0);
    assert_eq!(b[0][4], 10.0);
    let m = t.gpu_matrix();
    assert_eq!(m[0][1].hops, 2);
    assert_eq!(m[0][2].hops, 4);
    assert_eq!(m[0][4].hops, 5);
}

#[test]
fn small_presets() {
    let t = Topology::preset("nvlink-bridge", 1).unwrap();
    assert_eq!(classes(&t), ["X NV4", "NV4 X"]);
    assert_eq!(bws(&t)[0][1], 56.0);
    let t = Topology::preset("single-gpu", 1).unwrap();
    assert_eq!(classes(&t), ["X"]);
    assert!(bws(&t)[0][0] > 2000.0);
}

#[test]
fn multi_host_paths_are_net() {
    let t = Topology::preset("hgx-h100", 2).unwrap();
    assert_eq!(t.gpus().len(), 16);
    assert_eq!(t.nhosts(), 2);
    let m = t.gpu_matrix();
    assert_eq!(m[0][8].class, PathClass::Net);
    // 400 Gb/s NIC (50 GB/s) behind a Gen5 x16 switch (48 GB/s).
    assert!((m[0][8].bw - 48.0).abs() < 1e-9);
    assert_eq!(m[8][9].class, PathClass::NvSwitch(18));
    let t = Topology::preset("dgx1", 3).unwrap();
    assert_eq!(t.gpu_matrix()[3][20].class, PathClass::Net);
    assert!((t.gpu_matrix()[3][20].bw - 12.0).abs() < 1e-9);
}

#[test]
fn azure_ndv2() {
    let t = shared("azure-ndv2.xml");
    assert_eq!(t.gpus().len(), 8);
    assert_eq!(t.nics().len(), 1);
    assert_eq!(classes(&t)[0], "X PHB PHB PHB SYS SYS SYS SYS");
    let b = bws(&t);
    assert_eq!(b[0][1], 24.0);
    assert_eq!(b[0][4], 10.0);
    let (_, p) = t.nearest_nic(t.gpus()[5]).unwrap();
    assert_eq!(p.class, PathClass::Sys);
}

#[test]
fn azure_ndv4() {
    let t = shared("azure-ndv4.xml");
    assert_eq!(t.gpus().len(), 8);
    assert_eq!(t.nics().len(), 8);
    assert_eq!(classes(&t)[0], "X PIX SYS SYS SYS SYS SYS SYS");
    assert_eq!(classes(&t)[7], "SYS SYS SYS SYS SYS SYS PIX X");
    assert_eq!(bws(&t)[0][1], 24.0);
    assert_eq!(bws(&t)[0][2], 16.0);
    let (_, p) = t.nearest_nic(t.gpus()[3]).unwrap();
    assert_eq!(p.class, PathClass::Pix);
}

#[test]
fn azure_ndv5() {
    let t = shared("azure-ndv5.xml");
    assert_eq!(t.gpus().len(), 8);
    assert_eq!(classes(&t)[0], "X PHB PHB PHB SYS SYS SYS SYS");
    assert_eq!(bws(&t)[0][1], 48.0);
    assert_eq!(bws(&t)[0][5], 10.0);
    let (_, p) = t.nearest_nic(t.gpus()[6]).unwrap();
    assert_eq!(p.class, PathClass::Pix);
    assert_eq!(p.bw, 48.0);
}

#[test]
fn azure_ncv4() {
    let t = shared("azure-ncv4.xml");
    assert_eq!(t.gpus().len(), 4);
    assert_eq!(t.cpus().len(), 4);
    // The NVLink entries point at the GPU itself: no link is made.
    assert_eq!(classes(&t)[0], "X SYS SYS SYS");
    assert_eq!(t.nodes[t.gpus()[0]].sm(), 80);
    // The socket NIC's port speed: 100000 Mb/s.
    assert!((t.nic_bw(t.nics()[0]) - 12.5).abs() < 1e-9);
    assert_eq!(bws(&t)[0][1], 16.0);
}
