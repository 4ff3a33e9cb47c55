#!/bin/bash
# The copy-engine (ce) check and comparison, on the device machine with
# carry [".gpu"] after device/build-binaries.sh here:
#   bash device/copy-engine-run.sh
# The CUDA test of ce with no kernel (2, 3 and 8 ranks, 1 B - 8 MiB), then
# 256 MiB on 8 ranks: the selector's picks, then ce forced, with the floor
# ratio and the sm-free column (docs/COPY_ENGINE.md).
. "$(dirname "$0")/env.sh"
COLLS=broadcast,allgather,gather,scatter,alltoall
{
  step "ce: every data-movement collective with no kernel, 2/3/8 ranks"
  timeout 240 $G/collectives copy_engine --nocapture --test-threads=1 2>&1 | tail -15
  step "sweep 256 MiB, 8 ranks: the selector's picks"
  timeout 120 $G/xtask sweep --backend cuda --ranks 8 -b 256M -e 256M -d float --coll $COLLS \
    --baseline -n 10 -w 3 --sm-free --json $OUT/ce_pick.json
  step "sweep 256 MiB, 8 ranks: ce forced"
  timeout 120 $G/xtask sweep --backend cuda --ranks 8 -b 256M -e 256M -d float --coll $COLLS \
    --baseline -n 10 -w 3 --sm-free-only --json $OUT/ce_forced.json
  step "sweep 1 MiB - 256 MiB, 8 ranks, ce forced (where the engines start to pay)"
  timeout 120 $G/xtask sweep --backend cuda --ranks 8 -b 1M -e 256M -f 4 -d float --coll allgather,broadcast \
    -n 5 -w 2 --sm-free-only
} 2>&1 | tee $OUT/copy_engine.log
