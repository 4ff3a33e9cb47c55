//! The narrow-float folds alone, one thread, no collective around them:
//! µs to fold BYTES (default 1 MiB) of each type into an accumulator that
//! stays in cache, and the ratio to an f32 add loop over the same bytes
//! (what f32 Sum runs). The best of 15 runs of 20 folds: a shared
//! machine's other load only ever adds time. Then fp8 Sum and Prod on
//! random data (see `random_rows`).
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

/// fp8 Sum and Prod on random data, each fold from a fresh copy of the
/// accumulator (the copy's own time, measured alone, taken off): every
/// finite byte equally likely (the worst case for the AVX-512 byte lanes,
/// which leave groups with results under the smallest normal to the f32
/// lanes), and a bell curve (a sum of four uniforms, times `scale`).
fn random_rows<T: Element>(
    name: &str,
    bytes: usize,
    from: impl Fn(u8) -> T,
    scale: f64,
    f32_us: f64,
) {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut byte = || loop {
        let v = from(next() as u8);
        if v.to_f64().is_finite() {
            break v;
        }
    };
    let uniform: Vec<T> = (0..2 * bytes).map(|_| byte()).collect();
    let mut bell = || {
        let u: f64 = (0..4)
            .map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64)
            .sum();
        T::from_f64((u - 2.0) * scale)
    };
    let curve: Vec<T> = (0..2 * bytes).map(|_| bell()).collect();
    for base in [BaseOp::Sum, BaseOp::Prod] {
        for (data, values) in [("random bytes", &uniform), ("bell curve", &curve)] {
            let (acc, src) = values.split_at(bytes);
            let mut work = acc.to_vec();
            let copy = best(|| {
                work.copy_from_slice(acc);
                std::hint::black_box(&mut work);
            });
            let us = best(|| {
                work.copy_from_slice(acc);
                assert!(oxccl_host::fold_narrow(&mut work, src, base));
                std::hint::black_box(&mut work);
            }) - copy;
            println!(
                "{name:>7} {base:<4?} {us:8.1} us  {:5.2}x  {data}",
                us / f32_us
            );
        }
    }
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
    random_rows("f8e4m3", bytes, F8E4M3::from_bits, 16.0, f32_us);
    random_rows("f8e5m2", bytes, F8E5M2::from_bits, 16.0, f32_us);
}
