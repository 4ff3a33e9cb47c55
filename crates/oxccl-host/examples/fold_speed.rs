//! The narrow-float folds alone, one thread, no collective around them:
//! µs to fold BYTES (default 1 MiB) of each type into an accumulator that
//! stays in cache, and the ratio to an f32 add loop over the same bytes
//! (what f32 Sum runs). The best of 15 runs of 20 folds: a shared
//! machine's other load only ever adds time.
//!
//! `cargo run --release -p oxccl-host --example fold_speed [BYTES]`

use std::time::Instant;

use oxccl_core::float8::{F8E4M3, F8E5M2};
use oxccl_core::half::{bf16, f16};
use oxccl_core::{BaseOp, Element};

fn best(mut f: impl FnMut()) -> f64 {
    (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..20 {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / 20.0
        })
        .fold(f64::INFINITY, f64::min)
}

fn row<T: Element>(name: &str, bytes: usize, base: BaseOp, f32_us: f64) {
    let n = bytes / size_of::<T>();
    let mut acc = vec![T::from_f64(1.0); n];
    let src = vec![T::from_f64(0.5); n];
    let us = best(|| {
        assert!(oxccl_host::fold_narrow(&mut acc, &src, base));
        std::hint::black_box(&mut acc);
    });
    println!("{name:>7} {base:<4?} {us:8.1} us  {:5.2}x", us / f32_us);
}

fn main() {
    let bytes = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1 << 20);
    let n = bytes / 4;
    let (mut acc, src) = (vec![1.0f32; n], vec![0.5f32; n]);
    let f32_us = best(|| {
        for (a, s) in acc.iter_mut().zip(&src) {
            *a += *s;
        }
        std::hint::black_box(&mut acc);
    });
    println!("fold_speed: {bytes} B, us per fold (ratio to f32 add)");
    println!("    f32 Sum  {f32_us:8.1} us   1.00x");
    for base in [BaseOp::Sum, BaseOp::Max, BaseOp::Min] {
        row::<f16>("f16", bytes, base, f32_us);
        row::<bf16>("bf16", bytes, base, f32_us);
        row::<F8E4M3>("f8e4m3", bytes, base, f32_us);
        row::<F8E5M2>("f8e5m2", bytes, base, f32_us);
    }
    row::<F8E4M3>("f8e4m3", bytes, BaseOp::Prod, f32_us);
    row::<F8E5M2>("f8e5m2", bytes, BaseOp::Prod, f32_us);
}
