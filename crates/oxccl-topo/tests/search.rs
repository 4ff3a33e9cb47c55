//! Ring search and trees.

use oxccl_topo::search::{binary_tree, children, depth, double_binary_tree, search_rings};
use oxccl_topo::{PathClass, Topology};

fn check_ring(r: &[usize], n: usize) {
    let mut s = r.to_vec();
    s.sort_unstable();
    assert_eq!(s, (0..n).collect::<Vec<_>>());
}

#[test]
fn dgx1_rings_are_nvlink_only() {
    let t = Topology::preset("dgx1", 1).unwrap();
    let gpus = t.gpus();
    let rs = search_rings(&t, &gpus, 16);
    assert!(rs.nvlink_only);
    assert!(rs.rings.len() >= 2);
    for r in &rs.rings {
        check_ring(r, 8);
        for i in 0..8 {
            let p = t.path(gpus[r[i]], gpus[r[(i + 1) % 8]]);
            assert!(
                matches!(p.class, PathClass::Nv(_)),
                "{r:?}: hop {i} is {}",
                p.class
            );
        }
    }
    // Six NVLinks of 20 GB/s per GPU: rings can use all of them.
    assert!(rs.total_bw() >= 80.0 - 1e-9, "{}", rs.total_bw());
    assert!(rs.total_bw() <= 120.0 + 1e-9);
}

#[test]
fn nvswitch_ring_uses_the_whole_port() {
    let t = Topology::preset("hgx-h100", 1).unwrap();
    let rs = search_rings(&t, &t.gpus(), 16);
    assert!(rs.nvlink_only);
    assert!((rs.total_bw() - 370.8).abs() < 1e-6);
    check_ring(&rs.rings[0], 8);
}

#[test]
fn pcie_ring_keeps_sockets_together() {
    let t = Topology::preset("pcie-8gpu", 1).unwrap();
    let gpus = t.gpus();
    let rs = search_rings(&t, &gpus, 16);
    assert!(!rs.nvlink_only);
    for r in &rs.rings {
        check_ring(r, 8);
        let sys = (0..8)
            .filter(|&i| t.path(gpus[r[i]], gpus[r[(i + 1) % 8]]).class == PathClass::Sys)
            .count();
        assert_eq!(sys, 2, "{r:?}");
    }
    assert!((rs.total_bw() - 10.0).abs() < 1e-9);
}

#[test]
fn shared_files_get_rings() {
    for f in [
        "azure-ndv2.xml",
        "azure-ndv4.xml",
        "azure-ndv5.xml",
        "azure-ncv4.xml",
    ] {
        let t = Topology::from_xml_file(format!(
            "{}/tests/topologies/{f}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let rs = search_rings(&t, &t.gpus(), 16);
        assert!(rs.total_bw() > 0.0, "{f}");
        check_ring(&rs.rings[0], t.gpus().len());
    }
}

#[test]
fn single_gpu_ring() {
    let t = Topology::preset("single-gpu", 1).unwrap();
    let rs = search_rings(&t, &t.gpus(), 16);
    assert_eq!(rs.rings, vec![vec![0]]);
}

#[test]
fn binary_trees_are_trees() {
    for n in 1..=70 {
        let t = binary_tree(n);
        assert_eq!(t.iter().filter(|p| p.is_none()).count(), 1);
        let ch = children(&t);
        assert!(ch.iter().all(|c| c.len() <= 2), "n={n}");
        // Balanced: depth is about log2(n) (+1 for the root above).
        assert!(depth(&t) <= (n as f64).log2().ceil() as usize + 1, "n={n}");
        let [a, b] = double_binary_tree(n);
        assert_eq!(b.iter().filter(|p| p.is_none()).count(), 1);
        assert!(children(&b).iter().all(|c| c.len() <= 2));
        if n >= 4 && n % 2 == 0 {
            // Every rank is a leaf in at least one of the two trees.
            let (ca, cb) = (children(&a), children(&b));
            assert!(
                (0..n).all(|r| ca[r].is_empty() || cb[r].is_empty()),
                "n={n}"
            );
        }
    }
}
