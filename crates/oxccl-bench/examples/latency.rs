//! Small-message latency: an 8-byte f32 AllReduce on N ranks, each rank on
//! its own host thread and stream. Reports the median per-call time over
//! device events, eager (one launch per call) and replayed from a CUDA
//! graph (100 calls captured per graph), and beside it the same harness
//! launching an empty plan (no synchronisation, no data: the launch floor
//! with N threads launching at once).
//! `latency [RANKS[,RANKS...]] [ALGO] [reg|fifo] [simple|ll] [THREADS]`,
//! default `2,4,8 oneshot reg simple` and the clique's default threads per
//! block for small plans (`WorldConfig::small_threads`; 512 runs them as
//! large ones): registered buffers run the direct (put/get) plan; `fifo`
//! runs the FIFO plan of the same algorithm under the protocol; `ll1`
//! runs the one-step LL kernel (`latency 8 ll1 fifo ll`).
//! `latency RANKS barrier` instead times plans of one, two and four
//! all-pairs barriers (every rank signals every peer, then waits for every
//! peer; no data): what one barrier costs, and what the first costs more
//! (the ranks' kernels arriving at different times).

use std::sync::Barrier;
use std::time::Duration;

use oxccl_bench::latency::{rank_latency, slowest, Latency, RUNS};
use oxccl_core::gen::{generate, PlanRequest};
use oxccl_core::plan::{BufDecl, BufRole, Channel, Plan, RankPlan, Step};
use oxccl_core::{Algo, CollKind, Collective, DataType, Proto, RedOp};
use oxccl_cuda::{Party, World, WorldConfig};

/// (eager, graph) µs per call of the slowest rank, each rank on its own
/// thread through the shared harness.
fn measure(w: &World, plan: &Plan, proto: Proto) -> (f64, f64) {
    let n = w.nranks();
    let op = RedOp::Sum.lower(DataType::F32, n);
    let bar = Barrier::new(n as usize);
    let res: Vec<Latency> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (op, bar) = (&op, &bar);
                s.spawn(move || {
                    let rp = &plan.ranks[r as usize];
                    let a = w.alloc(r, 8).unwrap();
                    let b = w.alloc(r, 8).unwrap();
                    let addrs: Vec<u64> = rp
                        .bufs
                        .iter()
                        .enumerate()
                        .map(|(i, _)| [a, b, 0].get(i).copied().unwrap_or(0))
                        .collect();
                    // `ll1`'s plans run the one-step LL kernel (the floor's
                    // empty plan stays a plan).
                    let count = plan.coll.map_or(0, |c| c.count);
                    let p = if plan.algo == Algo::OneShotLl && count > 0 {
                        w.prepare_oneshot_ll(rp, 4, proto, count).unwrap()
                    } else {
                        w.prepare_proto(rp, 4, proto).unwrap()
                    };
                    let launch = || {
                        // SAFETY: live allocations of 8 bytes = the plan's 2 floats.
                        Ok(unsafe { w.launch(&p, r, &addrs, DataType::F32, op, Party::All, 0) }?)
                    };
                    let settle = || Ok(w.synchronize(r)?);
                    let l = rank_latency(w.stream(r).unwrap(), bar, &launch, &settle).unwrap();
                    w.free(r, a).unwrap();
                    w.free(r, b).unwrap();
                    l
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let l = slowest(&res);
    (l.eager_us, l.graph_us)
}

fn plan(count: usize, n: u32, algo: Algo, registered: bool) -> Plan {
    let req = PlanRequest {
        registered,
        ..PlanRequest::new(Collective::new(CollKind::AllReduce, count, 0), n, algo)
    };
    generate(&req).expect("plan")
}

/// `k` all-pairs barriers on one channel, over the two 2-float buffers the
/// harness binds (declared, untouched).
fn barriers(n: u32, k: usize) -> Plan {
    let buf = |role| BufDecl {
        role,
        len: 2,
        must_write: false,
    };
    let ranks = (0..n)
        .map(|r| {
            let peers = (0..n).filter(|&q| q != r);
            let one: Vec<Step> = peers
                .clone()
                .map(|peer| Step::Signal { peer })
                .chain(peers.map(|peer| Step::Wait { peer }))
                .collect();
            RankPlan {
                rank: r,
                nranks: n,
                bufs: vec![buf(BufRole::Input), buf(BufRole::Output)],
                channels: vec![Channel {
                    steps: one.iter().cloned().cycle().take(k * one.len()).collect(),
                }],
            }
        })
        .collect();
    Plan {
        algo: Algo::AllPairs,
        coll: None,
        nranks: n,
        ranks,
    }
}

fn main() {
    let ranks: Vec<u32> = std::env::args()
        .nth(1)
        .map(|a| a.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 4, 8]);
    let barrier_mode = std::env::args().nth(2).is_some_and(|a| a == "barrier");
    let algo: Algo = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(Algo::OneShot);
    let registered = std::env::args().nth(3).is_none_or(|a| a != "fifo");
    let proto = match std::env::args().nth(4).as_deref() {
        Some("ll") | Some("LL") => Proto::LL,
        _ => Proto::Simple,
    };
    let small_threads: Option<u32> = std::env::args().nth(5).and_then(|a| a.parse().ok());
    let kind = if registered { "registered" } else { "fifo" };
    // Skips without a driver; fails under OXCCL_REQUIRE_GPU=1 or on any other error.
    let Some(info) = oxccl_cuda::device_or_skip("latency") else {
        return;
    };
    for n in ranks {
        let mut cfg =
            WorldConfig::round_robin(n, info.devices.len() as i32, Duration::from_secs(30));
        if let Some(t) = small_threads {
            cfg.small_threads = t;
        }
        let threads = cfg.small_threads;
        let w = World::new(cfg).expect("world");
        // An AllReduce of 0 elements: every rank launches one block with
        // no steps, so this is the harness's own floor.
        let (fe, fg) = measure(&w, &plan(0, n, algo, registered), proto);
        if barrier_mode {
            for k in [1, 2, 4] {
                let (eager, graph) = measure(&w, &barriers(n, k), proto);
                println!(
                    "latency: {k} all-pairs barrier(s), {n} ranks: eager {eager:.2} us/call, graph {graph:.2} us/call \
                     (empty-plan floor: eager {fe:.2}, graph {fg:.2}; median over {RUNS} runs, slowest rank)"
                );
            }
            continue;
        }
        let (eager, graph) = measure(&w, &plan(2, n, algo, registered), proto);
        println!(
            "latency: 8 B f32 allreduce, {n} ranks, {algo} {kind} {proto}, small plans {threads} threads: eager {eager:.2} us/call, graph {graph:.2} us/call \
             (empty-plan floor: eager {fe:.2}, graph {fg:.2}; median over {RUNS} runs, slowest rank; {})",
            w.describe()
        );
    }
}
