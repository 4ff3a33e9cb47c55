//! Compiles every kernel module with NVRTC (no GPU needed, only libnvrtc)
//! and fills the disk cache: `compile_kernels [ARCH]` (default 90).
//! Useful to check the kernel sources on a machine without a GPU and to
//! ship a warm cache.

fn main() {
    // The library takes OXCCL_CACHE_DIR through its settings; this tool reads it itself.
    let chosen = std::env::var_os("OXCCL_CACHE_DIR").map(std::path::PathBuf::from);
    let arch: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(90);
    println!(
        "cache dir: {}",
        oxccl_cuda::kernels::cache_dir(chosen.as_deref()).display()
    );
    let mut failed = false;
    for (dt, _) in oxccl_cuda::kernels::DTYPES {
        let t = std::time::Instant::now();
        match oxccl_cuda::kernels::cubin(
            dt,
            arch,
            &oxccl_cuda::kernels::cache_dir(chosen.as_deref()),
        ) {
            Ok((bin, origin)) => println!(
                "{dt:>9} sm_{arch}: {} bytes, {origin:?}, {:?}",
                bin.len(),
                t.elapsed()
            ),
            Err(e) => {
                println!("{dt:>9} sm_{arch}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
