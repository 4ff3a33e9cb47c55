//! The call check's CPU work per call, without a clique: a collective's
//! fingerprint packed into the board's words, every rank's words read back
//! and compared (8 and 128 ranks), and a group's digest of 16 collectives.
//! The rendezvous itself (waiting for the peers' records) is the rest of
//! the check's cost and depends on the ranks' scheduling, not on this code:
//! `oxccl-bench`'s `call_latency` times it with the check on and off.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use oxccl::call_check;
use oxccl::{CollKind, DataType, RedOp};

fn check(c: &mut Criterion) {
    let mut g = c.benchmark_group("call_check");
    g.bench_function("fingerprint", |b| {
        b.iter(|| {
            call_check::fingerprint(
                CollKind::AllReduce,
                DataType::F32,
                black_box(1 << 20),
                RedOp::Sum,
                0,
            )
        })
    });
    for nranks in [8usize, 128] {
        let w = call_check::fingerprint(CollKind::Reduce, DataType::Bf16, 4096, RedOp::Max, 3);
        let words = vec![w; nranks];
        assert!(call_check::agree(&words));
        g.bench_with_input(BenchmarkId::new("agree", nranks), &words, |b, words| {
            b.iter(|| call_check::agree(black_box(words)))
        });
    }
    g.bench_function("group_digest_16", |b| {
        b.iter(|| call_check::group_digest(black_box(16)))
    });
    g.finish();
}

criterion_group!(benches, check);
criterion_main!(benches);
