//! The built library exports every function PyTorch 2.11 imports (a
//! missing one makes `import torch` fail: Python loads extensions with
//! RTLD_NOW) and the rest of NCCL 2.28's API, under NCCL's soname.

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

/// The rest of the 2.28 API this library declares in its header.
const OTHERS: [&str; 6] = [
    "ncclGather",
    "ncclScatter",
    "ncclCommCuDevice",
    "ncclResetDebugInit",
    "ncclCommSuspend",
    "ncclCommResume",
];

#[test]
fn every_function_pytorch_and_the_header_name_is_exported() {
    let path = common::built_library();
    // SAFETY: loading our own library runs no initialisers beyond Rust's.
    let lib = unsafe { libloading::Library::new(&path) }.expect("load the built library");
    let missing: Vec<&str> = TORCH
        .iter()
        .chain(&OTHERS)
        .copied()
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

#[test]
fn the_header_declares_every_exported_function() {
    let h = std::fs::read_to_string(common::include_dir().join("nccl.h")).unwrap();
    for name in TORCH.iter().chain(&OTHERS) {
        assert!(
            h.contains(&format!("{name}(")),
            "nccl.h does not declare {name}"
        );
    }
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
