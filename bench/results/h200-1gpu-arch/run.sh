#!/usr/bin/env bash
# The architecture change (registry, control plane) re-checked on one H200, before and after
# in the same call: `run` with carry [".gpu-arch"], command `bash bench/results/h200-1gpu-arch/run.sh`.
# .gpu-arch/tpar-before is a release build of 9819435 (before), .gpu-arch/tpar-after of the
# commit named in ../h200-1gpu-arch.md. Builds nothing. Logs to $OUT.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
summary=()
step() { # name limit bin args...
    local name="$1" limit="$2" bin="$3"; shift 3
    echo "=== $name: $(basename "$bin") $*"
    local t0=$SECONDS; timeout "$limit" "$bin" "$@"; local rc=$?
    echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"
    summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc" )  $name ($((SECONDS - t0)) s)")
}
{
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in before after; do sha256sum ".gpu-arch/tpar-$b" | cut -c1-16; done
for b in before after; do
    B=".gpu-arch/tpar-$b"; export XDG_CACHE_HOME="/tmp/cache-$b"
    step "$b:emulated-sweep" 150 "$B" bench-cuda --emulate-ranks 2,3,8 --check-only --odd -b 1 -e 1M -f 4 -d all --algo "$K"
    step "$b:timeout" 60 "$B" bench-cuda --emulate-ranks 4 --timeout-test --timeout-ms 300
    step "$b:graph-122" 90 "$B" bench-cuda --emulate-ranks 8 --graph-test 10 --sequence 122x43008 -d bfloat16
    step "$b:ipc-2proc" 90 "$B" bench-cuda --emulate-ranks 2 --ipc-test -e 1M -n 10 -w 2 --graph-inner 5 -d bfloat16
    step "$b:procs-check-4" 150 "$B" check --backend cuda --ranks 4 --plan-topology h200-nvswitch-8 -d all -e 1M --calls 300
    step "$b:procs-mismatch" 60 "$B" check --backend cuda --ranks 4 --plan-topology h200-nvswitch-8 --mismatch-test
    TPAR_TIMEOUT_MS=3000 step "$b:procs-kill" 60 "$B" check --backend cuda --ranks 4 --plan-topology h200-nvswitch-8 --kill-rank 3 -e 42K
done
# Timings last, alternating binaries so drift hits both alike.
for i in 1 2; do for b in before after; do
    export XDG_CACHE_HOME="/tmp/cache-$b"
    step "$b:bench-graph-8.$i" 120 ".gpu-arch/tpar-$b" bench-cuda --emulate-ranks 8 --graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K" --json "$OUT/graph-$b-$i.json"
done; done
echo; echo "# ---- summary ----"; printf '%s\n' "${summary[@]}"
} 2>&1 | tee "$OUT/arch.log"
