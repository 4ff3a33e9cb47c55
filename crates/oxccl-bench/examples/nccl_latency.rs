//! NCCL's small-message latency, the twin of `latency`: an 8-byte f32
//! AllReduce on N ranks (one GPU each, the system libnccl.so.2 or
//! `OXCCL_NCCL_LIB`, `NCCL_NVLS_ENABLE=0`), eager and replayed from a CUDA
//! graph. `nccl_latency [RANKS]` (default: every visible GPU).

use std::time::Duration;

fn main() {
    // Skips without a driver; fails under OXCCL_REQUIRE_GPU=1 or on any other error.
    let Some(info) = oxccl_cuda::device_or_skip("nccl_latency") else {
        return;
    };
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(info.devices.len());
    // Round-robin as oxccl places ranks; more ranks than GPUs is refused.
    let devices: Vec<i32> = (0..n).map(|r| (r % info.devices.len()) as i32).collect();
    let nccl = match oxccl_bench::nccl::Nccl::new(&devices, Duration::from_secs(30)) {
        Ok(x) => x,
        Err(e) => {
            println!("nccl latency: n/a ({e})");
            return;
        }
    };
    match nccl.allreduce_latency() {
        Ok(l) => println!(
            "nccl latency: NCCL {}, 8 B f32 allreduce, {n} ranks: eager {:.2} us/call, graph {:.2} us/call (median over 15 runs, slowest rank)",
            nccl.version(),
            l.eager_us,
            l.graph_us
        ),
        Err(e) => println!("nccl latency: failed ({e})"),
    }
}
