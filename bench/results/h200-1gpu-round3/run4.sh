#!/usr/bin/env bash
# Fourth call: the first all-reduce of a fresh process, phase by phase (tpar/examples/first_call.rs),
# with an empty and then a warm kernel cache; beside it the whole `tpar bench` process used
# before. `run` with carry [".gpu-r3"], `bash bench/results/h200-1gpu-round3/run4.sh`.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"; LOG="$OUT/run4.log"; : >"$LOG"
D=.gpu-r3
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
C=$(mktemp -d)
whole() { local t=$(date +%s%N); "$@" >>"$LOG" 2>&1; local rc=$?; echo "  whole process: $(( ($(date +%s%N) - t) / 1000000 )) ms, rc=$rc" >>"$LOG"; }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; sha256sum $D/first_call | cut -c1-16; } >>"$LOG"
echo "# empty cache" >>"$LOG"; XDG_CACHE_HOME=$C/a whole $D/first_call
for i in 1 2 3 4 5; do echo "# warm cache, run $i" >>"$LOG"; XDG_CACHE_HOME=$C/a whole $D/first_call; done
echo "# warm cache, twoshot-pull (another kernel: compiled once, then cached)" >>"$LOG"; XDG_CACHE_HOME=$C/a whole $D/first_call twoshot-pull; XDG_CACHE_HOME=$C/a whole $D/first_call twoshot-pull
for i in 1 2; do echo "# warm cache, the whole tpar bench process (the figure quoted before)" >>"$LOG"; XDG_CACHE_HOME=$C/a whole $D/tpar bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push >/dev/null; done
cat "$LOG"
