#!/usr/bin/env bash
# Fifth call (06:22 UTC; the log has no date line): does CUDA_DEVICE_MAX_CONNECTIONS=32 (what the tpar command set for 16 emulated
# ranks) slow CUDA's start? first_call and the tpar bench process with 8 and 32 queues.
# `run` with carry [".gpu-r3"], `bash bench/results/h200-1gpu-round3/run5.sh`.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"; LOG="$OUT/run5.log"; : >"$LOG"
D=.gpu-r3
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=$(mktemp -d)
whole() { local t=$(date +%s%N); "$@" 2>&1 | grep -E "first call|ready in" >>"$LOG"; echo "  whole process: $(( ($(date +%s%N) - t) / 1000000 )) ms" >>"$LOG"; }
B=(bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push)
$D/first_call >/dev/null 2>&1; $D/tpar "${B[@]}" >/dev/null 2>&1   # fill the kernel cache
for q in 8 32 8 32; do
  echo "# CUDA_DEVICE_MAX_CONNECTIONS=$q" >>"$LOG"
  CUDA_DEVICE_MAX_CONNECTIONS=$q whole $D/first_call
  CUDA_DEVICE_MAX_CONNECTIONS=$q whole $D/tpar "${B[@]}"
done
cat "$LOG"
