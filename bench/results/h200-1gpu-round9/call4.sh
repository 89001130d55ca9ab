#!/usr/bin/env bash
# Round 9, call 4: head 6ea01c9 (64 blocks from 2 MiB, 8 loads in flight): issue 25's run
# (gpu-large.sh final: tpar against vLLM, 2/4/8 emulated ranks, 1 KiB-16 MiB, PDL on and
# off), the zero-copy checks it carries, the 122 x 42 KiB step and the fused timings.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; gunzip -c .gpu/c4/tpar.gz > $D/tpar; chmod +x $D/tpar; cp scripts/gpu-large.sh $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/l" "$OUT/t"
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $D/tpar | cut -c1-16)"
K=oneshot-push,oneshot-pull,twoshot-push,twoshot-pull
timeout 60 $D/tpar bench --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo $K --emulate-ranks 2,4,8 > "$OUT/t/seq.txt" 2>&1; echo "seq rc=$? t=$((SECONDS-T0))"
timeout 60 $D/tpar bench --fused --emulate-ranks 8 -d bfloat16 --algo $K --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --json "$OUT/t/fused-7168.json" > "$OUT/t/fused.txt" 2>&1; echo "fused rc=$? t=$((SECONDS-T0))"
ROOT=$PWD VLLM_SRC=$PWD/.gpu/c4/vllm-src OUT="$OUT/l" BUDGET=$((400 - (SECONDS - T0))) ONLY='vllm-build|zc-graph-42K|zc-graph-nopdl|guard|pdl1|pdl0' timeout 420 bash $D/gpu-large.sh $D final > "$OUT/l/stdout.txt" 2>&1; echo "large rc=$?"
cat "$OUT/l/summary.txt"
grep -A12 "^# tpar against vllm" "$OUT/l/compare.txt" | grep -E "^===|^ +graph" | cut -c1-140
grep -v "^#" "$OUT/t/seq.txt" | grep "per call" | cut -c1-100
grep -E "^ +7168" "$OUT/t/fused.txt" | cut -c1-200
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz l t && rm -rf l t
