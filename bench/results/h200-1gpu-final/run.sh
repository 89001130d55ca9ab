#!/usr/bin/env bash
# Everything merged this round, on one H200, in one `run` call (carry [".gpu-final"]):
#   bash bench/results/h200-1gpu-final/run.sh
# .gpu-final/tpar        release build of the commit named in ../h200-1gpu-final.md (subcommand CLI)
# .gpu-final/tpar-before release build of 9819435 (bench-cuda CLI), timed in the same call
# .gpu-final/*.whl       the abi3 wheel of the same commit; gpu_python_check.py, tp_decode.py
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-final; NEW=$D/tpar; OLD=$D/tpar-before
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/cache-warm
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
summary=()
step() { # name limit cmd...   (env assignments go before `step`)
    local name="$1" limit="$2"; shift 2
    echo "=== $name: $*"; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?
    echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"
    summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc" )  $name ($((SECONDS - t0)) s)")
}
{
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
sha256sum $NEW $OLD | cut -c1-16
# First call on an empty cache (a whole process: 8 emulated ranks, one checked 42 KiB call), then warm.
for c in cold warm; do
    t0=$(date +%s%N); XDG_CACHE_HOME=/tmp/cache-first $NEW bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push >/dev/null 2>&1
    echo "# first call, $c cache: rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms (process start to exit)"
done
step topo-probe 60 $NEW topo --probe
# Correctness through the new CLI.
step check-emulated 240 $NEW check --emulate-ranks 2,3,8 -e 1M --calls 300 -d all --algo all
step check-host 120 $NEW check --emulate-ranks 2,4 --transport host -e 256K --calls 100 -d all
step check-skew 180 $NEW check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step graph-skew 180 $NEW selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 5000 --sequence 122x42K -d all
TPAR_TIMEOUT_MS=300 step timeout 60 $NEW selftest timeout --emulate-ranks 4
TPAR_TIMEOUT_MS=2000 step mismatch-emulated 90 $NEW selftest mismatch --emulate-ranks 2,8
step ipc 90 $NEW selftest ipc -e 1M -n 10 -w 2 --graph-inner 5 -d bfloat16
step procs-check 150 $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 300 -d all
step procs-mismatch 60 $NEW selftest mismatch --world 4 --plan-topology h200-nvswitch-8
TPAR_TIMEOUT_MS=3000 step procs-kill 60 $NEW selftest kill-rank --world 4 --rank 3 --plan-topology h200-nvswitch-8 -e 42K
# Timings, new then old, same call: the 122 x 42 KiB step and 8 ranks 1 KiB-4 MiB, graphs.
step seq-new 180 $NEW bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --json "$OUT/seq-new.json"
step seq-old 180 $OLD bench-cuda --emulate-ranks 2,4,8 --sequence 122x43008 -n 50 -w 5 -d bfloat16 --json "$OUT/seq-old.json"
step graph-new 180 $NEW bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K" --json "$OUT/graph-new.json"
step graph-old 180 $OLD bench-cuda --emulate-ranks 8 --graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K" --json "$OUT/graph-old.json"
# Python: the wheel of the same commit.
cp $NEW $D/tpar 2>/dev/null
OUT="$OUT" step python 300 bash scripts/gpu-python.sh $D
echo; echo "# ---- summary ----"; printf '%s\n' "${summary[@]}"
} 2>&1 | tee "$OUT/final.log" | grep -vE "^ +[0-9]+ +[0-9]+ +(float|half|bfloat16) |^\[rank" 
