#!/usr/bin/env bash
# lean, exploration call (one H200): default vs lean variants, group sizes, blocks at 256K.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/leancache
NEW=./tpar-x1; OLD=./tpar-main
LOG="$OUT/explore.log"; : >"$LOG"
T0=$SECONDS; summary=()
step() {
  local name="$1" limit="$2"; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0)) -gt 150 ]; then summary+=("SKIP  $name (time)"); return; fi
  echo "=== $name: ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc")
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "new $(sha256sum $NEW | cut -c1-16) old $(sha256sum $OLD | cut -c1-16)"; } >>"$LOG"
A3="oneshot-pull,twoshot-push,twoshot-pull"
GR=(bench --emulate-ranks 8 --mode graph -b 64K -e 4M -f 2 -n 30 -w 5 -d bfloat16 --algo "$A3")
step g-old 30 -- $OLD "${GR[@]}"
step g-new-lean0 30 TPAR_LEAN=0 -- $NEW "${GR[@]}"
step g-new-lean1-G2 30 TPAR_LEAN=1 -- $NEW "${GR[@]}"
step g-new-lean1-G4 30 TPAR_LEAN=1 "TPAR_EXPLORE_DEFINES=-DTPAR_PEER_GROUP=4 -DTPAR_GATHER_GROUP=4" -- $NEW "${GR[@]}"
step g-new-lean1-G4U4 30 TPAR_LEAN=1 "TPAR_EXPLORE_DEFINES=-DTPAR_PEER_GROUP=4 -DTPAR_GATHER_GROUP=4 -DTPAR_UNROLL=4" -- $NEW "${GR[@]}"
# 256 KiB: blocks (16 lean: PDL still on; 32: all resident, no PDL)
for L in 0 1; do for B in 8 12 16 24 32; do
  [ $L = 0 ] && [ $B -gt 16 ] && continue
  step b256-L$L-B$B 20 TPAR_LEAN=$L TPAR_BLOCKS=$B -- $NEW bench --emulate-ranks 8 --mode graph -b 256K -e 512K -f 2 -n 30 -w 5 -d bfloat16 --algo "$A3"
done; done
# correctness of the lean variants at every size (forced), both protocols
step check-lean 60 TPAR_LEAN=1 -- $NEW check --emulate-ranks 2,3,8 -e 4M --calls 50 -d all --algo "$A3"
step check-lean-host 30 TPAR_LEAN=1 -- $NEW check --emulate-ranks 2,4 --transport host -e 1M --calls 50 -d all --algo twoshot-push
step seq 30 -- $NEW bench --emulate-ranks 8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo oneshot-push,oneshot-pull
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary.txt"
awk '/^=== [a-z0-9-]+: [^r]/ {s=$2} /^# algorithm:/ {a=$3} /^ +[0-9]+ +[0-9]+ / && NF>=10 {print s, a, $1, $5, "[" $6 "-" $7 "]", "wrong", $NF}' "$LOG" >"$OUT/timings.txt"
gzip -kf "$LOG"
cat "$OUT/summary.txt"; cat "$OUT/timings.txt"
