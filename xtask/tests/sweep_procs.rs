//! `cargo xtask sweep` with ranks as processes, on the host backend:
//! `--procs` launching its own ranks, and `--from-env` ranks started by
//! someone else under Open MPI's and Slurm's variables.

use std::process::{Command, Output, Stdio};

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");
const SMALL: &[&str] = &[
    "sweep",
    "--backend",
    "host",
    "-b",
    "1K",
    "-e",
    "16K",
    "-f",
    "16",
    "-n",
    "1",
    "-w",
    "1",
];

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The table's rows (lines that do not start with `#`).
fn rows(out: &str) -> Vec<&str> {
    out.lines()
        .take_while(|l| !l.starts_with("--- stderr"))
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect()
}

#[test]
fn procs_launches_its_ranks_and_rank_zero_prints_every_collective() {
    let o = Command::new(XTASK)
        .args(SMALL)
        .args(["--procs", "3"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("3 ranks as processes"), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    // Printed once (rank 0 only), every collective.
    assert_eq!(t.matches("# oxccl sweep:").count(), 1, "{t}");
    for c in [
        "allreduce",
        "broadcast",
        "reduce",
        "allgather",
        "reducescatter",
        "alltoall",
        "gather",
        "scatter",
        "sendrecv",
    ] {
        assert!(
            t.contains(&format!("# Collective: {c}")),
            "{c} missing:\n{t}"
        );
    }
    assert_eq!(rows(&t).len(), 9 * 2, "{t}");
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn from_env_ranks_under_open_mpi_and_slurm_variables() {
    for launcher in ["openmpi", "slurm"] {
        let (n, port) = (2u32, free_port());
        let kids: Vec<_> = (0..n)
            .map(|r| {
                let mut c = Command::new(XTASK);
                c.args(SMALL)
                    .args(["--coll", "allreduce,alltoall", "--from-env"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for v in oxccl::LaunchEnv::vars() {
                    c.env_remove(v);
                }
                let env = oxccl::LaunchEnv {
                    launcher,
                    rank: r,
                    nranks: n,
                    local_rank: r,
                    root: format!("127.0.0.1:{port}"),
                };
                c.envs(env.to_vars().unwrap());
                c.spawn().unwrap()
            })
            .collect();
        let outs: Vec<Output> = kids
            .into_iter()
            .map(|k| k.wait_with_output().unwrap())
            .collect();
        for o in &outs {
            assert!(o.status.success(), "{}", text(o));
        }
        let t0 = text(&outs[0]);
        assert!(
            t0.contains("2 ranks as processes") && t0.contains("0 OK"),
            "{t0}"
        );
        assert_eq!(rows(&t0).len(), 4, "{t0}");
        // Only rank 0 prints.
        assert!(outs[1].stdout.is_empty(), "{}", text(&outs[1]));
    }
}
