#!/usr/bin/env bash
# speed branch, device call 1: main vs candidate, many variants by env knobs.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/speedcache
M=./tpar-main; C=./tpar-c2
LOG="$OUT/c2.log"; SUM="$OUT/c2-summary.txt"; : >"$LOG"; : >"$SUM"
T0=$SECONDS
# R LABEL ENV... -- BIN ARGS : run, log, summarise (seq: per-call; sweep: bytes time per algo)
R() {
  local label="$1"; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0)) -gt 132 ]; then echo "SKIP $label" >>"$SUM"; return; fi
  echo "=== $label: ${envs[*]} $*" >>"$LOG"
  env "${envs[@]}" timeout 30 "$@" >"$OUT/.s" 2>&1; local rc=$?
  cat "$OUT/.s" >>"$LOG"
  awk -v L="$label" -v rc=$rc '
    /^# algorithm:/ {a=$3; sub(",","",a); r=$0; sub(/.*ranks: /,"",r); sub(/ .*/,"",r)}
    /launch floor \(graph\)/ {n=split($0,f,"collective: "); split(f[2],g," "); printf "%s floor-next-group %s\n", L, g[1]}
    /^ +[0-9]+ +[0-9]+ / && NF>=10 {printf "%s %s w%s %s %s [%s-%s] wrong %s\n", L, a, r, $1, $5, $6, $7, $NF}
    $1=="graph" && /us per call/ {printf "%s seq w%s %s %s\n", L, r, $2, $(NF-3)}
    /ranks.*emulated/ && /^# group/ {}
    END { if (rc != 0) printf "%s RC=%d\n", L, rc }' "$OUT/.s" >>"$SUM"
  case "$label" in *check*) tail -n 4 "$OUT/.s" | sed "s/^/$label: /" >>"$SUM";; esac
}
SEQ=(bench --emulate-ranks 8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16)
SEQ4=(bench --emulate-ranks 4 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16)
date -u +%FT%TZ >>"$SUM"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM"
K4="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull"
R main-seq -- $M bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16
R c2-seq -- $C bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16
R c2-lateprev TPAR_EXP_DEFINES=-DTPAR_EXP_LATE_PREV -- $C bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo $K4
R c2-early TPAR_EXP_DEFINES=-DTPAR_EXP_EARLY_TRIGGER -- $C bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo $K4
R c2-b32 TPAR_BLOCKS=32 -- $C bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo $K4
R c2-b16 TPAR_BLOCKS=16 -- $C "${SEQ[@]}" --algo $K4
R c2-t64b32 TPAR_EXP_THREADS=64 TPAR_BLOCKS=32 -- $C "${SEQ[@]}" --algo $K4
R c2-t96b28 TPAR_EXP_THREADS=96 TPAR_BLOCKS=28 -- $C "${SEQ[@]}" --algo $K4
R c2-bargpu TPAR_EXP_DEFINES=-DTPAR_EXP_BAR_GPU -- $C "${SEQ[@]}" --algo oneshot-pull
R c2-nopdl TPAR_PDL=0 -- $C "${SEQ[@]}" --algo $K4
R main-sweep -- $M bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 2 -n 30 -w 3 -d bfloat16 --algo $K4
R c2-sweep -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 2 -n 30 -w 3 -d bfloat16 --algo $K4
R c2-sweep-early TPAR_EXP_DEFINES=-DTPAR_EXP_EARLY_TRIGGER -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 30 -w 3 -d bfloat16 --algo $K4
R c2-1k-t32 TPAR_EXP_THREADS=32 -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 4K -n 30 -w 3 -d bfloat16 --algo $K4
R c2-4m-t256 TPAR_EXP_THREADS=256 -- $C bench --emulate-ranks 8 --mode graph -b 1M -e 4M -n 30 -w 3 -d bfloat16 --algo twoshot-pull,twoshot-push
R c2-4m-b8 TPAR_BLOCKS=8 -- $C bench --emulate-ranks 8 --mode graph -b 1M -e 4M -n 30 -w 3 -d bfloat16 --algo twoshot-pull,twoshot-push
HS=(bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 20 -w 2 -d bfloat16)
R main-host -- $M "${HS[@]}"
R c2-host -- $C "${HS[@]}"
R c2-host-b2 TPAR_BLOCKS=2 -- $C "${HS[@]}"
R c2-host-b4 TPAR_BLOCKS=4 -- $C "${HS[@]}"
R c2-host-b12 TPAR_BLOCKS=12 -- $C "${HS[@]}"
R c2-host-b21 TPAR_BLOCKS=21 -- $C "${HS[@]}"
R c2-host-sleep TPAR_EXP_DEFINES=-DTPAR_POLL_SLEEP_NS=500 -- $C "${HS[@]}"
R c2-host-early TPAR_EXP_DEFINES=-DTPAR_EXP_EARLY_TRIGGER -- $C "${HS[@]}"
R c2-check -- $C check --emulate-ranks 2,3,8 -e 1M --calls 100 -d all --algo all
R c2-skewgraph -- $C selftest graph --emulate-ranks 8 --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
echo "elapsed $((SECONDS - T0)) s" >>"$SUM"
rm -f "$OUT/.s"; gzip -f "$LOG"
cat "$SUM" | grep -v floor-next | grep -v " w[248] 43008 "
