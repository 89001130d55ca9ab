#!/usr/bin/env bash
# Round 10, call 2: the head with the registered path's new barriers (start: relaxed signal,
# acquire polls; one-shot's end: reads done, relaxed). (1) issue 25's run
# (scripts/gpu-large.sh final: correctness of the zero-copy path in place and out of place,
# the guards, then 2/4/8 emulated ranks 1 KiB-16 MiB against vLLM, PDL on and off, the
# 122 x 42 KiB step); (2) the head's acquire polls against call 1's volatile polls (exp),
# alternating, zero copy forced.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar.gz > $D/tpar; gunzip -c $C/tpar-exp.gz > $D/x; chmod +x $D/tpar $D/x
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $D/tpar | cut -c1-16) exp $(sha256sum $D/x | cut -c1-16)"
mkdir -p "$OUT/large" "$OUT/t"
ROOT=$PWD VLLM_SRC=$PWD/$C/vllm-src OUT="$OUT/large" BUDGET=440 timeout 470 bash scripts/gpu-large.sh $D final > "$OUT/large/stdout.txt" 2>&1
echo "gpu-large rc=$? t=$((SECONDS-T0))"; cat "$OUT/large/summary.txt"
L=(bench --mode graph -b 256K -e 4M -f 4 -d bfloat16 -n 30 -w 5 --algo oneshot-pull,twoshot-pull --emulate-ranks 2,4,8)
for i in 1 2; do
  TPAR_ZERO_COPY=1 timeout 40 $D/tpar "${L[@]}" > "$OUT/t/head-$i.txt" 2>&1; echo "head-$i rc=$? t=$((SECONDS-T0))"
  TPAR_ZERO_COPY=1 TPAR_EXP_DEFINES="-DEXP_ZC_START_RELAXED -DEXP_ZC_END_RELAXED" timeout 40 $D/x "${L[@]}" > "$OUT/t/exp-$i.txt" 2>&1; echo "exp-$i rc=$? t=$((SECONDS-T0))"
done
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; done 2>/dev/null | grep -v "^$" | cut -c1-200
rm -f "$OUT"/large/step-*.txt
cd "$OUT" && tar czf all.tgz large t && rm -rf t large/large.log large/nvcc.log large/stdout.txt && ls large
echo "end at $((SECONDS - T0)) s"
