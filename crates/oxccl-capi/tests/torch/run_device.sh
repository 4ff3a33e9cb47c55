#!/bin/bash
# The PyTorch check on the device: the device's unmodified PyTorch 2.11 on oxccl's
# libnccl.so.2 (LD_PRELOAD), 2, 4 and 8 rank processes on the one GPU,
# without and with MPS; torch all_reduce of 256 MiB at 8 processes next to
# `xtask sweep --procs 8` on the same run; 8 B latency through the C ABI.
# Run from the repository root with the folder build_device.sh filled
# (default .gpu-capi) carried along:
#   G=.gpu-capi bash .gpu-capi/run.sh       # PROCS="2 4 8" MPS="0 1" by default
set -o pipefail
G=$PWD/${G:-.gpu-capi}
OUT=${OUT:-/tmp/capi-out}; mkdir -p "$OUT"
export OXCCL_CACHE_DIR=/tmp/oxcache-capi; mkdir -p $OXCCL_CACHE_DIR
cp $G/cache/* $OXCCL_CACHE_DIR/ 2>/dev/null
export OXCCL_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
LIB=$G/libnccl.so.2
PROCS=${PROCS:-"2 4 8"}
PROCS_MPS=${PROCS_MPS:-$PROCS}
MPS=${MPS:-"0 1"}
T=${T:-150}
MPS_PIPE=/tmp/capi-mps-pipe
export CUDA_MPS_LOG_DIRECTORY=/tmp/capi-mps-log
mps_on=0
stop_mps() { if [ $mps_on = 1 ]; then echo quit | nvidia-cuda-mps-control; mps_on=0; sleep 1; fi; }
trap stop_mps EXIT
step() { echo "=== $1 ($(date +%T))"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  step "import torch with the library preloaded"
  LD_PRELOAD=$LIB timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
  readelf -d $LIB | grep SONAME
} 2>&1 | tee $OUT/machine.log
for m in $MPS; do
  if [ "$m" = 1 ]; then
    export CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d && mps_on=1
    step "MPS started (rc $?)"
  else
    unset CUDA_MPS_PIPE_DIRECTORY
  fi
  # The sweep first: under MPS, run after the torch processes it once
  # failed at context creation (CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED).
  { step "sweep --procs 8, mps=$m: all_reduce 8 B and 256 MiB, float (the torch figures' baseline, same run)"
    OXCCL_DEADLINE_MS=20000 timeout 100 $G/xtask sweep --procs 8 --backend cuda -b 8 -e 256M -f 33554432 -d float --coll allreduce -n 10 -w 3; echo "rc=$?"
  } 2>&1 | tee $OUT/sweep-mps$m.log
  list=$PROCS; [ "$m" = 1 ] && list=$PROCS_MPS
  for n in $list; do
    bench=""; [ "$n" = 8 ] && bench="--bench"
    step "torch procs=$n mps=$m"
    LD_PRELOAD=$LIB timeout $((T + 10)) python3 $G/check_torch.py --procs $n --timeout $T $bench 2>&1 | grep -v "unbatched P2P op" | tail -25
  done 2>&1 | tee $OUT/torch-mps$m.log
  { step "8 B AllReduce through the C ABI, mps=$m"
    for n in 2 8; do timeout 60 $G/c_latency $n 300; done
  } 2>&1 | tee $OUT/latency-mps$m.log
  stop_mps
done
date -u
