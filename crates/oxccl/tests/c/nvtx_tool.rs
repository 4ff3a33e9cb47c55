//! Builds `nvtx_tool.c` (an NVTX injection tool of the tests' own) with
//! the system C compiler (`CC`, else `cc`) into `dir`; shared by the NVTX
//! tests of this crate and of the C ABI's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built tool's path, `dir/libnvtx_tool.so`.
pub fn build_tool(dir: &Path) -> PathBuf {
    let src = dir.join("nvtx_tool.c");
    std::fs::write(&src, include_str!("nvtx_tool.c")).expect("writing the tool's source");
    let lib = dir.join("libnvtx_tool.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .expect("running the C compiler");
    assert!(st.success(), "compiling {}", src.display());
    lib
}
