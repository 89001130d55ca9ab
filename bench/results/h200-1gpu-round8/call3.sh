#!/usr/bin/env bash
# Round 8, call 3 (one H200), the head under test (abort through the pinned error record):
# 1. the fused bench at hidden 7168 x 1/3/8 (timings: alone on the GPU, first);
# 2. the engines' own code at 2/4/8 rank processes (kill stage) in the background, while
# 3. scripts/gpu-kernels.sh verify's emulated steps that a change of the waits touches (every
#    kernel changed: frame.cuh; ONLY below) run: both correctness only; then
# 4. its rank-process steps (dead ranks' bounds), alone on the GPU.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; gunzip -c .gpu/c3/tpar.gz > $D/tpar; chmod +x $D/tpar; cp .gpu/c3/*.whl scripts/gpu_python_check.py $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/fused" "$OUT/eng" "$OUT/kern"
echo "## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) tpar $(sha256sum $D/tpar | cut -c1-16)"
timeout 60 $D/tpar bench --fused --emulate-ranks 8 -d bfloat16 --algo oneshot-pull,oneshot-push,twoshot-push,twoshot-pull --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --json "$OUT/fused/fused-7168.json" > "$OUT/fused/bench.txt" 2>&1; echo "fused bench rc=$?"
(OUT="$OUT/eng" WORLDS="2 4 8" timeout 300 bash scripts/gpu-engines.sh .gpu/c3 .gpu/engines > "$OUT/eng/stdout.txt" 2>&1; echo "engines rc=$?" > "$OUT/eng/rc.txt") &
EP=$!
OUT="$OUT/kern" BUDGET=200 ONLY="^(check-emulated|check-host|graph-skew|timeout|timeout-host|mismatch-emulated)$" timeout 230 bash scripts/gpu-kernels.sh $D verify > "$OUT/kern/stdout.txt" 2>&1; echo "kernels (emulated) rc=$?"
wait $EP; cat "$OUT/eng/rc.txt"
# Rank processes after the engines' (no other process on the GPU while their bounds are timed).
mkdir -p "$OUT/kernp"; OUT="$OUT/kernp" BUDGET=150 ONLY="^(procs-check|procs-kill|python-correct-4|python-deadeager-4|python-deadsync-4)$" timeout 170 bash scripts/gpu-kernels.sh $D verify > "$OUT/kernp/stdout.txt" 2>&1; echo "kernels (processes) rc=$?"
grep -E "^ +7168" "$OUT/fused/bench.txt" | awk '{print $2, $4, $5, $7, $13, $14, $15}'
cat "$OUT/kern/summary.txt" "$OUT/kernp/summary.txt" 2>/dev/null | grep -v "not in ONLY" | head -60
grep -E "^\| (vllm|sglang)" "$OUT/eng/stdout.txt" | tail -9
grep -E "kill" "$OUT/eng/engine-summary.md" | cut -c1-260 | head -8
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz fused eng kern kernp && rm -rf fused eng kern kernp
