#!/usr/bin/env bash
# Validation of the all-ones sentinel in the kernels: mixed dtypes with no refill between
# calls (stress), in one IPC workspace, in captured graphs, plus the quick check.
# Writes sentinel-check.log under $OUT (or here), prints each step's status and a summary,
# and exits non-zero if any step failed (a non-zero exit, or a timeout) or the log reports
# a wrong element.
set -uo pipefail
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/tpar-cache
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
LOG="${OUT:-.}/sentinel-check.log"
: > "$LOG"
failed=0
run() {
    echo "=== $*" >> "$LOG"
    timeout 150 ./tpar "$@" >> "$LOG" 2>&1
    local rc=$?
    echo "=== rc=$rc" >> "$LOG"
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "FAIL rc=$rc: tpar $*"
    else
        echo "PASS: tpar $*"
    fi
}
run check --emulate-ranks 8 --calls 10000 -e 256K -d all --algo "$K"
run check --emulate-ranks 2,3,8 --calls 0 -e 1M -d all --algo "$K"
run selftest epoch-wrap --emulate-ranks 4 --epoch-start 4294967290 -e 64K -d all
run selftest graph --emulate-ranks 8 --replays 20 --sequence 122x43008 -d all
run selftest ipc -e 1M -n 5 -w 1 --graph-inner 5 -d all
run check --emulate-ranks 2,8 --transport host --calls 0 -e 1M -d all
TPAR_TIMEOUT_MS=300 run selftest timeout --emulate-ranks 4
run bench --backend cuda --emulate-ranks 8 --mode graph --sequence 122x43008 -b 42K -e 42K -d bfloat16 -n 50 -w 5
grep -E "^=== rc|wrong|PASS|FAIL|timeout test" "$LOG" | cut -c1-220 | tail -60
# A step can exit 0 and still print wrong elements (bench counts them in #wrong): any
# non-zero count of wrong elements fails the script too.
if grep -Eq '(^|[^0-9])[1-9][0-9]* wrong' "$LOG"; then
    echo "FAIL: the log reports wrong elements"
    failed=1
fi
echo "sentinel-check: $([ "$failed" -eq 0 ] && echo PASS || echo FAIL)"
exit "$failed"
