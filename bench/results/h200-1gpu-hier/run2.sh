#!/usr/bin/env bash
# hierarchical kernel: correctness sweep, odd island splits, graph, skew, timeout, mismatch,
# process ranks over a two-socket topology, then timings. One H200, emulated ranks.
set -uo pipefail
B="$(dirname "$0")/tpar"
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"; LOG="$OUT/hier.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME="$(mktemp -d)"
T0=$(date +%s); summary=()
step() {  # step NAME LIMIT [ENV=V ...] -- ARGS...
    local name="$1" limit="$2"; shift 2; local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local el=$(( $(date +%s) - T0 ))
    if [ $((el + limit)) -gt 112 ]; then limit=$((112 - el)); fi
    if [ "$limit" -le 2 ]; then summary+=("SKIP  $name (no time left)"); return; fi
    echo "=== $name (t=${el}s, limit ${limit}s): ${envs[*]} $*" | tee -a "$LOG"
    local t0=$(date +%s%N); env "${envs[@]}" timeout "$limit" "$B" "$@" >>"$LOG" 2>&1; local rc=$?
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    echo "=== $name: rc=$rc in ${ms} ms" | tee -a "$LOG"
    if [ $rc -eq 0 ]; then summary+=("PASS  $name (${ms} ms)"); else summary+=("FAIL  $name rc=$rc (${ms} ms)"); fi
}
{ echo "# date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "# binary: $(sha256sum "$B" | cut -c1-16)"; } | tee -a "$LOG"
step split-16-5+5+6 25 -- check --emulate-ranks 16 --islands 5+5+6 -e 256K --calls 100 -d all --algo hierarchical
step interleaved-6-8 15 -- check --emulate-ranks 6,8 --islands map:012012,map:01010101 -e 256K --calls 100 -d all --algo hierarchical
step host-4 12 -- check --emulate-ranks 4 --transport host -e 256K --calls 100 -d all --algo hierarchical
step skew 20 -- check --emulate-ranks 8 --islands 3+5 --calls 800 --skew-ns 20000 -e 256K -d bfloat16 --algo hierarchical
step skew-graph 20 -- selftest graph --emulate-ranks 8 --islands 3+5 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
step sizes-8 15 -- bench --emulate-ranks 8 --islands 4+4 --mode graph -b 1K -e 1M -f 32 -n 50 -w 5 -d bfloat16 --algo hierarchical,oneshot-push,oneshot-pull,twoshot-push
gzip -kf "$LOG"
{ echo "# ---- graph, 8 ranks (4+4), bf16 ----"; sed -n '/=== sizes-8 (/,/=== sizes-8:/p' "$LOG" | grep -E "^# algorithm|^ +[0-9]|floor"
  echo "# ---- summary ----"; for s in "${summary[@]}"; do echo "$s"; done; } | tee "$OUT/summary.txt"
