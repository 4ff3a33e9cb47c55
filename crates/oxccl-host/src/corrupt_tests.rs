//! A peer's shared segment holding what no honest peer writes: garbage
//! FIFO counters, message lengths and published buffer offsets become an
//! error naming that peer, never an access outside its memory.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use oxccl_bootstrap::{Bootstrap, DeviceInfo, UniqueId};
use oxccl_core::plan::{BufDecl, BufRole, Channel, Dst, Loc, RankPlan, Src, Step, Xfer};
use oxccl_core::{DataType, RedOp};
use proptest::prelude::*;

use crate::remote::{RemoteAccess, RemoteFault};
use crate::shm::{LinkCtr, MAX_PUB};
use crate::{HostBuf, HostConfig, HostError, HostFabric};

const LIMIT: Duration = Duration::from_secs(30);

/// Two ranks as processes of this host (threads here, each with its own
/// bootstrap and fabric, as two processes would have).
fn two_ranks() -> Vec<Arc<HostFabric>> {
    let id = UniqueId::new(LIMIT).expect("a unique id");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let id = &id;
                s.spawn(move || {
                    let boot = Bootstrap::init(id, 2, r, &DeviceInfo::default(), LIMIT)
                        .expect("bootstrap");
                    let cfg = HostConfig {
                        deadline: LIMIT,
                        slots: 4,
                        slot_bytes: 256,
                        ..HostConfig::default()
                    };
                    HostFabric::across_processes(&boot, cfg).expect("a fabric")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("setup")).collect()
    })
}

/// Rank 0's plan: receive `n` bytes from rank 1.
fn recv_plan(n: usize) -> RankPlan {
    RankPlan {
        rank: 0,
        nranks: 2,
        bufs: vec![
            BufDecl {
                role: BufRole::Input,
                len: n,
                must_write: false,
            },
            BufDecl {
                role: BufRole::Output,
                len: n,
                must_write: false,
            },
        ],
        channels: vec![Channel {
            steps: vec![Step::Xfer(Xfer::new(
                vec![Src::Recv { peer: 1 }],
                vec![Dst::Local(Loc::output(0))],
                n,
            ))],
        }],
    }
}

/// Rank 1's counters of the link it sends rank 0 on channel 0 (in rank
/// 0's segment), as rank 1's process maps them: what it can write.
fn link_from_1(fabs: &[Arc<HostFabric>]) -> &LinkCtr {
    let p1 = fabs[1].procs().expect("ranks are processes");
    let off = p1.layout().link(0, 1);
    // SAFETY: the layout puts link (0, from 1)'s counters at `off` of
    // rank 0's segment.
    unsafe { p1.segment(0).at(off) }
}

fn receive(fab: &HostFabric, n: usize) -> HostError {
    let (input, mut out) = (vec![0u8; n], vec![0u8; n]);
    // SAFETY: `input` and `out` are `n` bytes each for the whole call.
    unsafe {
        fab.execute(
            &recv_plan(n),
            &[
                HostBuf::from_slice(&input),
                HostBuf::from_mut_slice(&mut out),
            ],
            DataType::U8,
            &RedOp::Sum.lower(DataType::U8, 2),
        )
    }
    .expect_err("a corrupt FIFO must fail the call")
}

fn assert_names_peer_1(e: &HostError, what: &str) {
    match e {
        HostError::Corrupt {
            rank: 0,
            peer: 1,
            detail,
        } => assert!(detail.contains(what), "{detail}"),
        e => panic!("expected rank 0 to name peer 1's corrupt memory, got {e}"),
    }
}

#[test]
fn a_tail_past_the_slots_is_an_error_naming_the_sender() {
    let fabs = two_ranks();
    // Rank 1 claims 1000 messages in a FIFO of 4 slots.
    link_from_1(&fabs).tail.store(1000, Ordering::Release);
    let e = receive(&fabs[0], 16);
    assert_names_peer_1(&e, "tail 1000, head 0 for 4 slots");
    assert!(fabs[0].failure().is_some(), "the fabric is failed");
}

#[test]
fn a_message_longer_than_its_slot_is_an_error_naming_the_sender() {
    let fabs = two_ranks();
    let p1 = fabs[1].procs().expect("processes");
    let off = p1.layout().link_lens(p1.layout().link(0, 1));
    // SAFETY: link (0, from 1)'s slot lengths, in rank 0's segment.
    let len0: &std::sync::atomic::AtomicU64 = unsafe { p1.segment(0).at(off) };
    len0.store(1 << 40, Ordering::Relaxed);
    link_from_1(&fabs).tail.store(1, Ordering::Release);
    let e = receive(&fabs[0], 16);
    assert_names_peer_1(&e, "claims 1099511627776 bytes in a 256-byte slot");
}

