#!/usr/bin/env bash
# Round 5, call 4: thread blocks per rank (TPAR_BLOCKS) at 42 KiB in the 122-call graph, 4 and
# 8 emulated ranks, the one-shot kernels: is there a setting that meets issue 11's 2.5 / 3.0 us?
# `run` with carry [".gpu"]: OUT=$OUT bash bench/results/h200-1gpu-round5/blocks.sh
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"; LOG="$OUT/blocks.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" XDG_CACHE_HOME=/tmp/r5cache
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; sha256sum .gpu/tpar | cut -c1-16; } >>"$LOG"
for pdl in 1 0; do
  for b in auto 4 8 12 16 21 28 32; do
    echo "=== pdl=$pdl blocks=$b" >>"$LOG"
    TPAR_PDL=$pdl TPAR_BLOCKS=$b timeout 60 .gpu/tpar bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo oneshot-push,oneshot-pull,staged-push >>"$LOG" 2>&1
    echo "=== rc=$?" >>"$LOG"
  done
done
# one line per (pdl, blocks, ranks, algorithm): us per call
awk '/^=== pdl=/ {split($2,p,"="); split($3,b,"="); pdl=p[2]; bl=b[2]} /^# group:/ {r=$3} $1=="graph" && / us per call$/ {printf "pdl=%s blocks=%-4s ranks=%s %-13s %s %s\n", pdl, bl, r, $2, $(NF-3), $5}' "$LOG" >"$OUT/blocks.txt"
gzip -f "$LOG"
cat "$OUT/blocks.txt"
