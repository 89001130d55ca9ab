#!/usr/bin/env bash
# Validation of the all-ones sentinel in the kernels: mixed dtypes with no refill between
# calls (stress), in one IPC workspace, in captured graphs, plus the quick check.
set -uo pipefail
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/tpar-cache
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
run() { echo "=== $*"; timeout 150 ./tpar "$@"; echo "=== rc=$?"; }
{
run check --emulate-ranks 8 --calls 10000 -e 256K -d all --algo "$K"
run check --emulate-ranks 2,3,8 --calls 0 -e 1M -d all --algo "$K"
run selftest epoch-wrap --emulate-ranks 4 --epoch-start 4294967290 -e 64K -d all
run selftest graph --emulate-ranks 8 --replays 20 --sequence 122x43008 -d all
run selftest ipc -e 1M -n 5 -w 1 --graph-inner 5 -d all
run check --emulate-ranks 2,8 --transport host --calls 0 -e 1M -d all
TPAR_TIMEOUT_MS=300 run selftest timeout --emulate-ranks 4
run bench --backend cuda --emulate-ranks 8 --mode graph --sequence 122x43008 -b 42K -e 42K -d bfloat16 -n 50 -w 5
} > "${OUT:-.}/sentinel-check.log" 2>&1
grep -E "^=== rc|wrong|PASS|FAIL|timeout test" "${OUT:-.}/sentinel-check.log" | cut -c1-220 | tail -60
