//! The selector's decision: `oxccl_topo::Policy::best`, the cost model's
//! choice of algorithm, protocol, channels and transport for one call (the
//! facade remembers each answer per collective and size, so this is a
//! first-call cost). 8 ranks sharing one GPU of the `single-gpu` preset,
//! registered buffers, every algorithm and Simple/LL allowed, at a
//! launch-bound, a middle and a bandwidth-bound size.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use oxccl_core::{Algo, CollKind, Proto};
use oxccl_topo::{Policy, Topology};

fn decide(c: &mut Criterion) {
    let topo = Topology::preset("single-gpu", 1).expect("the preset exists");
    let policy = Policy::gpu(&topo, &[0; 8], 16);
    let protos = [Proto::Simple, Proto::LL];
    let mut g = c.benchmark_group("selector");
    for kind in [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::Broadcast,
    ] {
        for bytes in [8usize, 1 << 20, 256 << 20] {
            let id = BenchmarkId::new(kind.name(), bytes);
            g.bench_function(id, |b| {
                b.iter(|| policy.best(kind, black_box(bytes), true, &Algo::ALL, &protos))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, decide);
criterion_main!(benches);
