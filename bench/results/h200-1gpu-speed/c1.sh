#!/usr/bin/env bash
# speed branch, device call 1: main vs candidate, many variants by env knobs.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/speedcache
M=./tpar-main; C=./tpar-c1
LOG="$OUT/c1.log"; SUM="$OUT/c1-summary.txt"; : >"$LOG"; : >"$SUM"
T0=$SECONDS
# R LABEL ENV... -- BIN ARGS : run, log, summarise (seq: per-call; sweep: bytes time per algo)
R() {
  local label="$1"; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0)) -gt 128 ]; then echo "SKIP $label" >>"$SUM"; return; fi
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
R main-seq -- $M bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16
R c1-seq -- $C bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16
R c1-nopdl TPAR_PDL=0 -- $C "${SEQ[@]}"
R c1-pollone TPAR_EXP_DEFINES=-DTPAR_EXP_POLL_ONE -- $C bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16
R c1-sleep50 TPAR_EXP_DEFINES=-DTPAR_POLL_SLEEP_NS=50 -- $C "${SEQ[@]}" --algo oneshot-push,twoshot-push
R c1-sleep200 TPAR_EXP_DEFINES=-DTPAR_POLL_SLEEP_NS=200 -- $C "${SEQ[@]}" --algo oneshot-push,twoshot-push
R c1-bargpu TPAR_EXP_DEFINES=-DTPAR_EXP_BAR_GPU -- $C "${SEQ[@]}" --algo oneshot-pull,twoshot-pull
R c1-b3 TPAR_BLOCKS=3 -- $C "${SEQ[@]}"
R c1-b4 TPAR_BLOCKS=4 -- $C "${SEQ[@]}"
R c1-b8 TPAR_BLOCKS=8 -- $C "${SEQ[@]}"
R c1-b12 TPAR_BLOCKS=12 -- $C "${SEQ[@]}"
R c1-t256b12 TPAR_EXP_THREADS=256 TPAR_BLOCKS=12 -- $C "${SEQ[@]}"
R c1-t256b16 TPAR_EXP_THREADS=256 TPAR_BLOCKS=16 -- $C "${SEQ[@]}"
R c1-t128b21 TPAR_EXP_THREADS=128 TPAR_BLOCKS=21 -- $C "${SEQ[@]}"
R c1-t128b32 TPAR_EXP_THREADS=128 TPAR_BLOCKS=32 -- $C "${SEQ[@]}"
R c1-t256b6 TPAR_EXP_THREADS=256 TPAR_BLOCKS=6 -- $C "${SEQ[@]}"
R c1-4-t256b12 TPAR_EXP_THREADS=256 TPAR_BLOCKS=12 -- $C "${SEQ4[@]}"
R c1-4-t128b21 TPAR_EXP_THREADS=128 TPAR_BLOCKS=21 -- $C "${SEQ4[@]}"
R c1-4-b3 TPAR_BLOCKS=3 -- $C "${SEQ4[@]}"
# 1 KiB and 4 MiB at 8 ranks
K4="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull"
R main-sweep -- $M bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 30 -w 3 -d bfloat16 --algo $K4
R c1-sweep -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 30 -w 3 -d bfloat16 --algo $K4
R c1-sweep-pollone TPAR_EXP_DEFINES=-DTPAR_EXP_POLL_ONE -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 16 -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push
R c1-1k-t64 TPAR_EXP_THREADS=64 -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 1K -n 30 -w 3 -d bfloat16 --algo $K4
R c1-1k-t128 TPAR_EXP_THREADS=128 -- $C bench --emulate-ranks 8 --mode graph -b 1K -e 1K -n 30 -w 3 -d bfloat16 --algo $K4
R c1-4m-t256b32 TPAR_EXP_THREADS=256 TPAR_BLOCKS=32 -- $C bench --emulate-ranks 8 --mode graph -b 1M -e 4M -n 30 -w 3 -d bfloat16 --algo twoshot-pull,twoshot-push,oneshot-pull
R c1-4m-t128b32 TPAR_EXP_THREADS=128 TPAR_BLOCKS=32 -- $C bench --emulate-ranks 8 --mode graph -b 1M -e 4M -n 30 -w 3 -d bfloat16 --algo twoshot-pull,twoshot-push
R c1-4m-cu4 TPAR_EXP_DEFINES=-DTPAR_COPY_UNROLL=4 -- $C bench --emulate-ranks 8 --mode graph -b 4M -e 4M -n 30 -w 3 -d bfloat16 --algo twoshot-pull
R c1-4m-cu16 TPAR_EXP_DEFINES=-DTPAR_COPY_UNROLL=16 -- $C bench --emulate-ranks 8 --mode graph -b 4M -e 4M -n 30 -w 3 -d bfloat16 --algo twoshot-pull
# host transport, 4 ranks, 122 x 42 KiB
HS=(bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 20 -w 2 -d bfloat16)
R main-host -- $M "${HS[@]}" --algo $K4
R c1-host -- $C "${HS[@]}" --algo $K4
R c1-host-b2 TPAR_BLOCKS=2 -- $C "${HS[@]}" --algo $K4
R c1-host-b16 TPAR_BLOCKS=16 -- $C "${HS[@]}" --algo oneshot-pull,twoshot-pull,twoshot-push
R c1-host-pollone TPAR_EXP_DEFINES=-DTPAR_EXP_POLL_ONE -- $C "${HS[@]}" --algo twoshot-push,oneshot-push
# smoke correctness of the candidate
R c1-check -- $C check --emulate-ranks 2,8 -e 4M --calls 60 -d all --algo all
echo "elapsed $((SECONDS - T0)) s" >>"$SUM"
rm -f "$OUT/.s"; gzip -f "$LOG"
cat "$SUM"
