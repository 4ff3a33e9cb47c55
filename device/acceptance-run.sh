#!/bin/bash
# The device acceptance runs of the selector (the pick against the best
# forced algorithm) and of many ranks (16-128 on one GPU), on whichever GPU is
# lent (both have run them: docs/perf/LOG.md). Build here with device/build-binaries.sh,
# then on the device machine, `carry: [".gpu"]`, from the repository root, one
# block per call (each fits one 600 s call):
#   bash device/acceptance-run.sh suite   # device suite 1-8 ranks, 64-rank facade test (~60 s)
#   bash device/acceptance-run.sh pick    # pick against best forced, worst ratio <= 1.10 (~250 s)
#   bash device/acceptance-run.sh ranks   # 16-128 ranks: checked, floor ratios, 8 B latency (~400 s)
#   bash device/acceptance-run.sh ranks 16 32   # the same at the counts named
#   bash device/acceptance-run.sh smem 128 64   # one block per SM against none (~200 s)
#   bash device/acceptance-run.sh push 128      # outputs per pushing step; queues shared (~110 s)
# Logs go to $OUT; the lines worth reading are printed.
. "$(dirname "$0")/env.sh"
rows() { grep -E "^ +[0-9]|^# (oxccl sweep|Collective|copy|spread)|Out of bounds|rror|pick" "$1" | cut -c1-170; }
st "$(cat $G/COMMIT 2>/dev/null) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
case "${1:-}" in
suite)
  st "device suite, 1 2 3 4 8 ranks"
  OXCCL_GPU_RANKS=1,2,3,4,8 timeout 200 $G/gpu-test --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED" | head
  st "facade: every collective at 64 ranks; the mismatch suite on CUDA"
  timeout 60 $G/collectives cuda_every_collective_64_ranks 2>&1 | grep -E "test result|panicked"
  timeout 120 $G/mismatch --test-threads=1 2>&1 | grep -E "test result|panicked"
  ;;
pick)
  st "pick: sweep --pick, 8 ranks on one GPU, 4 KiB-256 MiB"
  timeout 560 $G/xtask sweep --pick --backend cuda --ranks 8 -b 4K -e 256M -f 4 -d float \
    --coll allreduce,allgather,reducescatter,broadcast,alltoall -n 20 -w 3 > $O/pick.txt 2>&1
  echo "rc=$?"; rows $O/pick.txt | tail -60
  ;;
ranks)
  shift; for n in ${@:-16 32 64 128}; do
    st "many ranks: $n ranks, every collective 8 B-1 MiB, checked"
    OXCCL_DEADLINE_MS=20000 timeout 80 $G/xtask sweep --backend cuda --ranks $n -b 8 -e 1M -f 128 \
      -d float --coll all -n 2 -w 1 > $O/all$n.txt 2>&1
    echo "rc=$?"; grep -E "Out of bounds|rror" $O/all$n.txt | head -3
    for g in $n 32; do
      st "many ranks: $n ranks, two-shot AllReduce 128 KiB-4 MiB, OXCCL_PUSH_GROUP=$g, checked"
      OXCCL_PUSH_GROUP=$g OXCCL_DEADLINE_MS=20000 timeout 60 $G/xtask sweep --backend cuda --ranks $n \
        -b 128K -e 4M -f 32 -d float --coll allreduce --algo twoshot -n 2 -w 1 > $O/twoshot$n-$g.txt 2>&1
      echo "rc=$?"; grep -E "Out of bounds|rror" $O/twoshot$n-$g.txt | head -3
    done
    st "many ranks: $n ranks, 64 MiB, floor ratios; 8 B AllReduce latency"
    OXCCL_SWEEP_SPREAD=1 OXCCL_DEADLINE_MS=30000 timeout 100 $G/xtask sweep --backend cuda --ranks $n -b 64M -e 64M -n 20 -w 3 -c 0 --baseline \
      --coll allreduce,allgather,reducescatter,broadcast,reduce > $O/big$n.txt 2>&1
    echo "rc=$?"; rows $O/big$n.txt
    timeout 30 $G/xtask sweep --backend cuda --ranks $n --coll allreduce -b 8 -e 8 -n 100 -w 20 \
      > $O/lat$n.txt 2>&1
    echo "rc=$?"; rows $O/lat$n.txt | tail -2
  done
  ;;
