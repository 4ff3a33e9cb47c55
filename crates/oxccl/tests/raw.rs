//! The raw entry points on the host backend (host pointers; the stream is
//! ignored): every collective in and out of place, registered ranges and
//! their direct plans, Send/Recv in groups, and every misuse a C caller
//! can make, each refused with nothing written. The CUDA versions, on
//! external device memory and callers' streams, are in `external.rs`.

mod common;

use std::sync::Mutex;

use common::raw::{run_collective, run_ring, Mem, Reg};
use oxccl::{CollKind, DataType, Error, RawColl, RawStream, RedOp};

/// Host memory the test owns (8-byte aligned), copies by hand.
#[derive(Default)]
struct HostMem(Mutex<Vec<Vec<u64>>>);

impl Mem for HostMem {
    fn alloc(&self, _rank: u32, bytes: usize) -> u64 {
        let mut v = vec![0u64; bytes.div_ceil(8).max(1)];
        let p = v.as_mut_ptr() as u64;
        self.0.lock().unwrap().push(v);
        p
    }
    fn stream(&self, rank: u32) -> RawStream {
        // Any value: the host backend ignores streams.
        RawStream(0xdead_0000 + u64::from(rank))
    }
    fn upload(&self, _rank: u32, dst: u64, src: &[u8]) {
        // SAFETY: `dst` is an allocation of this test with room for `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) }
    }
    fn download(&self, _rank: u32, src: u64, dst: &mut [u8]) {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) }
    }
    fn sync(&self, _rank: u32) {}
}

const KINDS: [CollKind; 8] = oxccl::core::testkit::COLLECTIVES;

#[test]
fn every_collective_in_and_out_of_place() {
    let mem = HostMem::default();
    for n in [1, 3, 4] {
        let comms = common::host(n);
        for kind in KINDS {
            for count in [1, 37, 1000] {
                for in_place in [false, true] {
                    let op = if kind.is_reduction() {
                        RedOp::Max
                    } else {
                        RedOp::Sum
                    };
                    let f =
                        run_collective::<f32, _>(&comms, &mem, kind, count, op, in_place, false);
                    assert_eq!(
                        f.wrong, 0,
                        "{kind} f32 n={n} count={count} in_place={in_place}: {:?}",
                        f.first
                    );
                    let i = run_collective::<i32, _>(
                        &comms,
                        &mem,
                        kind,
                        count,
                        RedOp::Sum,
                        in_place,
                        false,
                    );
                    assert_eq!(
                        i.wrong, 0,
                        "{kind} i32 n={n} count={count} in_place={in_place}: {:?}",
                        i.first
                    );
                }
            }
        }
    }
}

#[test]
fn registered_ranges_run_direct_plans_and_unregistered_fifo() {
    let mem = HostMem::default();
    let comms = common::host(4);
    for kind in [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
    ] {
        for register in [false, true] {
            let o =
                run_collective::<f32, _>(&comms, &mem, kind, 1 << 16, RedOp::Sum, false, register);
            assert_eq!(o.wrong, 0, "{kind} registered={register}: {:?}", o.first);
            assert_eq!(o.direct, register, "{kind}: direct plan iff registered");
        }
    }
}

#[test]
fn windows_run_direct_plans_on_every_collective() {
    let mem = HostMem::default();
    let comms = common::host(3);
    for kind in KINDS {
        for in_place in [false, true] {
            let o = run_collective::<f32, _>(
                &comms,
                &mem,
                kind,
                1 << 14,
                RedOp::Sum,
                in_place,
                Reg::Window,
            );
            assert_eq!(
                o.wrong, 0,
                "{kind} in_place={in_place} on windows: {:?}",
                o.first
            );
            if matches!(
                kind,
                CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
            ) && !in_place
            {
                assert!(o.direct, "{kind} on windows: a direct plan");
            }
        }
    }
    // Deregistered (by the run above): the same calls run FIFO plans.
    let o = run_collective::<f32, _>(
        &comms,
        &mem,
        CollKind::AllReduce,
        1 << 14,
        RedOp::Sum,
        false,
        Reg::No,
    );
    assert_eq!(o.wrong, 0, "{:?}", o.first);
    assert!(!o.direct, "unregistered memory ran a direct plan");
}

