//! A group holding one collective runs as that collective alone (the
//! group's end takes the lone call's path): one rank may issue it inside
//! `ncclGroupStart`/`ncclGroupEnd` (as PyTorch groups coalesced calls)
//! while its peer issues it alone, and both complete with the right sums,
//! under the call check (on by default).

use std::ffi::c_int;

use oxccl_capi::abi::NcclCommT;

mod common;
use common::calls::{
    ncclAllReduce, ncclCommDestroy, ncclCommInitAll, ncclGroupEnd, ncclGroupStart,
};

const FLOAT32: c_int = 7;
const SUM: c_int = 0;

/// A communicator handle crossing into a rank thread.
#[derive(Clone, Copy)]
struct Handle(NcclCommT);
// SAFETY: handles are table tokens, usable from any thread.
unsafe impl Send for Handle {}

/// Rank `r`'s AllReduce of `[r + 1; 4]`, grouped or not, three times.
fn rank(c: Handle, r: usize, grouped: bool) -> Vec<[f32; 4]> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let send = [r as f32 + 1.0; 4];
        let mut recv = [0.0f32; 4];
        // SAFETY: host buffers of 4 floats (the host backend), alive until
        // the call (or the group's end) returns; a live handle.
        unsafe {
            if grouped {
                assert_eq!(ncclGroupStart(), 0);
            }
            let r = ncclAllReduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                4,
                FLOAT32,
                SUM,
                c.0,
                std::ptr::null_mut(),
            );
            assert_eq!(r, 0, "ncclAllReduce");
            if grouped {
                assert_eq!(ncclGroupEnd(), 0, "ncclGroupEnd");
            }
        }
        out.push(recv);
    }
    out
}

#[test]
fn a_grouped_collective_matches_its_peers_lone_one() {
    std::env::set_var("OXCCL_BACKEND", "host");
    let mut comms: [NcclCommT; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: two writable handles, no device list.
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) };
    assert_eq!(r, 0, "ncclCommInitAll");
    let hs = comms.map(Handle);
    let results: Vec<Vec<[f32; 4]>> = std::thread::scope(|s| {
        let t: Vec<_> = (0..2)
            .map(|r| s.spawn(move || rank(hs[r], r, r == 1)))
            .collect();
        t.into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    });
    for per_rank in results {
        assert_eq!(per_rank, vec![[3.0f32; 4]; 3]);
    }
    for c in comms {
        // SAFETY: live handles, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
    }
}