smem)
  # An open question of many ranks: does one block per SM (OXCCL_BLOCK_SMEM
  # reserves shared memory no second block fits beside) steady the 64 MiB
  # calls at many ranks? Each count twice without, twice with.
  shift; for n in ${@:-128 64}; do for sm in 0 120000 0 120000; do
    st "many ranks: $n ranks, 64 MiB, OXCCL_BLOCK_SMEM=$sm"
    OXCCL_BLOCK_SMEM=$sm OXCCL_SWEEP_SPREAD=1 OXCCL_DEADLINE_MS=30000 timeout 80 $G/xtask sweep \
      --backend cuda --ranks $n -b 64M -e 64M -n 20 -w 3 -c 0 --coll allreduce,allgather,reducescatter \
      > $O/smem$n-$sm.txt 2>&1
    echo "rc=$?"; rows $O/smem$n-$sm.txt | grep -E "^ +[0-9]|spread|rror"
  done; done
  st "many ranks: 128 ranks with OXCCL_BLOCK_SMEM=120000, every collective 8 B-1 MiB, checked"
  OXCCL_BLOCK_SMEM=120000 OXCCL_DEADLINE_MS=20000 timeout 80 $G/xtask sweep --backend cuda --ranks 128 \
    -b 8 -e 1M -f 128 -d float --coll all -n 2 -w 1 > $O/smemall128.txt 2>&1
  echo "rc=$?"; grep -E "Out of bounds|rror" $O/smemall128.txt | head -3
  ;;
push)
  # At 128 ranks the pushing calls vary between calls, pulled
  # ReduceScatter does not. Outputs per pushing step (OXCCL_PUSH_GROUP:
  # two-shot's default is one step of n, AllGather's 32), and
  # more streams per hardware queue (CUDA_DEVICE_MAX_CONNECTIONS below 32)
  # at 64 ranks, which are steady with 2 streams per queue.
  shift; for n in ${@:-128}; do for g in 32 128 32 128 16; do
    st "many ranks: $n ranks, 64 MiB, OXCCL_PUSH_GROUP=$g"
    ( export OXCCL_PUSH_GROUP=$g
      OXCCL_SWEEP_SPREAD=1 OXCCL_DEADLINE_MS=30000 timeout 80 $G/xtask sweep --backend cuda --ranks $n \
        -b 64M -e 64M -n 20 -w 3 -c 0 --coll $([ $g -ge 64 ] && echo allreduce || echo allreduce,allgather) \
        > $O/push$n-$g.txt 2>&1 )
    echo "rc=$?"; rows $O/push$n-$g.txt | grep -E "^ +[0-9]|spread|rror"
  done; done
  for nq in "64 16" "64 8" "128 16"; do set -- $nq
    st "many ranks: $1 ranks, 64 MiB, CUDA_DEVICE_MAX_CONNECTIONS=$2"
    CUDA_DEVICE_MAX_CONNECTIONS=$2 OXCCL_SWEEP_SPREAD=1 OXCCL_DEADLINE_MS=30000 timeout 80 $G/xtask sweep \
      --backend cuda --ranks $1 -b 64M -e 64M -n 20 -w 3 -c 0 --coll allreduce,allgather,reducescatter \
      > $O/queues$1-$2.txt 2>&1
    echo "rc=$?"; rows $O/queues$1-$2.txt | grep -E "^ +[0-9]|spread|rror"
  done
  ;;
*)
  echo "usage: bash device/acceptance-run.sh suite|pick|ranks|smem|push" >&2
  exit 2
  ;;
esac
st done