#[test]
fn window_misuse_is_refused() {
    let a = common::host(1);
    let b = common::host(1);
    let (a, b) = (&a[0], &b[0]);
    let mut page = vec![0u64; 4096];
    let p = page.as_mut_ptr();
    // An address 8 bytes past a 4096-byte boundary inside `page`.
    let off = (4096 - (p as usize % 4096)) % 4096 / 8 + 1;
    // SAFETY: every range below lies in `page`, alive to the end; refused
    // ranges are never used.
    unsafe {
        let bad = |e: Error, word: &str| {
            assert_eq!(e.nccl_result(), 4, "{e}: want ncclInvalidArgument");
            assert!(e.to_string().contains(word), "{e}: lacks {word}");
        };
        bad(
            a.window_register(std::ptr::null(), 64, 0).unwrap_err(),
            "non-null",
        );
        bad(a.window_register(p.cast(), 0, 0).unwrap_err(), "non-empty");
        bad(
            a.window_register(p.add(1).cast(), usize::MAX, 0)
                .unwrap_err(),
            "wrap",
        );
        let odd = p.add(off);
        bad(
            a.window_register(odd.cast(), 64, oxccl::WIN_COLL_SYMMETRIC)
                .unwrap_err(),
            "NCCL_WIN_REQUIRED_ALIGNMENT",
        );
        // Without the symmetric flag, and with flags oxccl does not use,
        // any alignment is accepted.
        let w = a
            .window_register(odd.cast(), 64, oxccl::WIN_STRICT_ORDERING | 0x100)
            .unwrap();
        assert_eq!(w.user_ptr(), odd.cast());
        assert_eq!(w.flags(), oxccl::WIN_STRICT_ORDERING | 0x100);
        assert!(w.direct(), "rank threads reach a window");
        assert!(w.contains(odd as u64 + 8, 56) && !w.contains(odd as u64 + 8, 57));
        // Another communicator's window is refused there, and stays
        // registered where it was made.
        let e = b.window_deregister(&w).unwrap_err();
        assert!(e.to_string().contains("not a window"), "{e}");
        a.window_deregister(&w).unwrap();
        // Deregistered: stale for good.
        let e = a.window_deregister(&w).unwrap_err();
        assert!(e.to_string().contains("not a window"), "{e}");
    }
    drop(page);
}

#[test]
fn ring_exchange_through_send_and_recv_raw() {
    let mem = HostMem::default();
    for n in [2, 3] {
        let (wrong, first) = run_ring::<f32, _>(&common::host(n), &mem, 1000);
        assert_eq!(wrong, 0, "{n} ranks: {first:?}");
    }
}

#[test]
fn ignored_buffers_may_be_null() {
    let comms = common::host(3);
    let res = common::on_ranks(&comms, |c| {
        let mut out = vec![0.0f32; 8];
        let input = [c.rank() as f32 + 1.0; 8];
        let root = 0;
        let at_root = c.rank() == root;
        let mut bout = vec![0.0f32; 8];
        // Reduce with a null receive buffer off the root, then Broadcast
        // with a null send buffer off the root.
        let reduce = RawColl {
            kind: CollKind::Reduce,
            send: input.as_ptr().cast(),
            recv: if at_root {
                out.as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            },
            count: 8,
            dtype: DataType::F32,
            op: RedOp::Sum,
            root,
        };
        let broadcast = RawColl {
            kind: CollKind::Broadcast,
            send: if at_root {
                input.as_ptr().cast()
            } else {
                std::ptr::null()
            },
            recv: bout.as_mut_ptr().cast(),
            ..reduce
        };
        for call in [reduce, broadcast] {
            // SAFETY: 8 elements each, alive for the call (host: it
            // completes before returning).
            unsafe { c.collective_raw(call, RawStream::DEFAULT) }.unwrap();
        }
        (out, bout)
    });
    assert_eq!(res[0].0, vec![6.0; 8], "Reduce at the root");
    for (r, (_, b)) in res.iter().enumerate() {
        assert_eq!(b, &vec![1.0; 8], "Broadcast on rank {r}");
    }
}

