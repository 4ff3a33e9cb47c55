//! Plan generation: `oxccl_core::generate` for the shapes the facade asks
//! for most (a plan is made once per collective, size and algorithm and
//! cached, so this is first-call cost): ring and double binary tree
//! AllReduce on 8 ranks, registered two-shot AllReduce and all-pairs
//! AllGather on 8 and 128 ranks, 1 Mi elements per rank.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use oxccl_core::{generate, Algo, CollKind, Collective, PlanRequest};

fn request(kind: CollKind, algo: Algo, nranks: u32, registered: bool) -> PlanRequest {
    let count = match kind {
        // AllGather's count is per rank's block.
        CollKind::AllGather => (1 << 20) / nranks as usize,
        _ => 1 << 20,
    };
    let mut req = PlanRequest::new(Collective::new(kind, count, 0), nranks, algo);
    req.channels = 4;
    req.registered = registered;
    req
}

fn plans(c: &mut Criterion) {
    let cases = [
        ("allreduce_ring", CollKind::AllReduce, Algo::Ring, false),
        (
            "allreduce_tree",
            CollKind::AllReduce,
            Algo::DoubleBinaryTree,
            false,
        ),
        (
            "allreduce_twoshot",
            CollKind::AllReduce,
            Algo::TwoShot,
            true,
        ),
        (
            "allgather_allpairs",
            CollKind::AllGather,
            Algo::AllPairs,
            true,
        ),
    ];
    let mut g = c.benchmark_group("plan_generation");
    for (name, kind, algo, registered) in cases {
        for nranks in [8, 128] {
            if nranks == 128 && !registered {
                continue;
            }
            let req = request(kind, algo, nranks, registered);
            // A shape the generators refuse would time an error.
            generate(&req).expect("the benchmark's plan generates");
            g.bench_with_input(BenchmarkId::new(name, nranks), &req, |b, req| {
                b.iter(|| generate(black_box(req)).map(|p| p.ranks.len()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, plans);
criterion_main!(benches);
