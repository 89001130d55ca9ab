#!/usr/bin/env bash
# hostpipe branch, device call 1 (exploration): host transport timings of main and of the
# write-once flag kernels side by side, the knobs (flag polls in flight, blocks, write once
# off), flags forced at 2-3 ranks, hierarchical, then a quick correctness pass and the
# one-buffer guard test (must FAIL). run with carry [".gpu-hostpipe"]: bash .gpu-hostpipe/call1.sh
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/hpcache
NEW=./tpar-new; OLD=./tpar-main; BUDGET=${BUDGET:-110}
LOG="$OUT/call1.log"; : >"$LOG"
T0=$SECONDS; summary=()
step() {
  local name="$1" limit="$2"; shift 2
  local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0 + limit / 3)) -gt $BUDGET ]; then summary+=("SKIP  $name (time)"); return; fi
  echo "=== $name: ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc")
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "new $(sha256sum $NEW | cut -c1-16) old $(sha256sum $OLD | cut -c1-16)"; } >>"$LOG"
HS=(bench --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push)
K=TPAR_TEST_FLAG_DEFINES
step host-old 30 -- $OLD "${HS[@]}" --emulate-ranks 2,3,4,8
step host-new 30 -- $NEW "${HS[@]}" --emulate-ranks 2,3,4,8
step host-new-each4 10 "$K=TPAR_WRITE_ONCE=0" -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-p2g250 10 "$K=TPAR_FLAG_POLLS=2 TPAR_FLAG_POLL_GAP_NS=250" -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-p4g250 10 "$K=TPAR_FLAG_POLLS=4 TPAR_FLAG_POLL_GAP_NS=250" -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-p4g100 10 "$K=TPAR_FLAG_POLLS=4 TPAR_FLAG_POLL_GAP_NS=100" -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-p2g500 10 "$K=TPAR_FLAG_POLLS=2 TPAR_FLAG_POLL_GAP_NS=500" -- $NEW "${HS[@]}" --emulate-ranks 4,8
step host-new-b3 10 TPAR_BLOCKS=3 -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-b4 10 TPAR_BLOCKS=4 -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-b12 10 TPAR_BLOCKS=12 -- $NEW "${HS[@]}" --emulate-ranks 4
step host-new-flags23 15 TPAR_HOST_PROTOCOL=flags -- $NEW "${HS[@]}" --emulate-ranks 2,3
HH=(bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 20 -w 3 -d bfloat16 --algo hierarchical)
step host-old-hier 10 -- $OLD "${HH[@]}"
step host-new-hier 10 -- $NEW "${HH[@]}"
# correctness (quick): flags forced at 2, 3, 4 ranks; graph skew; the knob that measured best
step check-host-flags 30 TPAR_HOST_PROTOCOL=flags -- $NEW check --emulate-ranks 2,3,4 --transport host -e 1M --calls 200 -d all
step graph-skew-host 15 -- $NEW selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
step check-skew-p4 10 "$K=TPAR_FLAG_POLLS=4 TPAR_FLAG_POLL_GAP_NS=250" -- $NEW check --emulate-ranks 4 --transport host --calls 400 --skew-ns 20000 -e 256K -d all
# the guard removed: one buffer under the flag protocol; this step must FAIL
step guard-1buf-must-fail 12 TPAR_TIMEOUT_MS=500 "$K=TPAR_TEST_UNSAFE_ONE_BUFFER=1" -- $NEW selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary1.txt"
awk '/^=== host-/ {s=$2} /^# algorithm:/ {a=$3; r=$0; sub(/.*ranks: /,"",r); sub(/ .*/,"",r)}
     /^ +[0-9]+ +[0-9]+ / && NF>=10 {print s, a, "w" r, $1, $5, "[" $6 "-" $7 "]", "wrong", $NF}
     /^ +graph +[a-z-]+ +[0-9.]+ us/ {print s, $2, "w" r, "seq122", $(NF-3), "us/call"}' "$LOG" >"$OUT/timings1.txt"
gzip -kf "$LOG"
cat "$OUT/summary1.txt" "$OUT/timings1.txt"
