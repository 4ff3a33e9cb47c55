//! Merging the CUDA driver's facts (synthetic here: no GPU needed).

use oxccl_topo::detect::detect_with;
use oxccl_topo::select::Selector;
use oxccl_topo::{DriverFacts, DriverGpu, P2pFacts, PathClass, Topology};

fn p2p(ok: bool) -> P2pFacts {
    P2pFacts {
        access_supported: ok,
        native_atomics: ok,
        performance_rank: 0,
    }
}

/// Facts for the given bus ids as ordinals 0.., with `access(i, j)`.
fn facts(buses: &[String], access: impl Fn(usize, usize) -> bool) -> DriverFacts {
    let n = buses.len();
    DriverFacts {
        devices: buses
            .iter()
            .enumerate()
            .map(|(i, b)| DriverGpu {
                ordinal: i as u32,
                // The driver's spelling: upper case, 4-digit domain.
                pci_bus_id: b.to_ascii_uppercase(),
                sm: (9, 0),
                name: "NVIDIA H100".into(),
                memory_bytes: 80 << 30,
                // Unknown here (the model's view stays the table's); the
                // bandwidth test below sets them.
                mem_bus_bits: 0,
                mem_clock_khz: 0,
                sm_count: 0,
            })
            .collect(),
        p2p: (0..n)
            .map(|i| (0..n).map(|j| p2p(access(i, j))).collect())
            .collect(),
    }
}

fn buses(t: &Topology) -> Vec<String> {
    t.gpus()
        .iter()
        .map(|&g| t.nodes[g].busid().unwrap())
        .collect()
}

fn class(t: &Topology, a: usize, b: usize) -> PathClass {
    let g = t.gpus();
    t.path(g[a], g[b]).class
}

#[test]
fn full_access_changes_nothing_the_model_sees() {
    let before = Topology::preset("hgx-h100", 1).unwrap();
    let mut t = before.clone();
    t.merge_driver_facts(&facts(&buses(&before), |_, _| true));
    assert_eq!(buses(&t), buses(&before));
    assert_eq!(t.gpu_matrix(), before.gpu_matrix());
    assert!(matches!(class(&t, 0, 7), PathClass::NvSwitch(_)));
    assert_eq!(Topology::from_xml_str(&t.to_xml_string()).unwrap(), t);
}

#[test]
fn no_peer_access_goes_through_the_cpu() {
    let base = Topology::preset("hgx-h100", 1).unwrap();
    let mut t = base.clone();
    t.merge_driver_facts(&facts(&buses(&base), |_, _| false));
    for a in 0..8 {
        assert_eq!(class(&t, a, a), PathClass::X);
        for b in (0..8).filter(|&b| b != a) {
            let c = class(&t, a, b);
            assert!(c.rank() >= PathClass::Phb.rank(), "{a}-{b}: {c}");
            assert!(!c.p2p_ok());
        }
    }
    let s = Selector::new(&t, &(0..8).collect::<Vec<_>>());
    assert!(!s.shape().direct_ok && !s.shape().ll128_ok);
    assert!(!s.ring_set().nvlink_only);
    // The marks survive an XML round trip (the --dump of `cargo xtask topo`).
    let back = Topology::from_xml_str(&t.to_xml_string()).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.gpu_matrix(), t.gpu_matrix());
}

#[test]
fn one_blocked_pair_under_a_switch_and_unblocking() {
    let base = Topology::preset("pcie-8gpu", 1).unwrap();
    let b = buses(&base);
    let shared = class(&base, 0, 1);
    assert!(shared.p2p_ok(), "{shared}");
    // Access blocked one way only still blocks the pair.
    let mut t = base.clone();
    t.merge_driver_facts(&facts(&b, |i, j| !(i == 0 && j == 1)));
    assert_eq!(class(&t, 0, 1), PathClass::Phb);
    assert_eq!(class(&t, 1, 0), PathClass::Phb);
    let p = t.path(t.gpus()[0], t.gpus()[1]);
    assert!(p.hops > base.path(base.gpus()[0], base.gpus()[1]).hops);
    for (x, y) in [(0, 2), (1, 2), (2, 3), (4, 7)] {
        assert_eq!(class(&t, x, y), class(&base, x, y), "{x}-{y}");
    }
    // The driver later says yes (e.g. after a reconfiguration): mark gone.
    t.merge_driver_facts(&facts(&b, |_, _| true));
    assert_eq!(t.gpu_matrix(), base.gpu_matrix());
}

