//! NVTX ranges seen by a tool of our own (`tests/c/nvtx_tool.c`),
//! attached as a profiler attaches one: through `NVTX_INJECTION64_PATH`.
//! One test per binary: tools attach once per process.

use std::collections::HashMap;

use oxccl::{group, RedOp};

mod common;

#[path = "c/nvtx_tool.rs"]
mod nvtx_tool;
use nvtx_tool::build_tool;

#[test]
fn a_tool_sees_init_collective_and_group_ranges_with_their_arguments() {
    let dir = std::env::temp_dir().join(format!("oxccl-nvtx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = build_tool(&dir);
    let out = dir.join("ranges.txt");
    std::env::set_var("NVTX_INJECTION64_PATH", &lib);
    std::env::set_var("NVTX_TOOL_OUT", &out);
    std::env::remove_var("NCCL_NVTX_DISABLE");

    let comms = common::host(2);
    common::on_ranks(&comms, |c| {
        let send = [1.0f32; 8];
        let mut recv = [0.0f32; 8];
        c.all_reduce(&send[..], &mut recv[..], RedOp::Sum).unwrap();
        assert_eq!(recv, [2.0; 8]);
        let a = [1i64; 3];
        let mut b = [0i64; 3];
        group(|g| g.all_reduce(c, &a[..], &mut b[..], RedOp::Max)).unwrap();
        assert_eq!(b, [1; 3]);
    });
    comms[0].destroy();

    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"create NCCL"), "{text}");
    assert!(!text.contains("bad"), "{text}");
    // Every thread's pushes and pops balance, never below zero.
    let mut depth: HashMap<&str, i32> = HashMap::new();
    let mut pushes = Vec::new();
    for l in &lines[1..] {
        let mut w = l.splitn(4, ' ');
        match (w.next(), w.next()) {
            (Some("push"), Some(t)) => {
                *depth.entry(t).or_default() += 1;
                let payload: u64 = w.next().unwrap().parse().unwrap();
                pushes.push((payload, w.next().unwrap()));
            }
            (Some("pop"), Some(t)) => {
                let d = depth.entry(t).or_default();
                *d -= 1;
                assert!(*d >= 0, "{text}");
            }
            _ => panic!("unexpected line {l:?} in\n{text}"),
        }
    }
    assert!(depth.values().all(|&d| d == 0), "{text}");
    let has = |payload: u64, msg: &str| {
        pushes
            .iter()
            .any(|&(p, m)| p == payload && m.starts_with(msg))
    };
    assert!(has(0, "ncclCommInitAll rank=0 nranks=2"), "{text}");
    for rank in 0..2 {
        let ar = "ncclAllReduce count=8 datatype=ncclFloat32 op=ncclSum comm=0x";
        assert!(
            pushes.iter().any(|&(p, m)| p == 8
                && m.starts_with(ar)
                && m.ends_with(&format!("rank={rank} nranks=2"))),
            "no AllReduce range of rank {rank}: {text}"
        );
        let gr = "ncclAllReduce count=3 datatype=ncclInt64 op=ncclMax";
        assert!(
            pushes.iter().any(|&(p, m)| p == 3
                && m.starts_with(gr)
                && m.ends_with(&format!("rank={rank} nranks=2"))),
            "no grouped AllReduce range of rank {rank}: {text}"
        );
    }
    let count = |msg: &str| pushes.iter().filter(|(_, m)| *m == msg).count();
    assert_eq!(count("ncclGroupStart"), 2, "{text}");
    assert_eq!(count("ncclGroupEnd"), 2, "{text}");
    assert!(has(0, "ncclCommDestroy comm=0x"), "{text}");
    // The group's launch is inside ncclGroupEnd: no second AllReduce range.
    assert_eq!(
        pushes
            .iter()
            .filter(|(_, m)| m.starts_with("ncclAllReduce"))
            .count(),
        4,
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
