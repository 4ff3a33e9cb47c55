//! NCCL algorithm and protocol names oxccl lacks are ignored with a
//! warning that reaches stderr without any debug variable set: the test
//! re-runs itself as a child with the variables and reads its stderr.

use std::process::Command;

/// Set in the child: run the configuration read instead of spawning.
const CHILD: &str = "IGNORED_NAMES_TEST_CHILD";

fn child_stderr(vars: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for v in [
        "NCCL_DEBUG",
        "OXCCL_DEBUG",
        "NCCL_ALGO",
        "OXCCL_ALGO",
        "NCCL_PROTO",
        "OXCCL_PROTO",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The child: reads the environment and runs one call on one host rank.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let comms = oxccl::init_all(1).unwrap();
    let mut v = vec![1.0f32; 4];
    comms[0]
        .all_reduce_in_place(&mut v, oxccl::RedOp::Sum)
        .unwrap();
}

#[test]
fn nccl_only_names_warn_on_stderr_by_default() {
    let (ok, err) = child_stderr(&[
        ("OXCCL_BACKEND", "host"),
        ("NCCL_ALGO", "^NVLS,CollNetDirect"),
        ("NCCL_PROTO", "LL128"),
    ]);
    assert!(ok, "{err}");
    for name in ["\"NVLS\"", "\"CollNetDirect\"", "\"LL128\""] {
        let line = err.lines().find(|l| l.contains(name) && l.contains("WARN"));
        assert!(line.is_some_and(|l| l.contains("ignored")), "{name}: {err}");
    }
    // Once per process, though the value is read per init.
    assert_eq!(err.matches("\"LL128\" is").count(), 1, "{err}");
}

#[test]
fn debug_none_silences_the_warning() {
    let (ok, err) = child_stderr(&[
        ("OXCCL_BACKEND", "host"),
        ("NCCL_PROTO", "LL128"),
        ("NCCL_DEBUG", "NONE"),
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("LL128"), "{err}");
}

#[test]
fn a_filter_left_empty_fails_naming_the_variable() {
    let (ok, err) = child_stderr(&[("OXCCL_BACKEND", "host"), ("NCCL_PROTO", "^Simple,LL128")]);
    assert!(!ok, "{err}");
    assert!(err.contains("NCCL_PROTO"), "{err}");
}
