//! Smoke tests of `cargo xtask sweep` through the built binary: a tiny
//! sweep over every collective is correct and prints nccl-tests' table,
//! and a bad flag fails with a clear error. Nothing about timing is
//! asserted.

use std::process::{Command, Output};

use oxccl_core::CollKind;

/// Runs `xtask sweep` on the host backend with `args`, every `OXCCL_*`
/// and `NCCL_*` variable and every launcher's (a test run inside a Slurm
/// step or under mpirun would otherwise join as one rank) removed from the
/// child's environment (this process's own is never changed), so the
/// result does not depend on what the caller's shell set.
fn sweep(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["sweep", "--backend", "host"]).args(args);
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if name.starts_with("OXCCL_") || name.starts_with("NCCL_") {
            cmd.env_remove(&var);
        }
    }
    for var in oxccl::LaunchEnv::vars().chain(["SLURM_STEP_ID"]) {
        cmd.env_remove(var);
    }
    cmd.output().expect("running the xtask binary")
}

/// The data rows of a sweep's table: lines that do not start with `#`.
fn rows(stdout: &str) -> Vec<Vec<&str>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

fn tiny_sweep_is_correct(ranks: &str) {
    let out = sweep(&[
        "--ranks", ranks, "-b", "8", "-e", "4K", "-f", "8", "-n", "1", "-w", "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{ranks} ranks: {stdout}\n{stderr}");
    let header = stdout
        .lines()
        .find(|l| l.contains("redop"))
        .expect("a column header");
    let cols: Vec<&str> = header.trim_start_matches('#').split_whitespace().collect();
    let want = [
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
        "algbw", "busbw", "#wrong",
    ];
    assert_eq!(cols, want, "{header}");
    for kind in CollKind::ALL {
        assert!(
            stdout.contains(&format!("# Collective: {kind}")),
            "{kind} missing:\n{stdout}"
        );
    }
    let table = rows(&stdout);
    assert!(table.len() >= CollKind::ALL.len(), "{stdout}");
    for row in &table {
        // size count type redop root, then (time algbw busbw #wrong) twice;
        // Send/Recv has no in-place half (N/A).
        assert_eq!(row.len(), 13, "{row:?}");
        assert_eq!(row[8], "0", "wrong elements out of place: {row:?}");
        assert!(row[12] == "0" || row[12] == "N/A", "in place: {row:?}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
}

#[test]
fn tiny_sweep_two_ranks_every_collective() {
    tiny_sweep_is_correct("2");
}

#[test]
fn tiny_sweep_three_ranks_every_collective() {
    tiny_sweep_is_correct("3");
}

#[test]
fn bad_algorithm_is_a_clear_error() {
    let out = sweep(&["--ranks", "2", "-b", "8", "-e", "8", "--algo", "warp"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--algo") && stderr.contains("warp"),
        "{stderr}"
    );
    assert!(
        rows(&String::from_utf8_lossy(&out.stdout)).is_empty(),
        "nothing should run"
    );
}

/// nccl-tests' `-c` is 0 or 1 here; `-c 2` was taken silently as a check.
#[test]
fn check_other_than_0_or_1_is_a_clear_error() {
    let out = sweep(&["--ranks", "2", "-b", "8", "-e", "8", "-c", "2"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--check") && stderr.contains("'2'") && stderr.contains("0 (do not check"),
        "{stderr}"
    );
    assert!(
        rows(&String::from_utf8_lossy(&out.stdout)).is_empty(),
        "nothing should run"
    );
}
