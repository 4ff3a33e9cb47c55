#!/bin/bash
# Re-checks, on the H200, callers' memory, rank processes, PyTorch and the
# network transport (what was once seen only on an older build): build here with device/build-binaries.sh, then on
# the device machine with carry [".gpu"]:  bash device/recheck-run.sh
# About 450 s. MPS is started for its own steps and quit after (watchdog).
. "$(dirname "$0")/env.sh"
sum() { grep -E "^# oxccl sweep|Out of bounds|rror" "$1" | cut -c1-160 | head -6; }
sw="sweep --backend cuda -b 8 -e 1M -f 32 -d float --coll all -n 2 -w 1"
st "external memory (36 calls x 3 kinds + ring) and graph capture, 2, 3, 4, 8 ranks"
OXCCL_GPU_RANKS=2,3,4,8 timeout 150 $G/external --test-threads=1 --nocapture 2>&1 | grep -E "external|graph of|test result|panicked" | cut -c1-200
st "racecheck on external memory, 2 ranks"
OXCCL_GPU_RANKS=2 timeout 90 compute-sanitizer --tool racecheck $G/external cuda_every --test-threads=1 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test result|hazard" | head
st "processes and torch without MPS: sweep and torch at 2, 4, 8 processes (staged path)"
for n in 2 4 8; do
  OXCCL_DEADLINE_MS=20000 timeout 50 $G/xtask $sw --procs $n > $O/nomps$n.txt 2>&1; echo "sweep procs=$n rc=$?"; sum $O/nomps$n.txt
  LD_PRELOAD=$G/libnccl.so.2 timeout 100 python3 $G/check_torch.py --procs $n --timeout 90 2>&1 | grep -E "torch-check|FAIL" | cut -c1-300
done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/re-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/re-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
( sleep 300; echo quit | nvidia-cuda-mps-control ) >/dev/null 2>&1 & WD=$!
st "processes and torch with MPS: sweep and torch at 2, 4, 8 processes; 256 MiB 8 procs vs threads; kill test"
for n in 2 4 8; do
  OXCCL_DEADLINE_MS=20000 timeout 40 $G/xtask $sw --procs $n > $O/mps$n.txt 2>&1; echo "sweep procs=$n rc=$?"; sum $O/mps$n.txt
  b=""; [ $n = 8 ] && b=--bench
  LD_PRELOAD=$G/libnccl.so.2 timeout 100 python3 $G/check_torch.py --procs $n --timeout 90 $b 2>&1 | grep -E "torch-check|FAIL" | cut -c1-400
done
big="sweep --backend cuda -b 256M -e 256M -c 0 -n 10 -w 3"
timeout 80 $G/xtask $big --procs 8 > $O/F-procs.txt 2>&1; echo "256M procs rc=$?"
timeout 40 $G/xtask $big --ranks 8 > $O/F-threads.txt 2>&1; echo "256M threads rc=$?"
grep -hE "^ +[0-9]" $O/F-procs.txt $O/F-threads.txt | cut -c1-120
timeout 30 $G/xtask sweep --backend cuda --coll allreduce -b 8 -e 8 -n 200 -w 20 --procs 8 2>&1 | grep -E "^ +[0-9]"
timeout 60 $G/multiprocess --exact a_killed_cuda_process_fails_the_others_naming_it 2>&1 | grep -E "test result|panicked"
timeout 60 $G/multiprocess --exact every_collective_across_processes_on_cuda 2>&1 | grep -E "test result|panicked"
echo quit | nvidia-cuda-mps-control; kill $WD 2>/dev/null
st "network: 8 CUDA processes over TCP (lo), every collective 8 B-4 MiB"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo OXCCL_DEADLINE_MS=30000 timeout 60 $G/xtask sweep --backend cuda -b 8 -e 4M -f 16 -n 5 -w 2 --procs 8 > $O/net.txt 2>&1; echo "rc=$?"; sum $O/net.txt
st done
