#!/bin/bash
# Fills the folder run_device.sh carries to the GPU machine (default
# /work/main/.gpu-capi): the release libnccl.so.2, the torch script, the
# sweep binary and a kernel cache compiled here with NVRTC 13 (see
# HELPERS.md). Run from the repository root.
set -euo pipefail
D=${1:-/work/main/.gpu-capi}
T=${CARGO_TARGET_DIR:-target}
mkdir -p "$D"
cargo build --release -p oxccl-capi -p xtask
cargo build --release -p oxccl-cuda --example compile_kernels
cp $T/release/liboxccl_capi.so "$D/libnccl.so.2"
cp $T/release/xtask "$D/xtask"
strip "$D/libnccl.so.2" "$D/xtask"
# The C ABI's 8 B latency program, linked with the library beside it.
gcc -std=c11 -D_DEFAULT_SOURCE -O2 -I crates/oxccl-capi/include crates/oxccl-capi/tests/c/latency.c \
  -o "$D/c_latency" -L"$D" -l:libnccl.so.2 -ldl -Wl,-rpath,'$ORIGIN'
cp crates/oxccl-capi/tests/torch/check_torch.py crates/oxccl-capi/tests/torch/run_device.sh "$D/"
mv "$D/run_device.sh" "$D/run.sh"
LD_LIBRARY_PATH=/work/nvrtc/x/nvidia/cu13/lib OXCCL_CACHE_DIR="$D/cache" $T/release/examples/compile_kernels
du -sh "$D"
