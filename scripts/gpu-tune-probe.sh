#!/usr/bin/env bash
# `tpar tune` with the link probe, on the one-H200 machine, in under a minute.
#
#   scripts/gpu-tune-probe.sh BIN
#
# BIN is a release `tpar` built elsewhere (e.g. .gpu-final/tpar). Builds nothing. On one GPU
# tune runs emulated ranks (a test of tune itself: they measure no fabric, so the profile gets
# no buckets) and its link probe measures the GPU against its own memory and host memory.
# Writes to $OUT (or ./gpu-out/): tune.log, profile.toml (with its [probe]), topology.json (the
# discovered topology with the probe), and prints a summary last. Exit status nonzero if any
# step failed.
set -uo pipefail
BIN="${1:-./tpar}"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/tune.log"
: >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/tpar-cache}"
summary=()
failed=0

step() {
    local name="$1" limit="$2"
    shift 2
    echo "=== $name: $BIN $*" | tee -a "$LOG"
    local t0 t1 rc secs
    t0=$(date +%s%N)
    timeout "$limit" "$BIN" "$@" >>"$LOG" 2>&1
    rc=$?
    t1=$(date +%s%N)
    secs="$(( (t1 - t0) / 1000000 ))e-3"
    echo "=== $name: rc=$rc in ${secs}s" | tee -a "$LOG"
    if [ "$rc" -eq 0 ]; then summary+=("PASS  $name (${secs}s)"); else summary+=("FAIL  $name rc=$rc (${secs}s)"); failed=1; fi
}

check() {
    local name="$1"
    shift
    if "$@" >>"$LOG" 2>&1; then summary+=("PASS  $name"); else summary+=("FAIL  $name"); failed=1; fi
}

{
    echo "# date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
    echo "# binary: $(sha256sum "$BIN" | cut -c1-16)"
} 2>&1 | tee -a "$LOG"

# Probe (a fraction of a second on one GPU) + bit-exact screen + timings of every candidate,
# 2 emulated ranks, bf16, 1-64 KiB, CUDA graphs.
step tune-probe 90 tune --emulate-ranks 2 -b 1K -e 64K -f 4 -n 5 -w 2 --graph-inner 5 -d bfloat16 \
    -o "$OUT/profile.toml" --topology-out "$OUT/topology.json"
# The same with --no-probe: no [probe] in that profile.
step tune-no-probe 60 tune --emulate-ranks 2 -b 1K -e 4K -f 4 -n 3 -w 1 --graph-inner 2 -d bfloat16 \
    -o "$OUT/profile-noprobe.toml" --no-probe
check "profile carries the probe" grep -q "sm_store_gbps" "$OUT/profile.toml"
check "no-probe profile carries none" bash -c "test -s '$OUT/profile-noprobe.toml' && ! grep -q sm_store_gbps '$OUT/profile-noprobe.toml'"
# The written topology loads (validated) and prints its probe table.
step topology-loads 20 topo --topology "$OUT/topology.json"

{
    echo
    echo "# ---- summary (tune + link probe, one GPU) ----"
    grep -E "^# link probe|GPU0 -> |^# tpar tune|^# no buckets|rejected|bit-exact" "$LOG" | sort -u | head -20
    for s in "${summary[@]}"; do echo "$s"; done
    [ "$failed" -eq 0 ] && echo "ALL PASS" || echo "SOME FAILED"
} 2>&1 | tee -a "$LOG"
exit "$failed"
