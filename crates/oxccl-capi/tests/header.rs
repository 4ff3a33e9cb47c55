//! `include/nccl.h` compiles as C and C++, with and without a
//! `cuda_runtime.h` on the include path, and has NCCL 2.28's values,
//! sizes and offsets (checked at compile time by `tests/c/abi_check.c`).

use std::path::Path;

mod common;

fn compile(cpp: bool, with_cuda: bool) -> Result<(), String> {
    let dir = common::scratch(&format!("header-{cpp}-{with_cuda}"));
    let src = common::manifest().join("tests/c/abi_check.c");
    let tool = if cpp {
        common::compiler_cpp(&dir)
    } else {
        common::compiler(&dir)
    };
    let mut cmd = tool.to_command();
    if cpp {
        cmd.arg("-x").arg("c++").arg("-std=c++17");
    } else {
        cmd.arg("-std=c11");
    }
    cmd.args(["-Wall", "-Werror", "-pedantic", "-c", "-o"])
        .arg(dir.join("abi_check.o"))
        .arg("-I")
        .arg(common::include_dir());
    if with_cuda {
        cmd.arg("-I")
            .arg(common::manifest().join("tests/c/fake_cuda"))
            .arg("-DEXPECT_CUDA_RUNTIME");
    }
    cmd.arg(&src);
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn header_compiles_without_cuda_as_c_and_cpp() {
    compile(false, false).unwrap();
    compile(true, false).unwrap();
}

#[test]
fn header_uses_cuda_runtime_when_present() {
    compile(false, true).unwrap();
    compile(true, true).unwrap();
}

#[test]
fn the_abi_checks_can_fail() {
    // The same file, told a toolkit header is there when none is, must
    // be refused: the checks are live.
    let dir = common::scratch("header-neg");
    let mut cmd = common::compiler(&dir).to_command();
    cmd.args(["-std=c11", "-fsyntax-only", "-DEXPECT_CUDA_RUNTIME", "-I"])
        .arg(common::include_dir())
        .arg(common::manifest().join("tests/c/abi_check.c"));
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "a false expectation compiled");
    assert!(Path::new(&common::include_dir().join("nccl.h")).exists());
}
