#!/usr/bin/env bash
# Round 5, call 5: the flag variants of one-shot push and staged push rewritten around a
# shared prologue and final reduce (frame.cuh: block_share / reduce_share; their PTX changed,
# every other variant's did not). Every correctness step (scripts/gpu-kernels.sh verify),
# then the host transport timed, new and before alternating twice in the same call.
# `run` with carry [".gpu"] (.gpu/tpar = new, .gpu/tpar-before = 5c204c2):
#   OUT=$OUT bash bench/results/h200-1gpu-round5/flagshare.sh            (call 5)
#   SKIP_VERIFY=1 OUT=$OUT bash bench/results/h200-1gpu-round5/flagshare.sh  (call 6: timings only)
# Call 5 asked for staged-push over host too, which emulated host groups do not run (the
# registry: staged push runs over p2p only, so its flag variant is compiled, never run): its
# timing step failed at once; call 6 timed one-shot and two-shot push only.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT/v"
if [ -z "${SKIP_VERIFY:-}" ]; then
  OUT="$OUT/v" bash scripts/gpu-kernels.sh .gpu verify >/dev/null 2>&1; echo "verify rc=$?" >"$OUT/flagshare.txt"
  cat "$OUT/v/summary.txt" >>"$OUT/flagshare.txt"
else
  : >"$OUT/flagshare.txt"
fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" XDG_CACHE_HOME=/tmp/r5fs
LOG="$OUT/flagshare-timings.log"; : >"$LOG"
for round in 1 2; do
  for who in tpar tpar-before; do
    echo "=== round $round $who" >>"$LOG"
    timeout 60 .gpu/$who bench --transport host --emulate-ranks 3,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push >>"$LOG" 2>&1
    echo "=== rc=$?" >>"$LOG"
  done
done
awk '/^=== round/ {r=$3; w=$4} /^# group:/ {n=$3} $1=="graph" && / us per call$/ {printf "round %s %-12s ranks=%s %-13s %s %s\n", r, w, n, $2, $(NF-3), $5}' "$LOG" >>"$OUT/flagshare.txt"
gzip -f "$LOG"
cat "$OUT/flagshare.txt"
