#!/bin/bash
# Builds, on this machine, every binary validation-run.sh (and any device
# experiment) runs on the GPU machine, which has no Rust: release, stripped,
# copied into the git-ignored .gpu/, which travels with `carry: [".gpu"]`.
# Run from anywhere:
#   device/build-binaries.sh && du -ch .gpu/* | tail -1   # must stay under 64 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
G=.gpu
T=${CARGO_TARGET_DIR:-target}
# Every binary from one tree: the 2026-12-04 17:10 H200 run's xtask was
# built at 18:00, before a merge at 18:03 brought 7cb56f3, and the rest
# after it (docs/perf/LOG.md).
tree() { git rev-parse HEAD; git diff HEAD -- crates kernels xtask Cargo.toml Cargo.lock | sha1sum; }
START=$(tree)
exe() { # the test executable cargo built for `cargo test --release $*`
  cargo test --release --no-run --message-format=json "$@" 2>/dev/null |
    python3 -c 'import sys,json
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]: print(m["executable"])' | tail -1
}
cargo build --release -p xtask
cargo build --release -p oxccl-cuda --example compile_kernels
cargo build --release -p oxccl-bench --example latency --example nccl_latency --example sync_floor --example fanout_floor --example call_latency --example sync_probe
cp $T/release/xtask $G/xtask
cp $T/release/examples/latency $G/latency
cp $T/release/examples/compile_kernels $G/compile_kernels
cp $T/release/examples/nccl_latency $G/nccl_latency
cp $T/release/examples/sync_floor $G/sync_floor
cp $T/release/examples/fanout_floor $G/fanout_floor
cp $T/release/examples/sync_probe $G/sync_probe
cp "$(exe -p oxccl --test lifetimes)" $G/lifetimes
cp "$(exe -p oxccl-cuda --test gpu)" $G/gpu-test
cp "$(exe -p oxccl --test collectives)" $G/collectives
cp "$(exe -p oxccl --test external)" $G/external
cp "$(exe -p oxccl --test multiprocess)" $G/multiprocess
cp "$(exe -p oxccl --test mismatch)" $G/mismatch
cp "$(exe -p oxccl --test deterministic)" $G/deterministic
cp "$(exe -p oxccl --test split_threads)" $G/split_threads
cp $T/release/examples/call_latency $G/call_latency
# The drop-in library and the PyTorch check (recheck-run.sh's torch steps).
cargo build --release -p oxccl-capi
cp $T/release/liboxccl_capi.so $G/libnccl.so.2
cp crates/oxccl-capi/tests/torch/check_torch.py $G/
BINS="libnccl.so.2 call_latency xtask latency compile_kernels nccl_latency sync_floor fanout_floor sync_probe lifetimes gpu-test collectives external multiprocess mismatch deterministic split_threads"
(cd $G && strip $BINS)
# The kernel cache, compiled here by NVRTC 13.0 (the device's version) when it
# is unpacked; it saves the device a cold compile (~70 s).
NVRTC=${NVRTC:-/work/nvrtc/x/nvidia/cu13/lib}
# NVRTC: the pip wheel nvidia-cuda-nvrtc==13.0.88 unpacked, with
# libnvrtc.so linked to libnvrtc.so.13 (the loader asks for the bare name).
if [ -d "$NVRTC" ]; then
  rm -rf $G/cache
  LD_LIBRARY_PATH=$NVRTC OXCCL_CACHE_DIR=$PWD/$G/cache $T/release/examples/compile_kernels
  if [ -z "$(ls -A $G/cache 2>/dev/null)" ]; then
    echo "build-binaries.sh: no kernel cache was written (is $NVRTC/libnvrtc.so there?)" >&2
    exit 1
  fi
else
  echo "build-binaries.sh: no NVRTC at $NVRTC: no kernel cache (the device compiles, ~70 s)" >&2
fi
if [ "$(tree)" != "$START" ]; then
  echo "build-binaries.sh: the sources changed during the build (a merge?); run it again" >&2
  exit 1
fi
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates kernels xtask && echo "" || echo "-dirty")" > $G/COMMIT
ls -la $G
du -ch $G | tail -1
