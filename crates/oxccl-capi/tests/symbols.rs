//! The built library exports every function PyTorch 2.11 imports (a
//! missing one makes `import torch` fail: Python loads extensions with
//! RTLD_NOW) and the rest of NCCL 2.30's API, each with its `pnccl`
//! profiling twin, under NCCL's soname.

mod common;

/// The 38 `nccl*` symbols `libtorch_cuda.so` of PyTorch 2.11 imports.
const TORCH: [&str; 38] = [
    "ncclAllGather",
    "ncclAllReduce",
    "ncclAlltoAll",
    "ncclBcast",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommDeregister",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommRegister",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclSend",
];

/// The rest of NCCL 2.30's `nccl.h` (2.30.7 declares 63 functions; with
/// the torch list above and `ncclResetDebugInit` and the device
/// communicators, this library exports 66).
const OTHERS: [&str; 28] = [
    "ncclGather",
    "ncclScatter",
    "ncclCommCuDevice",
    "ncclResetDebugInit",
    "ncclCommSuspend",
    "ncclCommResume",
    "ncclCommRevoke",
    "ncclCommGetUniqueId",
    "ncclCommGrow",
    "ncclCommMemStats",
    "ncclWinGetUserPtr",
    "ncclPutSignal",
    "ncclSignal",
    "ncclWaitSignal",
    "ncclParamBind",
    "ncclParamGetI8",
    "ncclParamGetI16",
    "ncclParamGetI32",
    "ncclParamGetI64",
    "ncclParamGetU8",
    "ncclParamGetU16",
    "ncclParamGetU32",
    "ncclParamGetU64",
    "ncclParamGetStr",
    "ncclParamGet",
    "ncclParamGetParameter",
    "ncclParamGetAllParameterKeys",
    "ncclParamDumpAll",
];

#[test]
fn every_function_pytorch_and_the_header_name_is_exported() {
    let path = common::built_library();
    // SAFETY: loading our own library runs no initialisers beyond Rust's.
    let lib = unsafe { libloading::Library::new(&path) }.expect("load the built library");
    let twins: Vec<String> = TORCH
        .iter()
        .chain(&OTHERS)
        .map(|n| format!("p{n}"))
        .collect();
    let missing: Vec<&str> = TORCH
        .iter()
        .chain(&OTHERS)
        .copied()
        .chain(twins.iter().map(String::as_str))
        .filter(|name| {
            // SAFETY: only the symbol's presence is checked; it is not called.
            unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err()
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // The check can fail: a name the library does not have is reported.
    // SAFETY: as above.
    assert!(unsafe { lib.get::<*const ()>(b"ncclNoSuchFunction") }.is_err());
}

/// A C file that takes the address of each name in `names` and of its
/// `pnccl` twin; it compiles under `-Werror` only if the header declares
/// every one of them.
fn address_taker(names: &[&str]) -> String {
    let mut c = String::from("#include <nccl.h>\nvoid (*const oxccl_all[])(void) = {\n");
    for name in names {
        c += &format!("  (void (*)(void)){name},\n  (void (*)(void))p{name},\n");
    }
    c + "};\n"
}

fn compiles(names: &[&str], what: &str) -> bool {
    let dir = common::scratch(&format!("declares-{what}"));
    let src = dir.join("declares.c");
    std::fs::write(&src, address_taker(names)).unwrap();
    let out = common::compiler(&dir)
        .to_command()
        .args([
            "-std=c11",
            "-Wall",
            "-Werror",
            "-fsyntax-only",
            "-DOXCCL_NO_CUDA_RUNTIME",
            "-I",
        ])
        .arg(common::include_dir())
        .arg(&src)
        .output()
        .unwrap();
    out.status.success()
}

#[test]
fn the_header_declares_every_exported_function() {
    let all: Vec<&str> = TORCH.iter().chain(&OTHERS).copied().collect();
    assert!(
        compiles(&all, "all"),
        "nccl.h does not declare every ncclX and its pncclX twin"
    );
    // The check can fail: a name the header does not declare is refused.
    assert!(!compiles(&["ncclNoSuchFunction"], "none"));
}

#[test]
fn the_soname_is_nccls() {
    let bytes = std::fs::read(common::built_library()).unwrap();
    let needle = b"libnccl.so.2\0";
    assert!(
        bytes.windows(needle.len()).any(|w| w == needle),
        "no libnccl.so.2 string (the soname) in the built library"
    );
}