#[test]
fn ordinals_follow_the_driver_and_hidden_gpus_go_last() {
    let base = Topology::preset("hgx-h100", 1).unwrap();
    let b = buses(&base);
    // CUDA_VISIBLE_DEVICES=5,2
    let mut t = base.clone();
    t.merge_driver_facts(&facts(&[b[5].clone(), b[2].clone()], |_, _| true));
    let now = buses(&t);
    assert_eq!(now.len(), 8);
    assert_eq!(&now[..2], &[b[5].clone(), b[2].clone()]);
    let mut rest = now[2..].to_vec();
    rest.sort();
    let mut want: Vec<String> = b
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 5 && *i != 2)
        .map(|(_, x)| x.clone())
        .collect();
    want.sort();
    assert_eq!(rest, want);
    assert!(class(&t, 0, 1).is_nvlink());
}

#[test]
fn gpus_nvml_and_sysfs_missed_are_added() {
    let mut t = detect_with(std::path::Path::new("/nonexistent-sysfs-root"), false);
    assert!(t.gpus().is_empty());
    let b = vec!["0000:1b:00.0".to_string(), "0000:3d:00.0".to_string()];
    t.merge_driver_facts(&facts(&b, |_, _| true));
    assert_eq!(buses(&t), b);
    assert_eq!(t.nodes[t.gpus()[1]].sm(), 90);
    let c = class(&t, 0, 1);
    assert_eq!(c, PathClass::Phb);
    let s = Selector::new(&t, &[0, 1, 1]);
    assert_eq!(s.class_between(1, 2), Some(PathClass::X));
    assert_eq!(s.class_between(0, 1), Some(PathClass::Phb));
    assert_eq!(Topology::from_xml_str(&t.to_xml_string()).unwrap(), t);
    // Merging the same facts again is a no-op.
    let again = {
        let mut u = t.clone();
        u.merge_driver_facts(&facts(&b, |_, _| true));
        u
    };
    assert_eq!(again, t);
}

#[test]
fn odd_facts_never_panic() {
    let base = Topology::preset("dgx1", 2).unwrap();
    let b = buses(&base);
    let mut t = base.clone();
    // A P2P matrix of the wrong shape is ignored; an empty fact set is a no-op.
    let mut f = facts(&b[..3], |_, _| false);
    f.p2p.pop();
    t.merge_driver_facts(&f);
    assert_eq!(t.gpu_matrix(), base.gpu_matrix());
    t.merge_driver_facts(&DriverFacts::default());
    assert_eq!(t.gpus().len(), 16);
    let mut e = Topology::empty();
    e.merge_driver_facts(&facts(&b[..1], |_, _| true));
    assert_eq!(e.gpus().len(), 1);
}

/// A GPU's memory bandwidth comes from the driver's bus width and clock,
/// not a table: an H100 SXM (5120 bits at 2.619 GHz: 3352 GB/s peak)
/// copies at about 1436 GB/s in the model, whatever its PCI id; without
/// those attributes the table (or the compute capability) answers.
#[test]
fn memory_bandwidth_comes_from_device_attributes() {
    let mut t = Topology::preset("hgx-h100", 1).unwrap();
    let g = t.gpus()[0];
    let before = t.local_bw(g);
    let bs = buses(&t);
    // No attributes: the table's answer.
    let mut u = t.clone();
    u.merge_driver_facts(&facts(&bs, |_, _| true));
    assert_eq!(u.local_bw(u.gpus()[0]), before);
    let mut f = facts(&bs, |_, _| true);
    for d in &mut f.devices {
        (d.mem_bus_bits, d.mem_clock_khz, d.sm_count) = (5120, 2_619_000, 132);
    }
    t.merge_driver_facts(&f);
    let after = t.local_bw(g);
    assert!((1400.0..1470.0).contains(&after), "{after}");
    assert!((after - before).abs() > 1.0, "{before} -> {after}");
}
