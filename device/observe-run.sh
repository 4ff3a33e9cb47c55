#!/bin/bash
# The observability checks on the GPU machine (docs/OBSERVING.md): Nsight
# Systems sees the NVTX ranges of a sweep, and the 8 B AllReduce time with
# NVTX off, on without a tool, and with the step trace recording every
# call. Build here with device/build-binaries.sh, then on the device
# machine with carry [".gpu"]:  bash device/observe-run.sh
# About 120 s (without nsys, 60 s).
. "$(dirname "$0")/env.sh"
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  st "nsys profile of an 8-rank AllReduce sweep ($NSYS)"
  timeout 200 $NSYS profile -t nvtx,cuda --force-overwrite true -o /tmp/oxnvtx \
    $G/xtask sweep --backend cuda --ranks 8 --coll allreduce -b 8 -e 1M -f 16 -n 20 -w 5 \
    > $O/nsys-sweep.txt 2>&1; echo "rc=$?"; grep -E "^# tools|rror" $O/nsys-sweep.txt | head -3
  # The report's name changed across nsys releases.
  $NSYS stats -r nvtx_sum /tmp/oxnvtx.nsys-rep > $O/nvtx_sum.txt 2>&1 ||
    $NSYS stats -r nvtxsum /tmp/oxnvtx.nsys-rep > $O/nvtx_sum.txt 2>&1
  grep -E "nccl|Range|Time" $O/nvtx_sum.txt | head -20
else
  st "no nsys on this machine: no Nsight Systems check"
fi
st "8 B AllReduce, 8 ranks: NVTX off / on (no tool) / trace of every call, 5 rounds"
sw="sweep --backend cuda --ranks 8 --coll allreduce -b 8 -e 8 -n 2000 -w 200 -c 0"
for i in 1 2 3 4 5; do
  echo "off $(NCCL_NVTX_DISABLE=1 timeout 60 $G/xtask $sw 2>&1 | awk '$1==8{print $6, $10}')"
  echo "on $(timeout 60 $G/xtask $sw 2>&1 | awk '$1==8{print $6, $10}')"
  echo "trace $(timeout 90 $G/xtask $sw --trace /tmp/oxtrace.json --trace-calls 5000 2>&1 | awk '$1==8{print $6, $10}')"
done | tee $O/nvtx-cost.txt
python3 - $O/nvtx-cost.txt <<'PY'
import statistics, sys
d = {}
for l in open(sys.argv[1]):
    w = l.split()
    if len(w) == 3:
        d.setdefault(w[0], []).append((float(w[1]), float(w[2])))
for k, v in d.items():
    print(f"{k}: median of {len(v)}: out of place {statistics.median(a for a, _ in v)} us, "
          f"in place {statistics.median(b for _, b in v)} us")
PY
rm -f /tmp/oxtrace.json*
