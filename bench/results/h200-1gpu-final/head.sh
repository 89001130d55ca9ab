#!/usr/bin/env bash
# The merged head (push fix + one block policy) re-checked on one H200: `run` with carry
# [".gpu-final"], `bash bench/results/h200-1gpu-final/head.sh`. .gpu-final/tpar is a release
# build of the commit named in ../h200-1gpu-final.md; tpar-before = 9819435.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
NEW=.gpu-final/tpar; OLD=.gpu-final/tpar-before
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/cache
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
summary=()
step() { local name="$1" limit="$2"; shift 2; echo "=== $name: $*"; local t0=$SECONDS; timeout "$limit" "$@"; local rc=$?
    echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"; summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc" )  $name"); }
{
date -u +%FT%TZ; sha256sum $NEW | cut -c1-16
step check-emulated 200 $NEW check --emulate-ranks 2,4,8 -e 1M --calls 300 -d all --algo all
step check-host 150 $NEW check --emulate-ranks 2,4,8 --transport host -e 1M --calls 200 -d all
step check-skew 150 $NEW check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step graph-skew 150 $NEW selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 5000 --sequence 122x42K -d all
step procs-check 120 $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
step seq-new 120 $NEW bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16
step host-new 120 $NEW bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo oneshot-push,twoshot-push
step host-old 120 $OLD bench-cuda --emulate-ranks 4 --transport host --sequence 122x43008 -n 50 -w 5 -d bfloat16 --algo oneshot-push,twoshot-push
echo "# ---- summary ----"; printf '%s\n' "${summary[@]}"
} 2>&1 | tee "$OUT/head.log" | grep -E "^===|PASS|FAIL|per call|graph  |bfloat16  " 
