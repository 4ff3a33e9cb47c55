#!/bin/bash
# compute-sanitizer on the device suite in relaunch mode (OXCCL_RELAUNCH=1:
# no kernel waits for another's, which the sanitizer's one-kernel-at-a-time
# execution needs; see crates/oxccl-cuda/src/world/relaunch.rs), quick cases
# (f32 and bf16, the first op of each), each tool at each rank count.
# Run from the repository root on the GPU machine, binaries in .gpu/:
#   bash device/sanitizer-run.sh "memcheck racecheck synccheck" "2 3 4 8" 120
# (tools, rank counts, seconds per run). Prints each run's test result and
# the sanitizer's summary line.
G=$PWD/.gpu
TOOLS=${1:-memcheck racecheck synccheck}
RANKS=${2:-2 3 4 8}
SECS=${3:-120}
export OXCCL_REQUIRE_GPU=1 OXCCL_RELAUNCH=1 OXCCL_GPU_QUICK=1
export OXCCL_CACHE_DIR=${OXCCL_CACHE_DIR:-/tmp/oxcache}
mkdir -p "$OXCCL_CACHE_DIR" && cp "$G"/cache/* "$OXCCL_CACHE_DIR"/ 2>/dev/null
for tool in $TOOLS; do
  for n in $RANKS; do
    t0=$(date +%s)
    out=$(OXCCL_GPU_RANKS=$n timeout "$SECS" compute-sanitizer --tool "$tool" \
      "$G/gpu-test" --test-threads=1 2>&1)
    rc=$?
    echo "$tool $n ranks: rc=$rc $(( $(date +%s) - t0 )) s |" \
      "$(echo "$out" | grep -E '^test result' | tail -1) |" \
      "$(echo "$out" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' | tail -1)"
    echo "$out" | grep -E 'panicked|FAILED|Invalid|Race|Barrier' | head -5
  done
done