/// Every misuse is refused with a specific error before anything runs,
/// and the receive buffer is left as it was.
#[test]
fn misuse_is_refused_and_nothing_is_written() {
    let comms = common::host(1);
    let c = &comms[0];
    let input = [1.0f32; 4];
    let mut out = [9.0f32; 4];
    let raw = |kind, send: *const f32, recv: *mut f32, count, root| {
        // SAFETY: every buffer handed over is valid for 4 elements; the
        // calls are refused before touching the others.
        unsafe {
            c.collective_raw(
                RawColl {
                    kind,
                    send: send.cast(),
                    recv: recv.cast(),
                    count,
                    dtype: DataType::F32,
                    op: RedOp::Sum,
                    root,
                },
                RawStream::DEFAULT,
            )
        }
    };
    let o = out.as_mut_ptr();
    let e = raw(CollKind::AllReduce, std::ptr::null(), o, 4, 0).unwrap_err();
    assert!(e.to_string().contains("send buffer is null"), "{e}");
    let e = raw(
        CollKind::AllReduce,
        input.as_ptr(),
        std::ptr::null_mut(),
        4,
        0,
    )
    .unwrap_err();
    assert!(e.to_string().contains("receive buffer is null"), "{e}");
    let misaligned = (input.as_ptr() as u64 + 1) as *const f32;
    let e = raw(CollKind::AllReduce, misaligned, o, 2, 0).unwrap_err();
    assert!(e.to_string().contains("not aligned"), "{e}");
    let e = raw(CollKind::SendRecv, input.as_ptr(), o, 4, 0).unwrap_err();
    assert!(e.to_string().contains("send_raw"), "{e}");
    let e = raw(CollKind::Broadcast, input.as_ptr(), o, 4, 1).unwrap_err();
    assert!(
        matches!(e, Error::RootOutOfRange { root: 1, nranks: 1 }),
        "{e}"
    );
    let e = raw(CollKind::AllGather, input.as_ptr(), o, usize::MAX / 2, 0);
    assert!(e.is_err(), "an overflowing count is refused");
    assert_eq!(out, [9.0; 4], "a refused call writes nothing");
    // A count of 0 does nothing, even on null pointers.
    raw(
        CollKind::AllReduce,
        std::ptr::null(),
        std::ptr::null_mut(),
        0,
        0,
    )
    .unwrap();
    // SAFETY: null and empty ranges are refused before any use.
    unsafe {
        assert!(c.register(std::ptr::null(), 64).is_err());
        assert!(c.register(input.as_ptr().cast(), 0).is_err());
        let g = c.register(input.as_ptr().cast(), 16).unwrap();
        c.deregister(g).unwrap();
        let e = c.deregister(g).unwrap_err();
        assert!(e.to_string().contains("not registered"), "{e}");
        let e = c
            .send_raw(std::ptr::null(), 4, DataType::F32, 0, RawStream::DEFAULT)
            .unwrap_err();
        assert!(e.to_string().contains("null"), "{e}");
    }
}

#[test]
fn a_group_may_use_several_streams_per_communicator() {
    // As NCCL: each operation names its own stream (the host backend
    // ignores them; on CUDA the launch is joined to each by events).
    let comms = common::host(1);
    let c = &comms[0];
    let a = [[1.0f32; 4], [2.0; 4]];
    let mut b = [[0.0f32; 4]; 2];
    oxccl::group(|g| {
        for (k, stream) in [RawStream(1), RawStream(2)].into_iter().enumerate() {
            // SAFETY: valid 4-element buffers, alive past the group.
            unsafe {
                g.collective_raw(
                    c,
                    RawColl {
                        kind: CollKind::AllReduce,
                        send: a[k].as_ptr().cast(),
                        recv: b[k].as_mut_ptr().cast(),
                        count: 4,
                        dtype: DataType::F32,
                        op: RedOp::Sum,
                        root: 0,
                    },
                    stream,
                )?;
            }
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(b, a);
}
