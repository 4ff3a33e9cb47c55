//! Ranks over the network transport (fabrics of one process, each its own
//! rank, forced onto TCP).
//!
//! Messages the proxy sends straight from the rank's buffers (by
//! reference) or receives straight into them (landed) instead of through
//! a FIFO slot: results are right with and without, both are used where a
//! step allows, and a step that overwrites a range still being sent by
//! reference waits for it to leave (else the peer would receive the new
//! bytes). The hop latency measured at setup: every rank has the same
//! figure, a plausible one.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::run_plan;
use oxccl_bootstrap::{Bootstrap, DeviceInfo, UniqueId};
use oxccl_core::plan::{BufDecl, BufRole, Channel, Dst, Loc, RankPlan, Src, Step, Xfer};
use oxccl_core::{generate, testkit, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use oxccl_host::{ExecStats, HostBuf, HostConfig, HostFabric};

const LIMIT: Duration = Duration::from_secs(60);

/// Two ranks, each with its own fabric over the network (as two processes
/// would have), made concurrently since setup is collective.
fn two_ranks(zero_copy: bool, slot_bytes: usize) -> Vec<Arc<HostFabric>> {
    ranks(2, zero_copy, slot_bytes)
}

/// [`two_ranks`] for `n` ranks; `zero_copy` sends by reference and lands
/// messages in place.
fn ranks(n: u32, zero_copy: bool, slot_bytes: usize) -> Vec<Arc<HostFabric>> {
    fabrics(n, |_| HostConfig {
        deadline: LIMIT,
        slots: 2,
        slot_bytes,
        force_network: true,
        net_send_by_reference: zero_copy,
        net_receive_in_place: zero_copy,
        ..HostConfig::default()
    })
    .into_iter()
    .map(|f| f.expect("a network fabric"))
    .collect()
}

/// `n` ranks over the network, rank `r` configured by `cfg(r)`: each
/// rank's fabric, or why it has none.
fn fabrics(
    n: u32,
    cfg: impl Fn(u32) -> HostConfig + Sync,
) -> Vec<Result<Arc<HostFabric>, oxccl_host::HostError>> {
    let id = UniqueId::new(LIMIT).expect("a unique id");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, cfg) = (&id, &cfg);
                s.spawn(move || {
                    let boot = Bootstrap::init(id, n, r, &DeviceInfo::default(), LIMIT)
                        .expect("bootstrap");
                    HostFabric::across_processes(&boot, cfg(r))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("setup thread"))
            .collect()
    })
}

/// Generated AllReduce, AllGather and Broadcast plans, in place and out of
/// place: right either way, sent by reference and landed in place only
/// when asked.
#[test]
fn generated_plans_are_right_and_skip_the_slots_when_asked() {
    for by_ref in [true, false] {
        let fabs = two_ranks(by_ref, 4096);
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::Broadcast,
        ] {
            for in_place in [false, true] {
                let coll = Collective::new(kind, 10_000, 1);
                let mut req = PlanRequest::new(coll, 2, Algo::Ring);
                req.channels = 2;
                req.chunk = 4096 / 4;
                req.in_place = in_place;
                let plan = generate(&req).expect("a ring plan");
                let inputs: Vec<Vec<f32>> = (0..2)
                    .map(|r| testkit::input(&coll, 2, r, RedOp::Sum, 7))
                    .collect();
                let op = RedOp::Sum.lower(DataType::F32, 2);
                let res = run_plan(fabs.as_slice(), &plan, &inputs, in_place, &op, &[]);
                let mut outs = Vec::new();
                let mut stats = ExecStats::default();
                for (r, res) in res.into_iter().enumerate() {
                    let res = res.expect("every rank ran");
                    let (o, st) = res.unwrap_or_else(|e| panic!("{kind} rank {r}: {e}"));
                    outs.push(o);
                    stats.messages += st.messages;
                    stats.by_reference += st.by_reference;
                    stats.landed += st.landed;
                }
                let (wrong, first) = testkit::compare(&coll, &inputs, &outs, RedOp::Sum);
                let case = format!("{kind} in_place={in_place} by_reference={by_ref}");
                assert_eq!(wrong, 0, "{case}: {first:?}");
                assert!(stats.messages > 4, "{case}: {stats:?}");
                if by_ref {
                    // Every message of these plans is a copy of a local
                    // range or a result also written locally.
                    assert_eq!(stats.by_reference, stats.messages, "{case}");
                    // Received pieces copied to a range nothing else
                    // touches land (the first ones of a call ride the
                    // slots the proxy posted before it); in place, an
                    // AllReduce's pieces land where its input was read.
                    if !(in_place && kind == CollKind::AllReduce) {
                        assert!(stats.landed > 0, "{case}: {stats:?}");
                    }
                } else {
                    assert_eq!((stats.by_reference, stats.landed), (0, 0), "{case}");
                }
            }
        }
    }
}

