#!/bin/bash
# The network transport over loopback, on the GPU machine's host. Build
# here with device/build-binaries.sh, then on the device machine with
# carry [".gpu"], from the repository root:  bash device/net-recheck.sh
# About 150 s (each step has its own timeout; at most 400 s in all).
# 1. 2 host-backend processes over TCP (lo), 64 MiB AllReduce with
#    --baseline, 5 runs with the default sockets (since the net branch:
#    from the cores, 4 threads x 2 sockets expected on 16 cores) and 3 with
#    the old default, 1 thread x 2 sockets, set: per run the stream
#    ceiling, each of two streams at once (two-way), busbw and floor out of
#    place / in place; then the layout the ranks agreed and the medians.
# 2. 8 CUDA processes forced onto TCP (staged), every collective 8 B-4 MiB.
. "$(dirname "$0")/env.sh"
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo OXCCL_DEADLINE_MS=30000
echo "binaries of $(cat $G/COMMIT 2>/dev/null || echo "an unknown commit (no .gpu/COMMIT)")"
sum() { grep -E "^# oxccl sweep|Out of bounds|rror" "$1" | cut -c1-160 | head -6; }
# One line per run: ceiling, two-way, busbw oop/ip, floor oop/ip, wrong.
row() {
  awk '/network ceiling/ {c=$4} /two streams at once/ {d=$6}
       /^ +67108864/ {printf "ceiling %s GB/s two-way %s GB/s busbw %s / %s GB/s floor %s / %s wrong %s/%s\n", c, d, $8, $13, $10, $15, $9, $14}' "$1"
}
med() { sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "-"}'; }
loop="sweep --procs 2 --backend host -b 64M -e 64M --coll allreduce -n 5 -w 2 --baseline"
st "network: 2 host processes over TCP (lo), 64 MiB AllReduce, --baseline"
for cfg in default 1x2; do
  env=""; runs="1 2 3 4 5"
  [ $cfg = 1x2 ] && env="NCCL_SOCKET_NTHREADS=1 NCCL_NSOCKS_PERTHREAD=2" runs="1 2 3"
  for i in $runs; do
    env $env NCCL_DEBUG=INFO timeout 40 $G/xtask $loop > $O/loop-$cfg-$i.txt 2>&1; rc=$?
    echo "$cfg run $i rc=$rc: $(row $O/loop-$cfg-$i.txt)"
    [ $rc = 0 ] || sum $O/loop-$cfg-$i.txt
  done
  # The channels connected (4 by default since 7cb56f3) with the sockets
  # the ranks agreed, and the selector's choice (expected: algo ring,
  # channels 4).
  grep -ohE "over NET/Socket/0 \([^)]*\)" $O/loop-$cfg-*.txt | sort | uniq -c
  grep -ohE "Using [0-9]+ threads and [0-9]+ sockets per thread|its default [0-9]+ x [0-9]+ for [0-9]+ cores shared by [0-9]+ ranks" $O/loop-$cfg-*.txt | sort | uniq -c
  grep -ohE "algo [a-z]+ proto [a-z]+ channels [0-9]+" $O/loop-$cfg-*.txt | sort | uniq -c
  for col in 10 15; do
    m=$(cat $O/loop-$cfg-*.txt | awk -v c=$col '/^ +67108864/ {sub("%","",$c); print $c}' | med)
    [ $col = 10 ] && echo -n "$cfg median floor: out of place $m%" || echo " in place $m%"
  done
done
st "network: 8 CUDA processes over TCP (lo), every collective 8 B-4 MiB"
timeout 70 $G/xtask sweep --backend cuda -b 8 -e 4M -f 16 -n 5 -w 2 --procs 8 > $O/net8.txt 2>&1; echo "rc=$?"; sum $O/net8.txt
grep -E "^# Collective|^ +(8|524288|4194304) " $O/net8.txt | cut -c1-120
st done
