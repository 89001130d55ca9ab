#!/usr/bin/env bash
# Where `tpar check --emulate-ranks 8` spends its time per random call, at -e 64K and -e 256K,
# for one `run` call on the one-H200 machine (about 3 minutes if a call costs what the host
# side alone costs; each step is bounded so the whole stays under 9 minutes).
#
#   OUT=$OUT bash scripts/gpu-check-cost.sh [BIN]
#
# BIN: a release `tpar` built here and carried (default ./tpar). Each step prints, every 1000
# random calls and at its end, "host time per checked call (N calls): inputs, upload +
# poison, all-reduce + sync, download, judge" (harness/gpu.rs). Writes check-cost.log and
# a table check-cost.md under $OUT; exits non-zero if a step failed (a wrong element, an
# error) or ran out of its time, and says which.
set -uo pipefail
BIN="${1:-./tpar}"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/check-cost.log"
MD="$OUT/check-cost.md"
: >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/tpar-cache}"
failed=0
{
    echo "# tpar check --emulate-ranks 8: time per random call by phase"
    echo
    echo "| -e | calls | wall s | ms per call (wall, sweep included) | host phases per checked call (sweep and random) | verdict |"
    echo "|---|---|---|---|---|---|"
} >"$MD"
step() {
    local e="$1" calls="$2" limit="$3"
    local args=(check --backend cuda --emulate-ranks 8 -e "$e" --calls "$calls" -d all)
    echo "=== $BIN ${args[*]}" | tee -a "$LOG"
    local t0 t1 rc
    t0=$(date +%s%N)
    timeout "$limit" "$BIN" "${args[@]}" >"$OUT/step.out" 2>&1
    rc=$?
    t1=$(date +%s%N)
    cat "$OUT/step.out" >>"$LOG"
    local ms=$(((t1 - t0) / 1000000))
    local phases verdict
    phases=$(grep -o 'host time per checked call.*' "$OUT/step.out" | tail -1)
    verdict=$(grep -E '^(PASS|FAIL)' "$OUT/step.out" | tail -1 | cut -c1-60)
    [ -n "$verdict" ] || verdict="none (rc=$rc)"
    echo "=== rc=$rc in ${ms} ms" | tee -a "$LOG"
    echo "| $e | $calls | $((ms / 1000)) | $(awk -v m="$ms" -v c="$calls" 'BEGIN { printf "%.2f", m / c }') | ${phases:-not printed} | $verdict |" >>"$MD"
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "FAIL: -e $e: rc=$rc$([ "$rc" -eq 124 ] && echo ' (ran out of its time)')"
    fi
}
step 64K 3000 120
step 256K 3000 240
step 256K 20000 150
rm -f "$OUT/step.out"
cat "$MD"
exit "$failed"
