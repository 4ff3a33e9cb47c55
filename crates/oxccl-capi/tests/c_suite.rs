//! The C suite (`tests/c/suite.c`), compiled against `include/nccl.h` and
//! linked with the built `libnccl.so.2`, run as several processes on the
//! host backend: every collective, type and op, groups, split, abort,
//! nonblocking init, every config layout, bad arguments.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;

/// The suite's executable, built once per test process.
fn suite() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = common::scratch("suite");
        let lib = common::nccl_dir(&dir);
        let exe = dir.join("suite");
        let mut cmd = common::compiler(&dir).to_command();
        cmd.arg("-std=c11")
            .arg("-D_DEFAULT_SOURCE")
            .arg("-Wall")
            .arg("-Werror")
            .arg("-O1")
            .arg("-I")
            .arg(common::include_dir())
            .arg("-o")
            .arg(&exe)
            .arg(common::manifest().join("tests/c/suite.c"))
            .arg(format!("-L{}", lib.display()))
            .arg("-lnccl")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lpthread")
            .arg("-lm");
        common::run_ok(&mut cmd, "compiling the C suite");
        exe
    })
}

/// Runs `scenario` as `n` processes and fails with their output unless
/// every one exits 0 within `limit`.
fn run(scenario: &str, n: u32, env: &[(&str, &str)], limit: Duration) {
    run_killing(scenario, n, env, limit, None)
}

/// As [`run`], except that rank `killed` must die by SIGKILL (the
/// scenario kills it) instead of exiting 0.
fn run_killing(scenario: &str, n: u32, env: &[(&str, &str)], limit: Duration, killed: Option<u32>) {
    let exe = suite();
    // A folder per run: tests of one scenario may run at once.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let k = RUNS.fetch_add(1, Ordering::Relaxed);
    let dir = common::scratch(&format!("{scenario}-{n}-{k}"));
    let children: Vec<(u32, Child)> = (0..n)
        .map(|r| {
            let mut c = Command::new(exe);
            c.args([scenario, &r.to_string(), &n.to_string()])
                .arg(&dir)
                .env("OXCCL_BACKEND", "host")
                .env_remove("NCCL_COMM_ID")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            (r, c.spawn().expect("spawn the C suite"))
        })
        .collect();
    let deadline = Instant::now() + limit;
    let mut report = String::new();
    let mut failed = false;
    for (r, mut child) in children {
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let out = child.wait_with_output().expect("output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let want_killed = killed == Some(r);
        match status {
            Some(s) if want_killed && s.signal() == Some(9) => {}
            Some(s) if s.success() && !want_killed => {}
            Some(s) => {
                failed = true;
                report += &format!("--- rank {r} exited with {s}:\n{text}\n");
            }
            None => {
                failed = true;
                report += &format!("--- rank {r} was killed after {limit:?}:\n{text}\n");
            }
        }
    }
    assert!(!failed, "{scenario} on {n} processes failed:\n{report}");
}

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn the_checker_sees_doubled_zeroed_and_dropped_results() {
    run("selftest", 1, &[], LIMIT);
}

#[test]
fn every_collective_type_and_op_on_four_processes() {
    run("colls", 4, &[], LIMIT);
}

#[test]
fn every_collective_type_and_op_on_two_processes() {
    run("colls", 2, &[], LIMIT);
}

#[test]
fn newer_calls_twins_stats_suspend_and_revoke() {
    run("newer", 3, &[], LIMIT);
}

#[test]
fn grow_adds_a_process_to_a_communicator() {
    run("grow", 3, &[], LIMIT);
}

#[test]
fn groups_send_recv_and_several_communicators() {
    run("groups", 3, &[], LIMIT);
}

#[test]
fn split_nocolor_and_shrink() {
    run("split", 4, &[], LIMIT);
}

#[test]
fn scalable_init_over_two_ids() {
    // Ranks 0-1 meet at the first id's root, 2-3 at the second's; bad
    // nId, ids and comm pointers are refused first.
    run("scalable", 4, &[], LIMIT);
    run("scalable", 3, &[], LIMIT);
}

#[test]
fn shrink_without_a_killed_rank() {
    // Rank 3 is killed; ranks 0-2 shrink it away without it and run an
    // AllReduce on the new communicator, then shrink again without rank 0.
    run_killing("shrink_dead", 4, &[], LIMIT, Some(3));
}

#[test]
fn shrink_of_threads_without_the_excluded_rank() {
    // The deadline bounds the shrink whose other survivor never calls.
    run("shrink_threads", 1, &[("OXCCL_DEADLINE_MS", "3000")], LIMIT);
}

#[test]
fn a_killed_rank_that_was_not_expected_fails_the_harness() {
    // The harness can tell: a scenario whose rank 3 dies unexpectedly, or
    // whose expected victim survives, is reported.
    let r = std::panic::catch_unwind(|| run_killing("shrink_dead", 4, &[], LIMIT, None));
    assert!(r.is_err(), "an unexpected SIGKILL passed");
    let r = std::panic::catch_unwind(|| run_killing("selftest", 1, &[], LIMIT, Some(0)));
    assert!(
        r.is_err(),
        "a rank expected to be killed exited 0 and passed"
    );
}

#[test]
fn abort_fails_the_peers_promptly() {
    run("abort", 3, &[("OXCCL_DEADLINE_MS", "3000")], LIMIT);
}

/// Through the C ABI a wait has no deadline by default; an abort from
/// another thread ends it, and the wait's warning reaches stderr with no
/// debug variable set.
#[test]
fn abort_from_another_thread_ends_a_wait_without_deadline() {
    run(
        "abort_thread",
        2,
        &[
            ("OXCCL_WAIT_WARN_MS", "200"),
            ("OXCCL_WAIT_WARN_EVERY_MS", "200"),
        ],
        LIMIT,
    );
}

/// A collective the C ABI refuses on one rank fails the peers' matching
/// calls at once, naming that rank (no deadline is configured).
#[test]
fn a_refused_call_fails_the_peers_at_once() {
    run("refused", 3, &[], LIMIT);
}

/// Calls the C ABI refuses inside a group (a collective, then a Send)
/// fail the peer's group end at once, naming the rank and the reason; so
/// does a lone Send refused outside a group, for the peer's Recv.
#[test]
fn a_call_refused_in_a_group_fails_the_peers_group_end() {
    run("group_refused", 2, &[], LIMIT);
}

#[test]
fn nonblocking_init_polled_from_two_threads() {
    run("nonblocking", 2, &[], LIMIT);
}

#[test]
fn nonblocking_split_and_group_end_finish_in_the_background() {
    run("nonblocking_split", 3, &[], LIMIT);
}

#[test]
fn a_group_on_several_streams() {
    run("streams", 3, &[], LIMIT);
}

#[test]
fn every_config_layout_from_2_17_to_2_30() {
    run("configs", 1, &[], LIMIT);
}

#[test]
fn windows_on_processes_and_threads() {
    run("windows", 3, &[], LIMIT);
}

#[test]
fn bad_arguments_are_refused_and_nothing_is_written() {
    run("badargs", 1, &[], LIMIT);
}

#[test]
fn nccl_comm_id_names_the_root() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let id = format!("127.0.0.1:{port}");
    run("commid", 3, &[("NCCL_COMM_ID", &id)], LIMIT);
}

