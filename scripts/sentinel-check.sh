#!/usr/bin/env bash
# Validation of the all-ones sentinel in the kernels: mixed dtypes with no refill between
# calls (stress), in one IPC workspace, in captured graphs, plus the quick check.
set -uo pipefail
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/tpar-cache
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
run() { echo "=== $*"; timeout 150 ./tpar "$@"; echo "=== rc=$?"; }
{
run bench-cuda --emulate-ranks 8 --stress 10000 -e 256K -d all --algo "$K"
run bench-cuda --emulate-ranks 2,3,8 --check-only --odd -b 1 -e 1M -f 8 -d all --algo "$K"
run bench-cuda --emulate-ranks 4 --check-only --odd --epoch-start 4294967290 -b 1K -e 64K -f 4 -d all --algo "$K"
run bench-cuda --emulate-ranks 8 --graph-test 20 --sequence 122x43008 -d all
run bench-cuda --emulate-ranks 2 --ipc-test -e 1M -n 5 -w 1 --graph-inner 5 -d all
run bench-cuda --emulate-ranks 2,8 --transport host --check-only -b 1 -e 1M -f 16 -d all --algo "$K"
run bench-cuda --emulate-ranks 4 --timeout-test --timeout-ms 300
run bench --backend cuda --emulate-ranks 8 --sequence 122x43008 -d bfloat16 -n 50 -w 5
} > "${OUT:-.}/sentinel-check.log" 2>&1
grep -E "^=== rc|stress:|wrong|PASS|FAIL|timeout test" "${OUT:-.}/sentinel-check.log" | cut -c1-220 | tail -60
