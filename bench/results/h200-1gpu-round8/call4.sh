#!/usr/bin/env bash
# Round 8, call 4 (one H200), the head with the host-record read rate-limited (frame.cuh):
# timings first (fused 7168 x 1/3/8; sizes 1K-4M at 8 ranks; the 122 x 42K step at 2/4/8),
# then the skewed graphs, the dead-rank checks (rank processes) and the engines' kill stage.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; gunzip -c .gpu/c4/tpar.gz > $D/tpar; chmod +x $D/tpar; cp .gpu/c4/*.whl scripts/gpu_python_check.py $D/
B=$D/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/t" "$OUT/eng" "$OUT/kernp"
echo "## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) tpar $(sha256sum $B | cut -c1-16)"
K=oneshot-push,oneshot-pull,twoshot-push,twoshot-pull
timeout 60 $B bench --fused --emulate-ranks 8 -d bfloat16 --algo $K --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --json "$OUT/t/fused-7168.json" > "$OUT/t/fused.txt" 2>&1; echo "fused rc=$?"
timeout 60 $B bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 40 -w 5 -d bfloat16 --algo $K > "$OUT/t/sizes-8.txt" 2>&1; echo "sizes rc=$?"
timeout 60 $B bench --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo $K --emulate-ranks 2,4,8 > "$OUT/t/seq.txt" 2>&1; echo "seq rc=$?"
timeout 120 $B selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all > "$OUT/t/graph-skew.txt" 2>&1; echo "graph-skew rc=$? ($(grep -c ' 0 wrong' "$OUT/t/graph-skew.txt") runs with 0 wrong, $(grep -c 'wrong' "$OUT/t/graph-skew.txt") in all)"
OUT="$OUT/kernp" BUDGET=100 ONLY="^(procs-kill|python-deadeager-4|python-deadsync-4)$" timeout 120 bash scripts/gpu-kernels.sh $D verify > "$OUT/kernp/stdout.txt" 2>&1; echo "kernels (processes) rc=$?"
OUT="$OUT/eng" WORLDS="2" STAGES="settings,kill" timeout 150 bash scripts/gpu-engines.sh .gpu/c4 .gpu/engines > "$OUT/eng/stdout.txt" 2>&1; echo "engines rc=$?"
grep -E "^ +7168" "$OUT/t/fused.txt" | awk '{print $2, $4, $5, $7, $13, $14, $15}'
grep -E "^ *[0-9]" "$OUT/t/sizes-8.txt" | head -40 | cut -c1-150
grep -v "^#" "$OUT/t/seq.txt" | head -20 | cut -c1-150
grep -v "not in ONLY" "$OUT/kernp/summary.txt"
grep -E "kill|batchinv" "$OUT/eng/engine-summary.md" | cut -c1-220
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz t eng kernp && rm -rf t eng kernp
