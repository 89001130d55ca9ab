#!/usr/bin/env bash
# Round 12, call 3 (one H200): the candidate as committed (the cluster variant a separate
# compile, -DTPAR_FUSED_CLUSTER; the plain fused variant byte-identical to 686f732's) against
# `old` = 686f732, alternating twice: 8 emulated ranks, hidden 4096 / 7168 / 8192 x 1, 3, 8
# rows, bf16, graphs, one-shot pull and push; `new` with TPAR_FUSED_CLUSTER=0; 2 and 4 ranks
# once; the phases (TPAR_TEST_STAMPS); then scripts/gpu-fused.sh on the candidate (every
# selftest step, tpar.torch in 2 and 4 rank processes, the bench tables, torch's ops).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r12
gunzip -c $C/tpar-old.gz > $D/old; gunzip -c $C/tpar.gz > $D/tpar; chmod +x $D/old $D/tpar
cp .gpu/r12w/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r12-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) old $(sha256sum $D/old | cut -c1-16) new $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
for i in 1 2; do
  timeout 90 $D/old "${FB[@]}" > "$OUT/f/old-$i.txt" 2>&1; echo "old-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/tpar "${FB[@]}" > "$OUT/f/new-$i.txt" 2>&1; echo "new-$i rc=$? t=$((SECONDS-T0))"
  TPAR_FUSED_CLUSTER=0 timeout 90 $D/tpar "${FB[@]}" > "$OUT/f/nocluster-$i.txt" 2>&1; echo "nocluster-$i rc=$? t=$((SECONDS-T0))"
done
F24=(bench --fused --emulate-ranks 2,4 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
timeout 90 $D/old "${F24[@]}" > "$OUT/f/old-24.txt" 2>&1; echo "old-24 rc=$?"
timeout 90 $D/tpar "${F24[@]}" > "$OUT/f/new-24.txt" 2>&1; echo "new-24 rc=$?"
TPAR_TEST_STAMPS=1 timeout 60 $D/tpar bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-new.txt" 2>&1; echo "stamps rc=$? t=$((SECONDS-T0))"
for f in old-1 new-1 nocluster-1 old-2 new-2 nocluster-2 old-24 new-24; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'; done
grep -h "rank 0:" "$OUT/f/stamps-new.txt" | grep fused | cut -c1-220
OUT="$OUT/gf" BUDGET=$((560 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -30
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