#[test]
fn a_failing_scenario_is_reported() {
    // The harness itself can fail: an unknown scenario exits non-zero.
    let r = std::panic::catch_unwind(|| run("no-such-scenario", 1, &[], LIMIT));
    assert!(r.is_err(), "the harness passed a failing process");
}

#[test]
fn the_latency_program_runs_on_the_host_backend() {
    // tests/c/latency.c measures 8 B AllReduce through the C ABI on the
    // GPU machine; here it is built and run on host memory so it cannot rot.
    let dir = common::scratch("latency");
    let lib = common::nccl_dir(&dir);
    let exe = dir.join("latency");
    let mut cmd = common::compiler(&dir).to_command();
    cmd.args([
        "-std=c11",
        "-D_DEFAULT_SOURCE",
        "-Wall",
        "-Werror",
        "-O1",
        "-I",
    ])
    .arg(common::include_dir())
    .arg("-o")
    .arg(&exe)
    .arg(common::manifest().join("tests/c/latency.c"))
    .arg(format!("-L{}", lib.display()))
    .arg("-lnccl")
    .arg(format!("-Wl,-rpath,{}", lib.display()))
    .arg("-ldl");
    common::run_ok(&mut cmd, "compiling the latency program");
    let out = Command::new(&exe)
        .args(["2", "20"])
        .env("OXCCL_BACKEND", "host")
        // Bounds every wait of the two ranks (init included).
        .env("OXCCL_DEADLINE_MS", "20000")
        .env_remove("NCCL_COMM_ID")
        .output()
        .expect("run the latency program");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("c-abi allreduce 8 B, 2 procs: median"),
        "{}{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
