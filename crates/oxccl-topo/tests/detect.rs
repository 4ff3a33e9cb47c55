//! Detection never panics, and reads a (fake) sysfs tree.

use std::fs;
use std::path::Path;

use oxccl_topo::detect::detect_with;
use oxccl_topo::{PathClass, Topology};

fn write(root: &Path, rel: &str, v: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, v).unwrap();
}

/// Detection never panics on a sysfs tree full of nonsense (bad numbers,
/// empty files, a dangling link, a NUMA node that is not one), and what it
/// finds writes and reads back. A fake tree, not the live `/sys`: the
/// result must not depend on the machine running the test.
#[test]
fn malformed_sysfs_never_panics() {
    let root = std::env::temp_dir().join(format!("oxccl-bad-sys-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    write(&root, "devices/system/node/node0/cpumap", "not hex\n");
    write(&root, "devices/system/node/nodeX/cpumap", "ff\n");
    write(
        &root,
        "devices/system/node/node99999999999999999999/cpumap",
        "",
    );
    let devs = root.join("bus/pci/devices");
    fs::create_dir_all(&devs).unwrap();
    for (i, (class, vendor, numa, speed, width)) in [
        ("0x030200", "0x10de", "-1", "fast", "wide"),
        ("garbage", "", "99999999999999999999", "", ""),
        ("0x060400", "0x1000", "1", "16.0 GT/s PCIe", "-16"),
        ("", "0x10de", "abc", "2.5 GT/s", "0"),
    ]
    .into_iter()
    .enumerate()
    {
        let real = format!("devices/pci0000:00/0000:0{i}:00.0");
        for (f, v) in [
            ("class", class),
            ("vendor", vendor),
            ("device", "0x2330"),
            ("numa_node", numa),
            ("max_link_speed", speed),
            ("max_link_width", width),
        ] {
            write(&root, &format!("{real}/{f}"), v);
        }
        let _ = std::os::unix::fs::symlink(root.join(&real), devs.join(format!("0000:0{i}:00.0")));
    }
    let _ = std::os::unix::fs::symlink(root.join("nowhere"), devs.join("0000:0f:00.0"));
    let t = detect_with(&root, false);
    assert_eq!(t.nhosts(), 1);
    assert!(!t.cpus().is_empty());
    assert_eq!(Topology::from_xml_str(&t.to_xml_string()).unwrap(), t);
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn missing_sysfs_gives_host_with_no_gpu() {
    let t = detect_with(Path::new("/nonexistent-sysfs-root"), false);
    assert_eq!(t.nhosts(), 1);
    assert_eq!(t.cpus().len(), 1);
    assert!(t.gpus().is_empty());
    assert!(t.summary().contains("0 GPUs"));
}

/// Two NVIDIA GPUs behind one PCIe switch (upstream + two downstream
/// ports of the same vendor:device) on NUMA node 1, and a NIC on node 0.
#[test]
fn fake_sysfs_tree() {
    let root = std::env::temp_dir().join(format!("oxccl-fake-sys-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    for n in ["node0", "node1"] {
        write(&root, &format!("devices/system/node/{n}/cpumap"), "ff\n");
    }
    let dev = |bdf: &str, chain: &str, class: &str, vendor: &str, device: &str, numa: &str| {
        let real = format!("devices/pci0000:00/{chain}");
        for (f, v) in [
            ("class", class),
            ("vendor", vendor),
            ("device", device),
            ("numa_node", numa),
            ("max_link_speed", "16.0 GT/s PCIe"),
            ("max_link_width", "16"),
        ] {
            write(&root, &format!("{real}/{f}"), v);
        }
        fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        let link = root.join("bus/pci/devices").join(bdf);
        let _ = std::os::unix::fs::symlink(root.join(&real), link);
    };
    dev(
        "0000:00:01.0",
        "0000:00:01.0",
        "0x060400",
        "0x8086",
        "0x2030",
        "1",
    );
    dev(
        "0000:01:00.0",
        "0000:00:01.0/0000:01:00.0",
        "0x060400",
        "0x1000",
        "0xc010",
        "1",
    );
    dev(
        "0000:02:00.0",
        "0000:00:01.0/0000:01:00.0/0000:02:00.0",
        "0x060400",
        "0x1000",
        "0xc010",
        "1",
    );
    dev(
        "0000:02:01.0",
        "0000:00:01.0/0000:01:00.0/0000:02:01.0",
        "0x060400",
        "0x1000",
        "0xc010",
        "1",
    );
    dev(
        "0000:03:00.0",
        "0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
        "0x030200",
        "0x10de",
        "0x2330",
        "1",
    );
    dev(
        "0000:04:00.0",
        "0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
        "0x030200",
        "0x10de",
        "0x2330",
        "1",
    );
    dev(
        "0000:05:00.0",
        "0000:05:00.0",
        "0x020000",
        "0x15b3",
        "0x1017",
        "0",
    );
    let t = detect_with(&root, false);
    assert_eq!(t.cpus().len(), 2);
    assert_eq!(t.gpus().len(), 2);
    assert_eq!(t.nics().len(), 1);
    let m = t.gpu_matrix();
    assert_eq!(m[0][1].class, PathClass::Pix);
    assert_eq!(t.numa_of(t.gpus()[0]), 1);
    let (_, p) = t.nearest_nic(t.gpus()[0]).unwrap();
    assert_eq!(p.class, PathClass::Sys);
    assert_eq!(Topology::from_xml_str(&t.to_xml_string()).unwrap(), t);
    let _ = fs::remove_dir_all(&root);
}
