#!/usr/bin/env bash
# hostpipe branch, device call 2 (final binary): host transport timings of main and of the
# branch side by side, then the correctness sweep of the branch (call2 of
# h200-1gpu-hostproto plus the guard tests). run with carry [".gpu-hostpipe"]:
# bash .gpu-hostpipe/call2.sh
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/hpcache
NEW=./tpar-new; OLD=./tpar-main; BUDGET=${BUDGET:-150}
LOG="$OUT/call2.log"; : >"$LOG"
T0=$SECONDS; summary=()
step() {
  local name="$1" limit="$2"; shift 2
  local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0 + limit / 3)) -gt $BUDGET ]; then summary+=("SKIP  $name (time)"); return; fi
  echo "=== $name: ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ "${MUSTFAIL:-0}" = 1 ]; then [ $rc -ne 0 ] && summary+=("PASS  $name (failed as it must, rc=$rc)") || summary+=("FAIL  $name (passed: the race was not caught)"); return; fi
  [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc")
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "new $(sha256sum $NEW | cut -c1-16) old $(sha256sum $OLD | cut -c1-16)"; } >>"$LOG"
HS=(bench --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push)
HH=(bench --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 20 -w 3 -d bfloat16 --algo hierarchical)
step host-old 30 -- $OLD "${HS[@]}" --emulate-ranks 2,3,4,8
step host-new 30 -- $NEW "${HS[@]}" --emulate-ranks 2,3,4,8
step host-new-sentinel3 10 TPAR_HOST_PROTOCOL=sentinel -- $NEW "${HS[@]}" --emulate-ranks 3
step host-old-hier 10 -- $OLD "${HH[@]}" --emulate-ranks 4,8
step host-new-hier 10 -- $NEW "${HH[@]}" --emulate-ranks 4,8
# correctness of the branch (auto: sentinel at 2 ranks, flags from 3)
step check-host 40 -- $NEW check --emulate-ranks 2,3,4 --transport host -e 1M --calls 200 -d all
step check-host-flags2 15 TPAR_HOST_PROTOCOL=flags -- $NEW check --emulate-ranks 2 --transport host -e 1M --calls 200 -d all
step graph-skew-host 25 -- $NEW selftest graph --emulate-ranks 2,4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d all
step graph-skew-host-8 10 -- $NEW selftest graph --emulate-ranks 8 --transport host --replays 5 --skew-ns 20000 --sequence 122x42K -d bfloat16
step graph-skew-host-nopdl 15 TPAR_PDL=0 -- $NEW selftest graph --emulate-ranks 3,4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
# the guards: one buffer under flags and two under the sentinel must be caught; two under flags pass (docs/cuda.md)
MUSTFAIL=1 step guard-flags-1buf 12 TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_ONE_BUFFER=1 -- $NEW selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
MUSTFAIL=1 step guard-sentinel-2buf 12 TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 -- $NEW selftest graph --emulate-ranks 2 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
step flags-2buf-passes 10 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 -- $NEW selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
step timeout-host 15 TPAR_TIMEOUT_MS=200 -- $NEW selftest timeout --emulate-ranks 2,4 --transport host
step mismatch-host4 20 TPAR_TIMEOUT_MS=2000 -- $NEW selftest mismatch --emulate-ranks 4 --transport host
step procs-host 40 -- $NEW check --backend cuda --world 4 --transport host --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-push,twoshot-push
step check-skew-host 25 -- $NEW check --emulate-ranks 3,4 --transport host --calls 400 --skew-ns 20000 -e 256K -d all
step epoch-wrap-host 10 -- $NEW selftest epoch-wrap --emulate-ranks 3,4 --transport host --epoch-start 4294967290 -e 64K -d all
step check-p2p 60 -- $NEW check --emulate-ranks 2,3,8 -e 1M --calls 300 -d all --algo all
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary2.txt"
awk '/^=== host-/ {s=$2} /^# algorithm:/ {a=$3; r=$0; sub(/.*ranks: /,"",r); sub(/ .*/,"",r)}
     /^ +[0-9]+ +[0-9]+ / && NF>=10 {print s, a, "w" r, $1, $5, "[" $6 "-" $7 "]", "wrong", $NF}
     /^ +graph +[a-z-]+ +[0-9.]+ us/ {print s, $2, "w" r, "seq122", $(NF-3), "us/call"}' "$LOG" >"$OUT/timings2.txt"
gzip -kf "$LOG"
cat "$OUT/summary2.txt" "$OUT/timings2.txt"
grep -n "wrong\|rror" "$LOG" | grep -v " 0 wrong\|wrong *0\|#wrong" | head -30
