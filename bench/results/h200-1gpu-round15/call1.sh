#!/usr/bin/env bash
# Round 15, call 1 (one H200): `base` = 83a8798 (round 14's head); `new` = base + the fused
# epilogue's norm in groups (norm.cuh NormOut::norm_each: a thread's vectors' updated
# residuals, weights and rows' tiles all loaded before the first wait; one-shot pull and push
# G = 2, two-shot pull G = 4) + both fused variants of the one-shot kernels stage the first
# vector's residual and weight by cp.async (was: the cluster variant only; the plain fused
# variant's L1 prefetch is invalidated by the barrier's acquire) + the bench's launch lines.
#  - fused A/B alternating twice: 8 emulated ranks, 4096 / 7168 / 8192 x 1, 3, 8, one-shot
#    pull and push, graphs;
#  - the fused two-shot calls against the copy path (TPAR_ZERO_COPY=0), base / new: 2, 4, 8
#    ranks, 7168 x 1, 3, 8, 10, 16, 24, 32, 48, 64 (TPAR_FUSED does not touch the bench: it
#    names the path);
#  - grids (new): TPAR_BLOCKS 8 / 12 / 16 (with TPAR_FUSED_CLUSTER=0) at 7168 x 3, 8; 6
#    (clusters allowed: 6 x 448, two blocks a row) at 7168 x 3;
#  - phases (TPAR_TEST_STAMPS) for new at 7168 x 1, 3, 8;
#  - scripts/gpu-fused.sh on new (its binary and wheel).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r15
for b in base new; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
cp $D/new $D/tpar; cp $C/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r15-cache1 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in base new; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,10,16,24,32,48,64 -n 30 -w 5 --algo oneshot-pull,twoshot-pull)
G=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 3,8 -n 50 -w 5 --algo oneshot-pull)
for i in 1 2; do
  for b in base new; do
    timeout 90 $D/$b "${FB[@]}" > "$OUT/f/fb-$b-$i.txt" 2>&1; echo "fb-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
for b in base new; do
  TPAR_ZERO_COPY=0 timeout 150 $D/$b "${TS[@]}" > "$OUT/f/ts-$b.txt" 2>&1; echo "ts-$b rc=$? t=$((SECONDS-T0))"
done
for nb in 8 12 16; do
  TPAR_BLOCKS=$nb TPAR_FUSED_CLUSTER=0 timeout 60 $D/new "${G[@]}" > "$OUT/f/g$nb.txt" 2>&1; echo "g$nb rc=$? t=$((SECONDS-T0))"
done
TPAR_BLOCKS=6 timeout 60 $D/new bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 3 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/g6c.txt" 2>&1; echo "g6c rc=$? t=$((SECONDS-T0))"
TPAR_TEST_STAMPS=1 timeout 60 $D/new bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-new.txt" 2>&1; echo "stamps rc=$?"
for f in fb-base-1 fb-new-1 fb-base-2 fb-new-2 ts-base ts-new g8 g12 g16 g6c; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# launches" "$OUT/f/$f.txt" | awk '/^# launches/{print; next} {printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}' | grep -E "pull|push" | grep -v "^# launches.*push" | cut -c1-220; done
grep -h "rank [0-1]:" "$OUT/f/stamps-new.txt" | grep fused | sed 's/median ns from a block.s entry//' | cut -c1-200
OUT="$OUT/gf" BUDGET=$((575 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -16
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
