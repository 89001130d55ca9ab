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
step sweep-halves 40 -- check --emulate-ranks 2,3,4,8 -e 1M --calls 300 -d all --algo hierarchical
step split-3+5 14 -- check --emulate-ranks 8 --islands 3+5 -e 1M --calls 200 -d all --algo hierarchical
step split-1+3-one 14 -- check --emulate-ranks 4,8 --islands 1+3,8 -e 256K --calls 200 -d all --algo hierarchical
step split-16-3isl 14 -- check --emulate-ranks 16,6 --islands 5+5+6,1+2+3 -e 256K --calls 150 -d all --algo hierarchical
step skew 12 -- check --emulate-ranks 8 --islands 3+5 --calls 1500 --skew-ns 20000 -e 256K -d bfloat16 --algo hierarchical
step graph 25 -- selftest graph --emulate-ranks 8 --replays 10 --sequence 122x42K -d all
step timeout 12 TPAR_TIMEOUT_MS=200 -- selftest timeout --emulate-ranks 8
step mismatch 12 TPAR_TIMEOUT_MS=2000 -- selftest mismatch --emulate-ranks 4
step seq-8 15 -- bench --emulate-ranks 8 --islands 4+4 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo hierarchical,oneshot-push,oneshot-pull,twoshot-push
step procs-2socket 20 -- check --backend cuda --world 8 --plan-topology rtxpro6000-dualsocket-8 --algo hierarchical -e 64K --calls 100 -d bfloat16
gzip -kf "$LOG"
{ echo "# ---- 122 x 42 KiB graph, 8 ranks (4+4) ----"; sed -n '/=== seq-8 (/,/=== seq-8:/p' "$LOG" | grep -vE "^# group" | head -40
  echo "# ---- summary ----"; for s in "${summary[@]}"; do echo "$s"; done; } | tee "$OUT/summary.txt"
