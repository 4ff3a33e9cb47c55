#!/bin/bash
# The GPU validation run: build here first with device/build-binaries.sh,
# then on the device machine with carry [".gpu"]:  bash device/validation-run.sh
# Every step has its own timeout; logs go to $OUT/*.log, plots/JSON to $OUT.
. "$(dirname "$0")/env.sh"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  step "nvidia-smi topo -m"; nvidia-smi topo -m
  step "xtask topo"; timeout 30 $G/xtask topo
  step "kernel cache (NVRTC compile on a cold cache)"; timeout 120 $G/compile_kernels 90
} 2>&1 | tee $OUT/machine.log
{
  step "gpu tests 1,2,3,4,8 ranks"
  OXCCL_GPU_RANKS=1,2,3,4,8 timeout 150 $G/gpu-test --test-threads=1 --nocapture 2>&1 |
    grep -vE "^$|^running|^test .* \.\.\. $"; echo "rc=$?"
  step "facade suite on CUDA (collectives cuda_every_case)"
  timeout 60 $G/collectives cuda_every_case --nocapture 2>&1 | tail -15
  step "driver calls that wait for a running kernel (sync_probe)"
  timeout 60 $G/sync_probe 2>&1 | tail -30
  step "lifetimes: freed buffers reused in stream order; random collectives on fresh buffers, 2/3/8 ranks"
  for n in 2 3 8; do
    OXCCL_GPU_RANKS=$n OXCCL_UAF_ITERS=60 timeout 60 $G/lifetimes cuda_freed --nocapture 2>&1 | grep -E "reuse loop|test result|rank [0-9]"
    OXCCL_GPU_RANKS=$n OXCCL_LOOP_CALLS=2000 timeout 120 $G/lifetimes cuda_random --nocapture 2>&1 | grep -E "random loop|test result|rank [0-9]"
  done
} 2>&1 | tee $OUT/tests.log
{
  step "memcheck (2 ranks, quick)"
  OXCCL_GPU_QUICK=1 OXCCL_GPU_RANKS=2 timeout 60 compute-sanitizer --tool memcheck \
    $G/gpu-test every_case --test-threads=1 --nocapture 2>&1 | grep -E "ERROR SUMMARY|cases|test result|Invalid|Race" | head -20
  step "racecheck (2 ranks, quick)"
  OXCCL_GPU_QUICK=1 OXCCL_GPU_RANKS=2 timeout 60 compute-sanitizer --tool racecheck \
    $G/gpu-test every_case --test-threads=1 --nocapture 2>&1 | grep -E "RACECHECK SUMMARY|cases|test result|hazard" | head -20
} 2>&1 | tee $OUT/sanitizer.log
{
  step "latency: 8 ranks, 8 B AllReduce, eager and CUDA graph"
  timeout 40 $G/latency 8 oneshot
} 2>&1 | tee $OUT/latency.log
{
  step "sweep: every collective at 256 MiB, 8 ranks"
  t0=$SECONDS
  timeout 100 $G/xtask sweep --backend cuda --ranks 8 -b 256M -e 256M -d float --coll all \
    --baseline -n 10 -w 3 --json $OUT/all256.json
  echo "rc=$? wall=$((SECONDS - t0)) s"
} 2>&1 | tee $OUT/sweep_all.log
{
  step "sweep: AllReduce curve 8 B - 1 GiB, 8 ranks"
  t0=$SECONDS
  timeout 200 $G/xtask sweep --backend cuda --ranks 8 -b 8 -e 1G -f 2 \
    --coll allreduce --baseline --svg $OUT/allreduce.svg --json $OUT/allreduce.json
  echo "rc=$? wall=$((SECONDS - t0)) s"
  date -u
} 2>&1 | tee $OUT/sweep_allreduce.log
{
  # One GPU, one rank: the only NCCL comparison one H200 allows (NCCL refuses
  # several ranks on one GPU). NCCL_NVLS_ENABLE=0 is set by the sweep if unset.
  step "sweep --nccl: every collective 8 B - 64 MiB, 1 rank, NCCL on the same buffers"
  t0=$SECONDS
  timeout 120 $G/xtask sweep --backend cuda --ranks 1 -b 8 -e 64M -f 8 --coll all --nccl \
    --svg $OUT/nccl1.svg --json $OUT/nccl1.json
  echo "rc=$? wall=$((SECONDS - t0)) s"
  step "sweep --nccl with 2 ranks on one GPU: NCCL columns must say n/a, not fail"
  timeout 30 $G/xtask sweep --backend cuda --ranks 2 -b 8 -e 4K -f 8 --coll allreduce --nccl
  echo "rc=$?"
  step "NCCL latency: 8 B AllReduce, eager and CUDA graph, 1 rank"
  timeout 30 $G/nccl_latency 1
} 2>&1 | tee $OUT/nccl.log
