#!/usr/bin/env bash
# Round 13, call 4 (one H200): the cluster variant's residual and weight copy (cp.async)
# issued after the start barrier's signal instead of before it (`new`), against `base` =
# d9c67a2, alternating twice: 8 emulated ranks, hidden 4096 / 7168 / 8192 x 1, 3, 8 rows,
# bf16, graphs, one-shot pull and push; 2 and 4 ranks once each; the phases; then
# scripts/gpu-fused.sh on `new` (correctness, rank processes, timings).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r13
gunzip -c $C/tpar-base.gz > $D/base; gunzip -c $C/tpar-new.gz > $D/tpar; chmod +x $D/base $D/tpar
cp .gpu/r13w/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r13-cache4 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) base $(sha256sum $D/base | cut -c1-16) new $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
F24=(bench --fused --emulate-ranks 2,4 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
for i in 1 2; do
  timeout 90 $D/base "${FB[@]}" > "$OUT/f/base-$i.txt" 2>&1; echo "base-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/tpar "${FB[@]}" > "$OUT/f/new-$i.txt" 2>&1; echo "new-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/base "${F24[@]}" > "$OUT/f/base-24-$i.txt" 2>&1; echo "base-24-$i rc=$?"
  timeout 90 $D/tpar "${F24[@]}" > "$OUT/f/new-24-$i.txt" 2>&1; echo "new-24-$i rc=$?"
done
TPAR_TEST_STAMPS=1 timeout 60 $D/tpar bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-new.txt" 2>&1; echo "stamps rc=$?"
for f in base-1 new-1 base-2 new-2 base-24-1 new-24-1 base-24-2 new-24-2; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'; done
grep -h "rank [0-2]:" "$OUT/f/stamps-new.txt" | grep fused | sed 's/median ns from a block.s entry//' | cut -c1-200
OUT="$OUT/gf" BUDGET=$((560 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -40
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
