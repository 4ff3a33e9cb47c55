//! NVTX ranges through the C ABI: the facade's test tool
//! (`crates/oxccl/tests/c/nvtx_tool.c`) attached through
//! `NVTX_INJECTION64_PATH` sees `ncclCommInitAll`, a group's
//! `ncclGroupStart`, its enqueued `ncclAllReduce`s and `ncclGroupEnd`, and
//! a collective outside a group, each once (a C entry's range holds the
//! facade's). One test per binary: tools attach once per process.

use std::ffi::c_int;

use oxccl_capi::abi::NcclCommT;

mod common;
use common::calls::{
    ncclAllReduce, ncclCommDestroy, ncclCommInitAll, ncclGroupEnd, ncclGroupStart,
};

#[path = "../../oxccl/tests/c/nvtx_tool.rs"]
mod nvtx_tool;

const FLOAT32: c_int = 7;
const SUM: c_int = 0;

#[test]
fn c_entry_points_make_one_range_each() {
    let dir = std::env::temp_dir().join(format!("oxccl-capi-nvtx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = nvtx_tool::build_tool(&dir);
    let out = dir.join("ranges.txt");
    std::env::set_var("NVTX_INJECTION64_PATH", &lib);
    std::env::set_var("NVTX_TOOL_OUT", &out);
    std::env::set_var("OXCCL_BACKEND", "host");

    let mut comms: [NcclCommT; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: two writable handles, no device list.
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) };
    assert_eq!(r, 0);
    let send = [[1.0f32; 4]; 2];
    let mut recv = [[0.0f32; 4]; 2];
    // SAFETY: host buffers of 4 floats each (the host backend), alive
    // until the group's end returns.
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for r in 0..2 {
            let (s, d) = (send[r].as_ptr().cast(), recv[r].as_mut_ptr().cast());
            assert_eq!(
                ncclAllReduce(s, d, 4, FLOAT32, SUM, comms[r], std::ptr::null_mut()),
                0
            );
        }
        assert_eq!(ncclGroupEnd(), 0);
    }
    assert_eq!(recv, [[2.0; 4]; 2]);
    // Outside a group: each rank's call from its own thread.
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    std::thread::scope(|s| {
        for &c in &handles {
            s.spawn(move || {
                let (a, mut b) = ([3.0f32; 2], [0.0f32; 2]);
                // SAFETY: host buffers of 2 floats.
                let r = unsafe {
                    ncclAllReduce(
                        a.as_ptr().cast(),
                        b.as_mut_ptr().cast(),
                        2,
                        FLOAT32,
                        SUM,
                        c as NcclCommT,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!((r, b), (0, [6.0; 2]));
            });
        }
    });
    for c in comms {
        // SAFETY: a handle ncclCommInitAll made, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
    }

    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let pushes: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("push "))
        .map(|l| l.splitn(3, ' ').nth(2).unwrap())
        .collect();
    let count = |p: &str| pushes.iter().filter(|m| m.starts_with(p)).count();
    assert_eq!(count("ncclCommInitAll"), 1, "{text}");
    assert_eq!(count("ncclGroupStart"), 1, "{text}");
    assert_eq!(count("ncclGroupEnd"), 1, "{text}");
    assert_eq!(
        count("ncclAllReduce count=4 datatype=ncclFloat32 op=ncclSum comm=0x"),
        2,
        "{text}"
    );
    assert_eq!(
        count("ncclAllReduce count=2 datatype=ncclFloat32 op=ncclSum comm=0x"),
        2,
        "{text}"
    );
    assert_eq!(count("ncclAllReduce"), 4, "{text}");
    assert_eq!(count("ncclCommDestroy"), 2, "{text}");
    assert_eq!(
        text.matches("push ").count(),
        text.matches("pop ").count(),
        "{text}"
    );
}
