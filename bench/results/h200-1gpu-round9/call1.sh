#!/usr/bin/env bash
# Round 9, call 1 (one H200): timings alone first (main's fused and 122 x 42K; the exp
# binary's large-message variants beside vLLM; the early-residual fused variant), then the
# verify steps that the host-record poll count (8f59f18) touches.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/c1
gunzip -c $C/tpar.gz > $D/tpar; gunzip -c $C/tpar-exp.gz > $D/tpar-exp; chmod +x $D/tpar $D/tpar-exp
cp $C/whl/*.whl scripts/gpu_python_check.py $D/
B=$D/tpar; X=$D/tpar-exp
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/t" "$OUT/kern"
echo "## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) tpar $(sha256sum $B | cut -c1-16) exp $(sha256sum $X | cut -c1-16)"
bash bench/compare/vllm.sh build $C/vllm-src > "$OUT/t/nvcc.log" 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
K=oneshot-push,oneshot-pull,twoshot-push,twoshot-pull
F=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5)
timeout 60 $B "${F[@]}" --algo $K --json "$OUT/t/fused-main.json" > "$OUT/t/fused-main.txt" 2>&1; echo "fused main rc=$? t=$((SECONDS-T0))"
TPAR_EXP_DEFINES="-DEXP_EARLY_RES" timeout 60 $X "${F[@]}" --algo oneshot-pull,oneshot-push --json "$OUT/t/fused-early.json" > "$OUT/t/fused-early.txt" 2>&1; echo "fused early rc=$? t=$((SECONDS-T0))"
timeout 60 $B bench --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo $K --emulate-ranks 2,4,8 > "$OUT/t/seq.txt" 2>&1; echo "seq rc=$? t=$((SECONDS-T0))"
L=(bench --mode graph -b 256K -e 16M -f 4 -d bfloat16 --emulate-ranks 2,4,8 --algo oneshot-pull,twoshot-pull -n 20 -w 3)
for v in 0 1 2; do
  for b in 16 32; do
    cmp=(); [ $v = 0 ] && [ $b = 32 ] && cmp=(--compare "vllm=$LIB")
    TPAR_EXP_DEFINES="-DEXP_PEER_LD=$v" TPAR_BLOCKS=$b timeout 70 $X "${L[@]}" "${cmp[@]}" --json "$OUT/t/large-ld$v-b$b.json" > "$OUT/t/large-ld$v-b$b.txt" 2>&1
    echo "large ld=$v blocks=$b rc=$? t=$((SECONDS-T0))"
  done
done
LEFT=$((575 - (SECONDS - T0)))
echo "verify with BUDGET=$LEFT"
OUT="$OUT/kern" BUDGET=$LEFT ONLY="^(check-emulated|check-lean-forced|check-host|timeout|timeout-host|mismatch-emulated|graph-skew|procs-kill|python-deadeager-4)$" timeout $((LEFT + 10)) bash scripts/gpu-kernels.sh $D verify > "$OUT/kern/stdout.txt" 2>&1; echo "kernels verify rc=$?"
grep -E "^ +7168" "$OUT/t/fused-main.txt" "$OUT/t/fused-early.txt" | cut -c1-200
grep -v "^#" "$OUT/t/seq.txt" | grep -v "^$" | head -20 | cut -c1-150
grep -v "not in ONLY" "$OUT/kern/summary.txt"
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz t kern && rm -rf t kern
