#!/usr/bin/env bash
# Round 13, call 5 (one H200, another start): `old` = b00f4a9 (round 12's head), `new2` =
# c755373 + the cluster variant's residual and weight copy issued after the start barrier's
# signal, and `old` with TPAR_FUSED_CLUSTER=0 (the plain fused variant), alternating twice:
# 8 emulated ranks, hidden 4096 / 7168 / 8192 x 1, 3, 8 rows, bf16, graphs, one-shot pull
# and push; 2 and 4 ranks once each; the phases of old and new2; then scripts/gpu-fused.sh
# on new2. Which GPU: its UUID and clocks first (call 4's start measured the same cluster
# kernels 0.6 us slower than calls 1-3's).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r13
gunzip -c $C/tpar-old.gz > $D/old; gunzip -c $C/tpar-new2.gz > $D/tpar; chmod +x $D/old $D/tpar
cp .gpu/r13w/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r13-cache5 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) old $(sha256sum $D/old | cut -c1-16) new2 $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
F24=(bench --fused --emulate-ranks 2,4 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
for i in 1 2; do
  timeout 90 $D/old "${FB[@]}" > "$OUT/f/old-$i.txt" 2>&1; echo "old-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/tpar "${FB[@]}" > "$OUT/f/new2-$i.txt" 2>&1; echo "new2-$i rc=$? t=$((SECONDS-T0))"
  TPAR_FUSED_CLUSTER=0 timeout 90 $D/old "${FB[@]}" > "$OUT/f/plain-$i.txt" 2>&1; echo "plain-$i rc=$? t=$((SECONDS-T0))"
done
timeout 90 $D/old "${F24[@]}" > "$OUT/f/old-24.txt" 2>&1; echo "old-24 rc=$?"
timeout 90 $D/tpar "${F24[@]}" > "$OUT/f/new2-24.txt" 2>&1; echo "new2-24 rc=$?"
TPAR_FUSED_CLUSTER=0 timeout 90 $D/old "${F24[@]}" > "$OUT/f/plain-24.txt" 2>&1; echo "plain-24 rc=$?"
for b in old tpar; do
  TPAR_TEST_STAMPS=1 timeout 60 $D/$b bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-$b.txt" 2>&1; echo "stamps-$b rc=$?"
done
for f in old-1 new2-1 plain-1 old-2 new2-2 plain-2 old-24 new2-24 plain-24; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}' | grep -E "pull|7168"; done
for b in old tpar; do grep -h "rank [0-2]:" "$OUT/f/stamps-$b.txt" | grep fused | sed 's/median ns from a block.s entry//' | cut -c1-200; done
OUT="$OUT/gf" BUDGET=$((560 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -16
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