/// Rank 0 sends its output range by reference, then at once overwrites
/// it; rank 1 receives it. Rank 1 must get the bytes as they were when
/// sent: the overwrite waits for the message to leave. (Without that wait
/// the proxy is still reading the range as it changes.)
#[test]
fn a_range_sent_by_reference_is_not_overwritten_until_it_left() {
    const LEN: usize = 256 << 10; // 1 MiB of f32: one slot's message
    let fabs = two_ranks(true, LEN * 4);
    let x = |srcs, dsts| Step::Xfer(Xfer::new(srcs, dsts, LEN));
    let decl = |role, len| BufDecl {
        role,
        len,
        must_write: role == BufRole::Output,
    };
    let sender = RankPlan {
        rank: 0,
        nranks: 2,
        bufs: vec![decl(BufRole::Input, 2 * LEN), decl(BufRole::Output, LEN)],
        channels: vec![Channel {
            steps: vec![
                x(
                    vec![Src::Local {
                        at: Loc::input(0),
                        pre: false,
                    }],
                    vec![Dst::Local(Loc::output(0))],
                ),
                x(
                    vec![Src::Local {
                        at: Loc::output(0),
                        pre: false,
                    }],
                    vec![Dst::Send { peer: 1 }],
                ),
                x(
                    vec![Src::Local {
                        at: Loc::input(LEN),
                        pre: false,
                    }],
                    vec![Dst::Local(Loc::output(0))],
                ),
            ],
        }],
    };
    let receiver = RankPlan {
        rank: 1,
        nranks: 2,
        bufs: vec![decl(BufRole::Input, 0), decl(BufRole::Output, LEN)],
        channels: vec![Channel {
            steps: vec![x(
                vec![Src::Recv { peer: 0 }],
                vec![Dst::Local(Loc::output(0))],
            )],
        }],
    };
    let first: Vec<f32> = (0..LEN).map(|i| i as f32).collect();
    let second: Vec<f32> = vec![-1.0; LEN];
    let op = RedOp::Sum.lower(DataType::F32, 2);
    for round in 0..3 {
        let outs: Vec<(Vec<f32>, ExecStats)> = std::thread::scope(|s| {
            let hs: Vec<_> = [&sender, &receiver]
                .into_iter()
                .zip(&fabs)
                .map(|(rp, fab)| {
                    let (first, second, op) = (&first, &second, &op);
                    s.spawn(move || {
                        let mut input: Vec<f32> = first.iter().chain(second).copied().collect();
                        let mut out = vec![0.0f32; LEN];
                        let bufs = [
                            HostBuf {
                                ptr: input.as_mut_ptr().cast(),
                                bytes: rp.bufs[0].len * 4,
                            },
                            HostBuf {
                                ptr: out.as_mut_ptr().cast(),
                                bytes: LEN * 4,
                            },
                        ];
                        // SAFETY: both buffers live in this thread until
                        // `execute` returns and nothing else touches them.
                        let st = unsafe { fab.execute(rp, &bufs, DataType::F32, op) }
                            .unwrap_or_else(|e| panic!("rank {}: {e}", rp.rank));
                        (out, st)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        });
        assert_eq!(
            outs[0].1.by_reference, 1,
            "round {round}: sent by reference"
        );
        assert!(
            outs[0].0 == second,
            "round {round}: the sender's last write"
        );
        let got = &outs[1].0;
        let bad = got.iter().zip(&first).filter(|(a, b)| a != b).count();
        assert_eq!(
            bad, 0,
            "round {round}: {bad} of {LEN} received elements changed"
        );
    }
}

/// Every rank's fabric reports one hop latency, the same on every rank
/// (the selector of each must pick the same plans), and a plausible one:
/// more than nothing, less than the deadline.
#[test]
fn the_hop_latency_is_measured_at_setup_and_agreed() {
    for n in [2u32, 3] {
        let fabs = ranks(n, true, 4096);
        let hops: Vec<Option<f64>> = fabs.iter().map(|f| f.network_hop_us()).collect();
        let h = hops[0].unwrap_or_else(|| panic!("{n} ranks: no hop latency: {hops:?}"));
        assert!(
            hops.iter().all(|&x| x == Some(h)),
            "{n} ranks disagree: {hops:?}"
        );
        assert!(
            h > 0.0 && h < LIMIT.as_secs_f64() * 1e6,
            "{n} ranks: {h} us"
        );
        eprintln!("{n} ranks: one hop {h:.1} us");
    }
    // A fabric of threads has no network, hence no hop.
    let threads = HostFabric::new(2, HostConfig::default());
    assert_eq!(threads.network_hop_us(), None);
}

/// Ranks whose hosts would choose different sockets per connection (here
/// told they may use 16 and 8 cores) agree on one layout, the smaller
/// default, so both ends of every connection lay it out alike; and a
/// plan runs over it. (A count set in `HostConfig::net_sockets`, which
/// the facade fills from `NCCL_SOCKET_NTHREADS`, wins, and two set
/// differently are refused: `oxccl-net`'s `config::agree`, and
/// `crates/oxccl/tests/multiprocess.rs` with processes.)
#[test]
fn ranks_with_different_defaults_agree_on_the_sockets() {
    let cores = |r: u32| if r == 0 { 16 } else { 8 };
    let fabs: Vec<Arc<HostFabric>> = fabrics(2, |r| HostConfig {
        deadline: LIMIT,
        force_network: true,
        net_cores: cores(r),
        ..HostConfig::default()
    })
    .into_iter()
    .map(|f| f.expect("a network fabric"))
    .collect();
    // 4 channels and the control connection, each way, to one peer.
    let conns = 2 * (HostConfig::default().net_channels + 1);
    let own: Vec<(usize, usize)> = (0..2)
        .map(|r| oxccl_net::config::auto_sockets(cores(r), 2, conns))
        .collect();
    assert_ne!(own[0].0, own[1].0, "the defaults should differ: {own:?}");
    let agreed: Vec<_> = fabs.iter().map(|f| f.network_sockets()).collect();
    assert_eq!(agreed, vec![Some((2, 2)); 2], "own defaults {own:?}");
    // The connections work: an AllReduce over them is right.
    let coll = Collective::new(CollKind::AllReduce, 300_000, 1);
    let mut req = PlanRequest::new(coll, 2, Algo::Ring);
    req.channels = 2;
    req.chunk = HostConfig::default().slot_bytes / 4;
    let plan = generate(&req).expect("a ring plan");
    let inputs: Vec<Vec<f32>> = (0..2)
        .map(|r| testkit::input(&coll, 2, r, RedOp::Sum, 3))
        .collect();
    let op = RedOp::Sum.lower(DataType::F32, 2);
    let outs: Vec<Vec<f32>> = run_plan(fabs.as_slice(), &plan, &inputs, false, &op, &[])
        .into_iter()
        .map(|r| r.expect("every rank ran").expect("no error").0)
        .collect();
    assert_eq!(testkit::compare(&coll, &inputs, &outs, RedOp::Sum).0, 0);
}
