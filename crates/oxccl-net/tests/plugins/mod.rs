//! Builds the tests' own network plugin (`ours.c`, beside this file) with
//! the system C compiler into a shared library, once per variant and test
//! process. Shared by oxccl-net's tests and the facade's (which include
//! this file by path).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The plugin's C source.
pub fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("oxccl-net")
        .join("tests")
        .join("plugins")
        .join("ours.c")
}

/// The library built from `ours.c` with `defines` (`NAME` or
/// `NAME=VALUE`) under `dir`, named `libnccl-net-<name>.so`; built once
/// per process.
pub fn build(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    build_as(dir, &format!("libnccl-net-{name}.so"), defines)
}

/// [`build`] into the file `file` of `dir` (`libnccl-net.so`, say).
#[allow(dead_code)]
pub fn build_as(dir: &Path, file: &str, defines: &[&str]) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(dir).expect("plugin directory");
    let out = dir.join(file);
    let name = file;
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    let mut cc = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
    cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-o"])
        .arg(&tmp)
        .arg(source());
    for d in defines {
        cc.arg(format!("-D{d}"));
    }
    let res = cc.output().expect("running the C compiler (cc)");
    assert!(
        res.status.success(),
        "building plugin {name} with {defines:?} failed:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    // Renamed into place, so a concurrent test process never loads a
    // half-written library.
    std::fs::rename(&tmp, &out).expect("renaming the plugin into place");
    out
}
