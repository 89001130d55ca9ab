#!/usr/bin/env bash
# Sixth call: the final binary — 16 emulated ranks with the queues the command now sets (16),
# and the start of an 8-rank run with CUDA's default. `run` with carry [".gpu-r3"],
# `bash bench/results/h200-1gpu-round3/run6.sh`.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"; LOG="$OUT/run6.log"; : >"$LOG"
D=.gpu-r3; B=$D/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=$(mktemp -d)
unset CUDA_DEVICE_MAX_CONNECTIONS
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tpar $(sha256sum $B | cut -c1-16)"; } >>"$LOG"
whole() { local t=$(date +%s%N); "$@" >>"$LOG" 2>&1; local rc=$?; echo "=== rc=$rc, whole process $(( ($(date +%s%N) - t) / 1000000 )) ms: $*" >>"$LOG"; }
whole env TPAR_TIMEOUT_MS=3000 $B check --emulate-ranks 2,16 -e 256K --calls 100 -d all --algo all
for i in 1 2 3; do whole $B bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push; done
grep -E "^=== |^PASS|ready in" "$LOG"
