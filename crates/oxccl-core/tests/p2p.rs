//! Send/Recv groups: random sets of point-to-point operations.

use oxccl_core::gen::p2p::{self, P2pOp, Path};
use oxccl_core::interp::{self, InterpOptions, RankMem};
use oxccl_core::plan::{BufId, BufRole};
use oxccl_core::Plan;
use oxccl_core::{CoreError, DataType, RedOp};
use proptest::prelude::*;

/// `(from, to, count)` messages, in the order ranks list them, all
/// through FIFOs.
fn run(
    n: u32,
    msgs: &[(u32, u32, usize)],
    recv_first: u64,
    chunk: usize,
    channels: u32,
    seed: u64,
) {
    run_paths(n, msgs, recv_first, 0, chunk, channels, seed);
}

/// [`run`] with message i direct (read from the sender's buffer) where
/// bit i of `direct` is set.
fn run_paths(
    n: u32,
    msgs: &[(u32, u32, usize)],
    recv_first: u64,
    direct: u64,
    chunk: usize,
    channels: u32,
    seed: u64,
) {
    let mut ops: Vec<Vec<P2pOp>> = vec![Vec::new(); n as usize];
    let mut data: Vec<Vec<Vec<u32>>> = vec![Vec::new(); n as usize];
    let mut expect: Vec<Vec<Option<Vec<u32>>>> = vec![Vec::new(); n as usize];
    // Per rank: its sends and receives, each in message order.
    for recvs_pass in [false, true] {
        for r in 0..n {
            let recvs = (recv_first >> r) & 1 == 1;
            if recvs != recvs_pass {
                for (i, &(a, b, count)) in msgs.iter().enumerate() {
                    if a == r {
                        ops[r as usize].push(P2pOp::Send { peer: b, count });
                        let v: Vec<u32> = (0..count as u32).map(|j| (i as u32) << 16 | j).collect();
                        data[r as usize].push(v);
                        expect[r as usize].push(None);
                    }
                }
            } else {
                for (i, &(a, b, count)) in msgs.iter().enumerate() {
                    if b == r {
                        ops[r as usize].push(P2pOp::Recv { peer: a, count });
                        let v: Vec<u32> = (0..count as u32).map(|j| (i as u32) << 16 | j).collect();
                        data[r as usize].push(Vec::new());
                        expect[r as usize].push(Some(v));
                    }
                }
            }
        }
    }
    // The k-th message from a to b is the k-th of msgs with that pair.
    let paths = p2p::paths(&ops, |a, b, k, _| {
        let i = msgs
            .iter()
            .enumerate()
            .filter(|(_, m)| (m.0, m.1) == (a, b))
            .nth(k)
            .map(|(i, _)| i);
        i.is_some_and(|i| i < 64 && (direct >> i) & 1 == 1)
    });
    let plan = p2p::plan_with_paths(n, &ops, &paths, chunk, channels).unwrap();
    if direct == 0 {
        assert_eq!(plan, p2p::plan(n, &ops, chunk, channels).unwrap());
    }
    // Each rank's part built alone (as a communicator builds it, seeing
    // only its own list and paths) must make a plan that checks and moves
    // the same data: an independent test of `rank_plan`, not a comparison
    // of the two builders' shared code.
    let alone = Plan {
        ranks: (0..n)
            .map(|r| {
                let i = r as usize;
                p2p::rank_plan_with_paths(n, r, &ops[i], &paths[i], chunk, channels).unwrap()
            })
            .collect(),
        ..plan.clone()
    };
    for plan in [plan, alone] {
        execute(&plan, &data, &expect, seed);
    }
}

/// Each rank names as a peer exactly the ranks that name it (a CUDA
/// launch of Send/Recv waits for the launches of the ranks its plan names,
/// matched pair by pair: a one-sided name would wait forever).
fn peers_are_mutual(plan: &Plan) {
    for (a, rp) in plan.ranks.iter().enumerate() {
        for b in rp.peers() {
            assert!(
                plan.ranks[b as usize].peers().contains(&(a as u32)),
                "rank {a} names {b}, which does not name it"
            );
        }
    }
}

