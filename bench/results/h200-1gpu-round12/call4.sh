#!/usr/bin/env bash
# Round 12, call 4 (one H200): the cluster variant with its barrier at the kernel's entry and
# the residual's copy issued after this rank's own data are out (`new`, 2nd commit of the
# round) against `c3` (call 3's binary) and `old` = 686f732, alternating twice: 8 emulated
# ranks, hidden 4096 / 7168 / 8192 x 1, 3, 8 rows, bf16, graphs, one-shot pull and push; 2 and
# 4 ranks once; the phases; rank processes on one GPU (correctness); then
# scripts/gpu-fused.sh on `new` (its 8-rank selftest step now given 240 s).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r12
gunzip -c $C/tpar-old.gz > $D/old; gunzip -c $C/tpar-c3.gz > $D/c3; gunzip -c $C/tpar.gz > $D/tpar; chmod +x $D/old $D/c3 $D/tpar
cp .gpu/r12w/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r12-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) old $(sha256sum $D/old | cut -c1-16) c3 $(sha256sum $D/c3 | cut -c1-16) new $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
for i in 1 2; do
  timeout 90 $D/old "${FB[@]}" > "$OUT/f/old-$i.txt" 2>&1; echo "old-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/tpar "${FB[@]}" > "$OUT/f/new-$i.txt" 2>&1; echo "new-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/c3 "${FB[@]}" > "$OUT/f/c3-$i.txt" 2>&1; echo "c3-$i rc=$? t=$((SECONDS-T0))"
done
F24=(bench --fused --emulate-ranks 2,4 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
timeout 90 $D/c3 "${F24[@]}" > "$OUT/f/c3-24.txt" 2>&1; echo "c3-24 rc=$?"
timeout 90 $D/tpar "${F24[@]}" > "$OUT/f/new-24.txt" 2>&1; echo "new-24 rc=$?"
TPAR_TEST_STAMPS=1 timeout 60 $D/tpar bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-new.txt" 2>&1; echo "stamps rc=$? t=$((SECONDS-T0))"
for f in old-1 new-1 c3-1 old-2 new-2 c3-2 c3-24 new-24; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'; done
grep -h "rank 0:" "$OUT/f/stamps-new.txt" | grep fused | cut -c1-220
timeout 90 $D/tpar selftest fused --backend cuda --world 4 --plan-topology h200-nvswitch-8 --algo oneshot-push,oneshot-pull -d bfloat16,float --hidden 4096,7168,8192 --rows 1,3,8 --seq-calls 12 > "$OUT/f/procs-4.txt" 2>&1; echo "procs-4 rc=$? $(tail -1 "$OUT/f/procs-4.txt" | cut -c1-200) t=$((SECONDS-T0))"
OUT="$OUT/gf" BUDGET=$((570 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -30
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
