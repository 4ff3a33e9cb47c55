//! oxccl-bench: what only measures (not published). The NCCL baseline,
//! loaded at run time ([`nccl`]); the one latency harness every small-call
//! measurement uses ([`latency`]); the one [`median`]. The experiments are
//! its examples: `latency` (the executor's launch alone), `call_latency`
//! (through the facade), `facade_overhead` (the facade's CPU cost on a
//! backend that does nothing), `capi_call_cost` (what the C ABI and
//! PyTorch's call pattern add over the Rust call, host backend, through
//! the built `libnccl.so.2`), `nccl_latency` (NCCL's figure) and
//! `sync_floor` (the hardware floor of one flag exchange, its kernels in
//! `kernels/sync_floor.cu`) and `fanout_floor` (what the HBM allows one
//! read written into several, as pushed Broadcast and AllGather move data,
//! its kernels in `kernels/fanout_floor.cu`). `cargo xtask sweep --nccl`
//! uses [`nccl`] too.

pub mod error;
pub mod latency;
pub mod nccl;

pub use error::{BenchError, Result};

/// The median of `v` (the upper one of an even count; 0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_takes_the_middle_whatever_the_order() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(vec![]), 0.0);
        // An outlier moves the mean, not the median.
        assert_eq!(median(vec![1.0, 1.0, 1000.0]), 1.0);
    }
}
