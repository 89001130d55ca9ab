#!/usr/bin/env bash
# Prepared in round 11 and NOT run: the device time was spent (README, "Call 6").
# Round 11, call 6: vLLM's kernel on the grid tpar now runs on ranks sharing a GPU (16 blocks
# at 4 ranks, 8 at 8: TPAR_VLLM_BLOCKS) against its default lowered to what is resident (33
# at 4 ranks, 16 at 8), in the same runs as tpar's plan pick: is tpar's lead at those sizes
# the grid alone? 16 KiB-1 MiB (the sizes where the grid rule applies) and the step.
set -u
T0=$SECONDS; K=.gpu/k11
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $K/tpar | cut -c1-16)"
bash bench/compare/vllm.sh build $K/vllm-src > /dev/null 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
mkdir -p "$OUT/v"
for r in 4 8; do
  cap=$((132 / (2 * r)))
  for vb in default $cap default $cap; do
    n=r$r-v$vb-$((++i))
    if [ $vb = default ]; then e=(X=1); else e=(TPAR_VLLM_BLOCKS=$vb); fi
    env "${e[@]}" timeout 60 $K/tpar bench --mode graph -b 16K -e 1M -f 4 -d bfloat16 --sequence 122x43008 -n 30 -w 5 --emulate-ranks $r --algo auto --compare "vllm=$LIB" > "$OUT/v/$n.txt" 2>&1
    echo "$n rc=$? t=$((SECONDS-T0)) $(grep -m1 'blocks per call' "$OUT/v/$n.txt" | cut -c1-90)"
    grep -E "^   graph  bfloat16" "$OUT/v/$n.txt" | awk 'NF>=10 {printf "  %s/%s: tpar %s vllm %s = %s\n", $3, $4, $6, $9, $10}'
  done
done
cd "$OUT" && tar czf all.tgz v && rm -rf v
echo "end at $((SECONDS - T0)) s"
