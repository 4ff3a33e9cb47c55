# Sourced by every device script: where the carried binaries and the logs
# are, the kernel cache the build compiled (so the device compiles
# nothing), GPU tests that fail rather than skip without a device, NCCL
# baselines without NVLink multicast, and the step headers.
set -o pipefail
G=$PWD/.gpu
OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$OUT"
export OXCCL_CACHE_DIR=/tmp/oxcache; mkdir -p $OXCCL_CACHE_DIR
cp $G/cache/* $OXCCL_CACHE_DIR/ 2>/dev/null
export OXCCL_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
T0=$(date +%s)
# A step's header: `step` with the clock time, `st` with the seconds so far.
step() { echo "=== $1 ($(date +%T))"; }
st() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
