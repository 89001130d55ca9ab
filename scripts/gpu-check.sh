#!/usr/bin/env bash
# The CUDA backend's GPU check, for one `run` call on the one-H200 machine (emulated ranks).
#
#   scripts/gpu-check.sh [BIN] [quick|full|ipc|blocks32]
#
# Correctness runs are `tpar check --emulate-ranks`, timings `tpar bench --emulate-ranks`, and
# the fault and plumbing tests `tpar selftest NAME` (`tpar selftest --help` lists them).
#
# BIN is a release `tpar` built elsewhere (default ./tpar). Builds nothing. Writes the whole
# log to $OUT/check.log (or ./gpu-out/), JSON records beside it, and prints a short summary
# last. Exit status is nonzero if any step failed.
set -uo pipefail
BIN="${1:-./tpar}"
MODE="${2:-full}"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/check.log"
: >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/tpar-cache}"
summary=()
failed=0

step() {
    local name="$1" limit="$2"
    shift 2
    echo "=== $name: $BIN $*" | tee -a "$LOG"
    local t0 t1 rc
    t0=$(date +%s%N)
    timeout "$limit" "$BIN" "$@" >>"$LOG" 2>&1
    rc=$?
    t1=$(date +%s%N)
    local secs
    secs="$(( (t1 - t0) / 1000000 ))e-3"
    echo "=== $name: rc=$rc in ${secs}s" | tee -a "$LOG"
    if [ "$rc" -eq 0 ]; then summary+=("PASS  $name (${secs}s)"); else summary+=("FAIL  $name rc=$rc (${secs}s)"); failed=1; fi
}

{
    echo "# date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
    echo "# nvrtc: $(ls /usr/local/cuda/lib64/libnvrtc.so* 2>&1 | tr '\n' ' ')"
    echo "# nccl: $(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libnccl.so[^ ]*' | tr '\n' ' ')"
    echo "# binary: $(sha256sum "$BIN" | cut -c1-16)"
} 2>&1 | tee -a "$LOG"

K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
if [ "$MODE" = ipc ]; then
    step ipc-test 120 selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d bfloat16
    step ipc-test-f32 120 selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d float
elif [ "$MODE" = blocks32 ]; then
    # Up to 32 blocks per call (the plan's NVLink cap since the 4-H200 blocks sweep).
    TPAR_BLOCKS=32 step sweep-32 240 check --emulate-ranks 2,4 -e 4M --calls 0 -d all --algo "$K"
    TPAR_BLOCKS=32 step stress-32 180 check --emulate-ranks 4 --calls 5000 -e 1M -d all --algo "$K"
    TPAR_BLOCKS=32 step graph-test-32 120 selftest graph --emulate-ranks 4 --replays 20 --sequence 122x43008 -d bfloat16
    step ipc-test 120 selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d bfloat16
elif [ "$MODE" = quick ]; then
    step smoke-check 90 check --emulate-ranks 2,3,8 -e 1M --calls 200 -d all --algo "$K"
    TPAR_TIMEOUT_MS=300 step timeout-test 40 selftest timeout --emulate-ranks 4
    step graph-test 60 selftest graph --emulate-ranks 8 --replays 10 --sequence 122x43008 -d bfloat16
    step bench-graph 60 bench --emulate-ranks 8 --mode graph -b 1K -e 1M -f 4 -n 50 -w 5 -d bfloat16
    step nccl-1rank 40 selftest nccl-local -e 64K -n 20 -w 3 -d bfloat16
else
    step sweep 300 check --emulate-ranks 2,3,4,8 -e 8M --calls 0 -d all --algo "$K"
    step stress-1e4 240 check --emulate-ranks 8 --calls 10000 -e 256K -d all --algo "$K"
    TPAR_TIMEOUT_MS=200 step timeout-test 120 selftest timeout --emulate-ranks 2,8
    step graph-test 180 selftest graph --emulate-ranks 8 --replays 100 --sequence 122x43008 -d all
    step epoch-wrap 120 selftest epoch-wrap --emulate-ranks 4 --epoch-start 4294967290 -e 64K -d all
    step host-check 180 check --emulate-ranks 2,8 --transport host -e 1M --calls 200 -d all
    step host-bench 180 bench --emulate-ranks 2,8 --transport host --mode graph -b 1K -e 1M -f 4 -n 50 -w 5 -d bfloat16 --json "$OUT/host-graph.json"
    step bench-graph 300 bench --emulate-ranks 8 --mode graph -b 1K -e 8M -f 2 -n 200 -w 20 -d bfloat16 --json "$OUT/bench-graph.json"
    step bench-eager 180 bench --emulate-ranks 8 --mode eager -b 1K -e 1M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K" --json "$OUT/bench-eager.json"
    step sequence 240 bench --emulate-ranks 2,4,8 --mode graph --sequence 122x43008 -b 42K -e 42K -n 100 -w 10 -d bfloat16 --json "$OUT/sequence.json"
    step ipc-test 120 selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d bfloat16
fi

{
    echo
    echo "# ---- summary ($MODE) ----"
    for s in "${summary[@]}"; do echo "$s"; done
} | tee "$OUT/summary.txt" | tee -a "$LOG"
exit "$failed"
