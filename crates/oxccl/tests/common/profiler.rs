//! The profiler plugin tests' shared body: our plugin (`tests/c/
//! profiler_plugin.c`, built for one interface version) hears a host
//! run's launches in order.

use std::path::PathBuf;
use std::process::Command;

use oxccl::{group, RedOp};

/// Builds the plugin (`-DPLUGIN_V4` for the v4 interface) with the system
/// C compiler into `dir`.
pub fn build_plugin(dir: &std::path::Path, v4: bool) -> PathBuf {
    let lib = dir.join("libnccl-profiler-test.so");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/profiler_plugin.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(cc);
    cmd.args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-lpthread");
    if v4 {
        cmd.arg("-DPLUGIN_V4");
    }
    assert!(cmd.status().expect("running the C compiler").success());
    lib
}

/// How many Send/Recv events `rank` heard.
fn got_p2p(text: &str, rank: u32) -> usize {
    text.lines()
        .filter(|l| l.starts_with(&format!("{rank} start p2p")))
        .count()
}

/// Runs two host ranks under the plugin: an AllReduce, then a group of a
/// Send/Recv pair and an AllReduce; checks each rank's events.
pub fn plugin_hears_launches_in_order(v4: bool) {
    let dir = std::env::temp_dir().join(format!("oxccl-prof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = build_plugin(&dir, v4);
    let out = dir.join("events.txt");
    std::env::set_var("NCCL_PROFILER_PLUGIN", &lib);
    std::env::set_var("PROFILER_OUT", &out);

    let comms = super::host(2);
    super::on_ranks(&comms, |c| {
        let send = [1.0f32; 8];
        let mut recv = [0.0f32; 8];
        c.all_reduce(&send[..], &mut recv[..], RedOp::Sum).unwrap();
        let p2p = [c.rank() as i32; 5];
        let mut got = [0i32; 5];
        let a = [2i32; 3];
        let mut b = [0i32; 3];
        // One launch: Send/Recv ride with the group's collective of their
        // type.
        group(|g| {
            g.all_reduce(c, &a[..], &mut b[..], RedOp::Sum)?;
            if c.rank() == 0 {
                g.send(c, &p2p[..], 1)
            } else {
                g.recv(c, &mut got[..], 0)
            }
        })
        .unwrap();
        assert_eq!(b, [4; 3]);
    });
    drop(comms);

    let text = std::fs::read_to_string(&out).unwrap();
    for rank in 0..2 {
        let mine: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{rank} ")))
            .map(str::to_string)
            .collect();
        let ids: Vec<&str> = mine
            .iter()
            .filter_map(|l| l.strip_prefix("start "))
            .map(|l| l.split(' ').nth(1).unwrap())
            .collect();
        assert_eq!(ids.len(), 5, "rank {rank}: {text}");
        assert_eq!(got_p2p(&text, rank), 1, "{text}");
        let (g1, c1, g2) = (ids[0], ids[1], ids[2]);
        let (c2, p) = (ids[3], ids[4]);
        let (func, peer) = if rank == 0 { ("Send", 1) } else { ("Recv", 0) };
        let want = [
            "init nranks=2".to_string(),
            format!("start group {g1} parent=0"),
            format!("start coll {c1} parent={g1} AllReduce seq=0 count=8 root=0 ncclFloat32 RING SIMPLE ch=1"),
            format!("stop {c1}"),
            format!("stop {g1}"),
            format!("start group {g2} parent=0"),
            format!("start coll {c2} parent={g2} AllReduce seq=1 count=3 root=0 ncclInt32 RING SIMPLE ch=1"),
            format!("start p2p {p} parent={g2} {func} count=5 peer={peer} ncclInt32"),
            format!("stop {c2}"),
            format!("stop {p}"),
            format!("stop {g2}"),
            "finalize".to_string(),
        ];
        // The choice (algorithm, protocol, channels) is the selector's:
        // compare it apart, as present and upper case.
        let strip = |l: &str| -> String {
            match l.find(" ncclFloat32 ").or_else(|| l.find(" ncclInt32 ")) {
                Some(i) if l.contains("start coll") => {
                    let (head, tail) = l.split_at(i);
                    let mut t = tail.split(' ').filter(|s| !s.is_empty());
                    let ty = t.next().unwrap();
                    let rest: Vec<&str> = t.collect();
                    assert_eq!(rest.len(), 3, "{l}");
                    assert!(rest[0].chars().all(|c| c.is_ascii_uppercase()), "{l}");
                    assert!(rest[2].starts_with("ch="), "{l}");
                    format!("{head} {ty}")
                }
                _ => l.to_string(),
            }
        };
        let got: Vec<String> = mine.iter().map(|l| strip(l)).collect();
        let want: Vec<String> = want.iter().map(|l| strip(l)).collect();
        assert_eq!(got, want, "rank {rank}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
