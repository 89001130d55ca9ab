#!/usr/bin/env bash
# small branch, device call 1 (exploration): where the time of a small 8-rank call goes.
# Ladder of stripped kernels (TPAR_EXP_LADDER 1..4), per-call device timestamps
# (TPAR_EXP_TRACE), PDL on/off, a clear-after-poll candidate, blocks at 1 KiB. Timings only.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/smallcache
C=./tpar
LOG="$OUT/c1.log"; SUM="$OUT/c1-summary.txt"; : >"$LOG"; : >"$SUM"
T0=$SECONDS
R() {
  local label="$1"; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0)) -gt 95 ]; then echo "SKIP $label" >>"$SUM"; return; fi
  echo "=== $label [$((SECONDS - T0))s]: ${envs[*]} $*" >>"$LOG"
  env "${envs[@]}" timeout 30 "$@" >"$OUT/.s" 2>&1; local rc=$?
  cat "$OUT/.s" >>"$LOG"
  awk -v L="$label" -v rc=$rc '
    /^# algorithm:/ {a=$3; sub(",","",a); r=$0; sub(/.*ranks: /,"",r); sub(/ .*/,"",r)}
    /launch floor \(graph\)/ {n=split($0,f,"collective: "); split(f[2],g," "); printf "%s floor-next-group %s\n", L, g[1]}
    /^ +[0-9]+ +[0-9]+ / && NF>=10 {printf "%s %s w%s %s %s [%s-%s]\n", L, a, r, $1, $5, $6, $7}
    $1=="graph" && /us per call/ {printf "%s seq w%s %s %s [%s]\n", L, r, $2, $(NF-3), $4}
    END { if (rc != 0) printf "%s RC=%d\n", L, rc }' "$OUT/.s" >>"$SUM"
}
date -u +%FT%TZ >>"$SUM"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >>"$SUM"
sha256sum $C >>"$SUM"
B=(bench --emulate-ranks 2,4,8 --mode graph -n 30 -w 3 -c 0 -d bfloat16 -b 1K -e 42K -f 42 --sequence 122x42K)
A="oneshot-push,oneshot-pull"
R base -- $C "${B[@]}" --algo $A
R nopdl TPAR_PDL=0 -- $C "${B[@]}" --algo $A
for l in 1 2 3 4; do R ladder$l TPAR_EXP_DEFINES=-DTPAR_EXP_LADDER=$l -- $C "${B[@]}" --algo $A; done
R clearlate TPAR_EXP_DEFINES=-DTPAR_EXP_CLEAR_LATE -- $C "${B[@]}" --algo oneshot-push
mkdir -p "$OUT/traces/full" "$OUT/traces/nopdl" "$OUT/traces/l2" "$OUT/traces/l4"
R trace TPAR_EXP_DEFINES=-DTPAR_EXP_TRACE TPAR_EXP_TRACE="$OUT/traces/full" -- $C "${B[@]}" --algo $A
R trace-l4 "TPAR_EXP_DEFINES=-DTPAR_EXP_TRACE -DTPAR_EXP_LADDER=4" TPAR_EXP_TRACE="$OUT/traces/l4" -- $C "${B[@]}" --algo $A
R trace-l2 "TPAR_EXP_DEFINES=-DTPAR_EXP_TRACE -DTPAR_EXP_LADDER=2" TPAR_EXP_TRACE="$OUT/traces/l2" -- $C "${B[@]}" --algo $A
R trace-nopdl TPAR_PDL=0 TPAR_EXP_DEFINES=-DTPAR_EXP_TRACE TPAR_EXP_TRACE="$OUT/traces/nopdl" -- $C "${B[@]}" --algo $A
R blocks2 TPAR_BLOCKS=2 -- $C bench --emulate-ranks 8 --mode graph -n 30 -w 3 -c 0 -d bfloat16 -b 1K -e 1K --algo $A
R blocks4 TPAR_BLOCKS=4 -- $C bench --emulate-ranks 8 --mode graph -n 30 -w 3 -c 0 -d bfloat16 -b 1K -e 1K --algo $A
R base-again -- $C "${B[@]}" --algo $A
echo "done in $((SECONDS - T0)) s" >>"$SUM"
(cd "$OUT" && tar czf traces.tgz traces && rm -rf traces .s)
gzip -f "$LOG"
cat "$SUM"