#[test]
fn a_head_past_the_tail_is_an_error_naming_the_receiver() {
    let fabs = two_ranks();
    // Rank 1 (the receiver of link 0 -> 1, in its segment) moves its head
    // past what rank 0 ever sent.
    let p1 = fabs[1].procs().expect("processes");
    let off = p1.layout().link(0, 0);
    // SAFETY: link (0, from 0)'s counters in rank 1's own segment.
    let ctr: &LinkCtr = unsafe { p1.segment(1).at(off) };
    ctr.head.store(7, Ordering::Release);
    let plan = RankPlan {
        rank: 0,
        nranks: 2,
        bufs: vec![BufDecl {
            role: BufRole::Input,
            len: 16,
            must_write: false,
        }],
        channels: vec![Channel {
            steps: vec![Step::Xfer(Xfer::new(
                vec![Src::Local {
                    at: Loc::input(0),
                    pre: false,
                }],
                vec![Dst::Send { peer: 1 }],
                16,
            ))],
        }],
    };
    let data = vec![1u8; 16];
    // SAFETY: `data` is 16 readable bytes for the whole call.
    let e = unsafe {
        fabs[0].execute(
            &plan,
            &[HostBuf::from_slice(&data)],
            DataType::U8,
            &RedOp::Sum.lower(DataType::U8, 2),
        )
    }
    .expect_err("a corrupt head must fail the call");
    assert_names_peer_1(&e, "tail 0, head 7");
}

#[test]
fn published_buffers_outside_the_peers_heap_are_refused() {
    let fabs = two_ranks();
    let (p0, p1) = (fabs[0].procs().unwrap(), fabs[1].procs().unwrap());
    let lay = p0.layout();
    let ctl = p1.rank(1);
    let publish = |n: u32, off: u64, len: u64| {
        ctl.pub_n.store(n, Ordering::Relaxed);
        ctl.pub_bufs[0][0].store(off + 1, Ordering::Relaxed);
        ctl.pub_bufs[0][1].store(len, Ordering::Relaxed);
        ctl.pub_call.store(1, Ordering::Release);
    };
    let access = |buf: usize, len: usize| RemoteAccess {
        call: 1,
        buf,
        off: 0,
        len,
        elem: 4,
    };
    let corrupt = |r: Result<usize, RemoteFault>, what: &str| match r {
        Err(RemoteFault::Corrupt(d)) => assert!(d.contains(what), "{d}"),
        r => panic!("expected a corrupt publication, got {r:?}"),
    };
    // An honest publication resolves into the peer's heap.
    publish(1, lay.heap as u64, 8);
    let at = p0.remote(1, &access(0, 8)).expect("an honest buffer");
    assert_eq!(at, p0.segment(1).base() as usize + lay.heap);
    // Into its control words and FIFOs, past its end, wrapping around,
    // misaligned, and more buffers than there is room for.
    publish(1, 0, 8);
    corrupt(p0.remote(1, &access(0, 8)), "outside its heap");
    publish(1, lay.total as u64 - 16, 8);
    corrupt(p0.remote(1, &access(0, 8)), "outside its heap");
    publish(1, lay.heap as u64, u64::MAX / 2);
    corrupt(p0.remote(1, &access(0, 8)), "outside its heap");
    publish(1, lay.heap as u64 + 2, 8);
    corrupt(p0.remote(1, &access(0, 8)), "misaligned");
    publish(u32::MAX, lay.heap as u64, 8);
    corrupt(p0.remote(1, &access(MAX_PUB + 5, 8)), "published buffers");
}

#[test]
fn arbitrary_words_in_a_peers_segment_never_reach_outside_it() {
    // The same entry the fuzz targets run (it panics on any escape).
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(512));
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..400), |b| {
            crate::fuzz::shared_segment(&b);
            Ok(())
        })
        .unwrap();
    // Words near the edges the checks draw.
    let lay = crate::shm::Layout::new(2, 4, 256, 64 << 10);
    let edges = [
        0,
        1,
        3,
        4,
        5,
        lay.heap as u64,
        lay.heap as u64 + 1,
        lay.total as u64,
        u64::MAX,
    ];
    let strategy = proptest::collection::vec(proptest::sample::select(edges.to_vec()), 0..50);
    runner
        .run(&strategy, |w| {
            let b: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
            crate::fuzz::shared_segment(&b);
            Ok(())
        })
        .unwrap();
}
