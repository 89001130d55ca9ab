#!/usr/bin/env bash
# One `run` call on the GPU machine: what `tpar` sees of the machine (NVML discovery), the
# CUDA backend through `tpar bench --backend cuda` (graph, verify-step sequence, host
# transport), and the CPU backend on that machine's many cores. Builds nothing: BIN is a
# release `tpar` built elsewhere. Writes every output into $OUT/gpu-bench.tgz (the device
# tool returns few files) and $OUT/summary.txt; prints the summary last.
#
#   scripts/gpu-bench.sh [BIN]
set -uo pipefail
BIN="${1:-./tpar}"
FINAL="${OUT:-./gpu-out}"
OUT="$(mktemp -d)/gpu-bench"
mkdir -p "$OUT" "$FINAL"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/tpar-cache}"
summary=()

step() {
    local name="$1" limit="$2"
    shift 2
    local t0 rc
    t0=$(date +%s)
    { echo "\$ tpar $*"; timeout "$limit" "$BIN" "$@"; } >"$OUT/$name.txt" 2>&1
    rc=$?
    summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc" )  $name ($(( $(date +%s) - t0 ))s)")
}

{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
    nproc; grep -m1 'model name' /proc/cpuinfo
    nvidia-smi topo -m
} >"$OUT/machine.txt" 2>&1

step topo 30 topo
step topo-json 30 topo --json
step cuda-graph-8 120 bench --backend cuda --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -d bfloat16 -n 100 -w 10 --json "$OUT/cuda-graph-8.json"
step cuda-sequence 90 bench --backend cuda --emulate-ranks 2,8 --mode graph --sequence 122x43008 -b 42K -e 42K -d bfloat16 -n 50 -w 5
step cuda-host-2 60 bench --backend cuda --emulate-ranks 2 --transport host -b 8 -e 1M -f 8 -d bfloat16 -n 100 -w 10
step cpu-check-8 60 check --backend cpu --world 8 --calls 2000
for n in 2 4 8; do
    step "cpu-bench-$n" 40 bench --backend cpu --world "$n" -b 8 -e 4M -f 4 -d bfloat16 -n 100 -w 10 --json "$OUT/cpu-bench-$n.json"
done
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
cp "$OUT/summary.txt" "$FINAL/"
tar -C "$(dirname "$OUT")" -czf "$FINAL/gpu-bench.tgz" gpu-bench