/// Checks `plan`, runs it with `data` in the send buffers and compares
/// every receive buffer with `expect`.
fn execute(plan: &Plan, data: &[Vec<Vec<u32>>], expect: &[Vec<Option<Vec<u32>>>], seed: u64) {
    let n = plan.nranks;
    oxccl_core::interp::check(plan).unwrap();
    peers_are_mutual(plan);
    let mut mem: Vec<RankMem<u32>> = plan
        .ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let mut m = RankMem::new(&rp.bufs, &[], None);
            for (b, d) in data[r].iter().enumerate() {
                if rp.bufs[b].role == BufRole::Input {
                    m.write_buf(BufId(b as u16), d);
                }
            }
            m
        })
        .collect();
    let op = RedOp::Sum.lower(DataType::U32, n);
    let opts = InterpOptions {
        seed,
        ..InterpOptions::default()
    };
    interp::run(plan, &mut mem, &op, &opts).unwrap();
    for r in 0..n as usize {
        for (b, e) in expect[r].iter().enumerate() {
            if let Some(e) = e {
                assert_eq!(&mem[r].read_buf(BufId(b as u16)), e, "rank {r} op {b}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn random_groups(
        n in 1u32..=8,
        raw in prop::collection::vec((0u32..64, 0u32..64, 0usize..40), 0..12),
        recv_first in any::<u64>(),
        chunk in 1usize..16,
        channels in 1u32..4,
        seed in any::<u64>(),
    ) {
        let msgs: Vec<_> = raw.into_iter().map(|(a, b, c)| (a % n, b % n, c)).collect();
        run(n, &msgs, recv_first, chunk, channels, seed);
    }

    /// Some messages direct (the receiver reads the sender's buffer), the
    /// others through FIFOs, in one plan.
    #[test]
    fn random_groups_with_direct_messages(
        n in 1u32..=8,
        raw in prop::collection::vec((0u32..64, 0u32..64, 0usize..40), 0..12),
        recv_first in any::<u64>(),
        direct in any::<u64>(),
        chunk in 1usize..16,
        channels in 1u32..4,
        seed in any::<u64>(),
    ) {
        let msgs: Vec<_> = raw.into_iter().map(|(a, b, c)| (a % n, b % n, c)).collect();
        run_paths(n, &msgs, recv_first, direct, chunk, channels, seed);
    }
}

#[test]
fn ring_exchange_direct_both_orders_and_both_ways() {
    // The sweep's ring exchange read straight from the senders' buffers;
    // then every pair exchanging both ways, direct, on one semaphore pair.
    let n = 5;
    let ring: Vec<_> = (0..n).map(|r| (r, (r + 1) % n, 100)).collect();
    run_paths(n, &ring, u64::MAX, u64::MAX, 7, 3, 3);
    run_paths(n, &ring, 0, u64::MAX, 7, 3, 4);
    let both: Vec<_> = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b, 30)))
        .chain((0..n).map(|r| (r, (r + 2) % n, 45)))
        .collect();
    run_paths(n, &both, 0x5a5a, 0b1011_0110_1101_1011_0111, 8, 2, 5);
}

#[test]
fn a_direct_plan_reads_the_senders_buffer_and_waits_for_the_reader() {
    // Two ranks, 0 sends 12 elements to 1 directly over 2 channels of
    // pieces of 4: rank 1 reads rank 0's buffer 0 (no FIFO step), and
    // rank 0 signals before and waits after on each channel it uses.
    use oxccl_core::plan::{Src, Step};
    let ops = vec![
        vec![P2pOp::Send { peer: 1, count: 12 }],
        vec![P2pOp::Recv { peer: 0, count: 12 }],
    ];
    let paths = p2p::paths(&ops, |_, _, _, _| true);
    assert_eq!(paths[1], vec![Path::Direct(BufId(0))]);
    let plan = p2p::plan_with_paths(2, &ops, &paths, 4, 2).unwrap();
    for ch in &plan.ranks[0].channels {
        assert_eq!(
            ch.steps,
            vec![Step::Signal { peer: 1 }, Step::Wait { peer: 1 }]
        );
    }
    for ch in &plan.ranks[1].channels {
        let reads = ch
            .steps
            .iter()
            .filter(
                |s| matches!(s, Step::Xfer(x) if matches!(x.srcs[0], Src::Remote { peer: 0, .. })),
            )
            .count();
        assert_eq!(reads, 2, "{:?}", ch.steps);
        assert!(matches!(ch.steps.first(), Some(Step::Wait { peer: 0 })));
        assert!(matches!(ch.steps.last(), Some(Step::Signal { peer: 0 })));
    }
    // A rank's paths must cover its list.
    assert!(p2p::rank_plan_with_paths(2, 1, &ops[1], &[], 4, 2).is_err());
    // The checker refuses the plan without the reader's wait (it would
    // read before the sender handed its buffer over) and without the
    // sender's wait (it would hand the buffer back while it is read).
    oxccl_core::interp::check(&plan).unwrap();
    for (rank, wait_at) in [(1usize, 0usize), (0, 1)] {
        let mut bad = plan.clone();
        let steps = &mut bad.ranks[rank].channels[0].steps;
        assert!(matches!(steps[wait_at], Step::Wait { .. }));
        steps.remove(wait_at);
        assert!(
            oxccl_core::interp::check(&bad).is_err(),
            "rank {rank} without its wait passed the check"
        );
    }
}

#[test]
fn ring_exchange_both_orders() {
    // Everyone sends to the next and receives from the previous, listing
    // the receive first: the schedule must still not deadlock.
    let n = 5;
    let msgs: Vec<_> = (0..n).map(|r| (r, (r + 1) % n, 100)).collect();
    run(n, &msgs, u64::MAX, 7, 2, 3);
    run(n, &msgs, 0, 7, 2, 3);
}

#[test]
fn self_send_is_a_copy() {
    run(2, &[(0, 0, 10), (1, 1, 3), (0, 0, 4)], 0, 4, 1, 0);
}

#[test]
fn mismatched_groups_are_refused() {
    let e = |ops: &[Vec<P2pOp>]| p2p::plan(2, ops, 8, 1).unwrap_err();
    let unmatched = e(&[vec![P2pOp::Send { peer: 1, count: 4 }], vec![]]);
    assert!(matches!(unmatched, CoreError::InvalidRequest(m) if m.contains("sends [4]")));
    let counts = e(&[
        vec![P2pOp::Send { peer: 1, count: 4 }],
        vec![P2pOp::Recv { peer: 0, count: 5 }],
    ]);
    assert!(
        matches!(&counts, CoreError::InvalidRequest(m)
            if m == "rank 0 sends [4] to rank 1, which receives [5] from it"),
        "{counts:?}"
    );
    let range = e(&[vec![P2pOp::Send { peer: 2, count: 4 }], vec![]]);
    assert!(matches!(range, CoreError::InvalidRequest(m) if m.contains("out of range")));
}
