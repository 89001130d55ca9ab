#!/usr/bin/env bash
# lean, final call (one H200): before/after timings in the same call, then correctness of
# the lean binary. `run` with carry [".gpu-lean"]: bash .gpu-lean/run.sh
#   .gpu-lean/tpar-lean = branch lean, .gpu-lean/tpar-main = main's kernels (before)
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/leancache
NEW=./tpar-lean; OLD=./tpar-main
LOG="$OUT/final.log"; : >"$LOG"
T0=$SECONDS; summary=()
step() {
  local name="$1" limit="$2"; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0 + limit / 4)) -gt 110 ]; then summary+=("SKIP  $name (time)"); return; fi
  echo "=== $name: ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc")
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "new $(sha256sum $NEW | cut -c1-16) old $(sha256sum $OLD | cut -c1-16)"; } >>"$LOG"
GR=(bench --emulate-ranks 8 --mode graph -b 64K -e 4M -f 2 -n 30 -w 5 -d bfloat16 --algo all)
SEQ=(bench --emulate-ranks 8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo oneshot-push,oneshot-pull)
step graph-old 30 -- $OLD "${GR[@]}"
step graph-new 30 -- $NEW "${GR[@]}"
step seq-old 15 -- $OLD "${SEQ[@]}"
step seq-new 15 -- $NEW "${SEQ[@]}"
step check-emulated 45 -- $NEW check --emulate-ranks 2,3,8 -e 4M --calls 200 -d all --algo all
step check-skew 25 -- $NEW check --emulate-ranks 8 --calls 600 --skew-ns 20000 -e 4M -d all --algo oneshot-pull,twoshot-push,twoshot-pull
step procs-check 25 -- $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 4M --calls 100 -d all
step procs-check-lean 25 TPAR_LEAN=1 -- $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 4M --calls 100 -d all
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary.txt"
awk '/^=== [A-Za-z0-9-]+: [^r]/ {s=$2} /^# algorithm:/ {a=$3} /^ +[0-9]+ +[0-9]+ / && NF>=10 {print s, a, $1, $5, "[" $6 "-" $7 "]", "wrong", $NF}' "$LOG" >"$OUT/timings.txt"
gzip -kf "$LOG"
cat "$OUT/summary.txt"; grep -E " (262144|4194304|43008) " "$OUT/timings.txt"
