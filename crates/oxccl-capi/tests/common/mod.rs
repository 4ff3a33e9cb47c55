//! What the C tests share: where the built library and the header are,
//! a C compiler from the `cc` crate, scratch folders.
#![allow(dead_code)]

pub mod calls;

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn include_dir() -> PathBuf {
    manifest().join("include")
}

/// `target/<profile>`: the test binary lives in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The cdylib cargo built for these tests: `cargo test` leaves it in
/// `deps/` (only `cargo build` copies it up to the profile folder, so
/// that copy may be stale).
pub fn built_library() -> PathBuf {
    let lib = profile_dir().join("deps").join("liboxccl_capi.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo builds it with the tests",
        lib.display()
    );
    lib
}

/// A fresh folder under the target dir for this test process.
pub fn scratch(name: &str) -> PathBuf {
    let d = profile_dir()
        .join("capi-tests")
        .join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// A folder holding `libnccl.so.2` and `libnccl.so` as links to the built
/// library, to link and load as a client would.
pub fn nccl_dir(under: &Path) -> PathBuf {
    let d = under.join("lib");
    std::fs::create_dir_all(&d).expect("lib dir");
    let lib = built_library();
    for name in ["libnccl.so.2", "libnccl.so"] {
        let _ = std::fs::remove_file(d.join(name));
        std::os::unix::fs::symlink(&lib, d.join(name)).expect("symlink");
    }
    d
}

/// The C compiler `cc` would use for this target.
pub fn compiler(out: &Path) -> cc::Tool {
    tool(out, false)
}

/// The C++ compiler `cc` would use for this target.
pub fn compiler_cpp(out: &Path) -> cc::Tool {
    tool(out, true)
}

fn tool(out: &Path, cpp: bool) -> cc::Tool {
    cc::Build::new()
        .cpp(cpp)
        .target(env!("OXCCL_CAPI_TARGET"))
        .host(env!("OXCCL_CAPI_HOST"))
        .opt_level(1)
        .debug(false)
        .cargo_metadata(false)
        .out_dir(out)
        .get_compiler()
}

/// Runs `cmd`, failing with its output unless it succeeds.
pub fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
