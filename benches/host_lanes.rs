//! The host backend's reduction lanes: one fold `acc[i] = acc[i] op src[i]`
//! of 256 KiB of each narrow float (f16, bf16, fp8 E4M3 and E5M2), Sum and
//! Max, through whichever lanes this CPU runs (AVX-512, AVX2/F16C or the
//! scalar loop, detected at run time). What a host AllReduce spends per
//! byte beyond moving it; `oxccl-host`'s `fold_speed` example compares the
//! same folds against an f32 add loop.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxccl::{bf16, f16, Element, F8E4M3, F8E5M2};
use oxccl_core::BaseOp;

const BYTES: usize = 256 << 10;

fn fold<T: Element>(c: &mut Criterion, name: &str, from: impl Fn(f32) -> T) {
    let n = BYTES / std::mem::size_of::<T>();
    // Small values, so Sum stays finite and no lane takes a slow path.
    let src: Vec<T> = (0..n).map(|i| from((i % 7) as f32 * 0.125)).collect();
    let mut g = c.benchmark_group("host_lanes");
    g.throughput(Throughput::Bytes(BYTES as u64));
    for (op, base) in [("sum", BaseOp::Sum), ("max", BaseOp::Max)] {
        let mut acc: Vec<T> = (0..n).map(|i| from((i % 5) as f32 * 0.25)).collect();
        g.bench_function(BenchmarkId::new(name, op), |b| {
            b.iter(|| {
                // Max leaves `acc` bounded; Sum is reset now and then.
                if base == BaseOp::Sum {
                    acc.fill(from(0.0));
                }
                assert!(oxccl_host::fold_narrow(black_box(&mut acc), &src, base));
            })
        });
    }
    g.finish();
}

fn lanes(c: &mut Criterion) {
    fold(c, "f16", f16::from_f32);
    fold(c, "bf16", bf16::from_f32);
    fold(c, "f8e4m3", F8E4M3::from_f32);
    fold(c, "f8e5m2", F8E5M2::from_f32);
}

criterion_group!(benches, lanes);
criterion_main!(benches);
