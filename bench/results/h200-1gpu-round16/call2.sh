#!/usr/bin/env bash
# Round 16, call 2 (one H200): how the fused call's excess over the all-reduce grows with the
# ranks that share the GPU. The head's kernels and launches (call 1's binary under
# TPAR_FUSED_ROWS=0: every PTX and launch as 0399838's). 2, 4 and 8 emulated ranks, 7168 x 1,
# 3, 8 bf16, graphs, one-shot pull, twice.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; gunzip -c .gpu/r16a/tpar.gz > $D/tpar; chmod +x $D/tpar; B=$D/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache TPAR_TIMEOUT_MS=10000 TPAR_FUSED_ROWS=0
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $B | cut -c1-16)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
for i in 1 2; do
  timeout 120 $B bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/w-$i.txt" 2>&1; echo "w-$i rc=$? t=$((SECONDS-T0))"
done
TPAR_TEST_STAMPS=1 timeout 60 $B bench --fused --emulate-ranks 2 -d bfloat16 --mode graph --hidden 7168 --rows 1,8 -n 20 -w 3 --algo oneshot-pull > "$OUT/f/st2.txt" 2>&1; echo "st2 rc=$? t=$((SECONDS-T0))"
for i in 1 2; do echo "== w-$i"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# launches|^# [0-9]+ emulated" "$OUT/f/w-$i.txt" | awk '/^# [0-9]+ emulated/{print "ranks " $2; next} /^# launches/{sub(/.*; fused /,"",$0); sub(/;.*/,"",$0); l=$0; next} {printf "%s/%s AR %s F %s U %s f-AR %s unf %s w%s | fused %s\n", $1,$2,$5,$7,$9,$13,$14,$15, l}'; done
grep -E "stamps (all-reduce|fused) oneshot-pull [18] x 7168 rank 0" "$OUT/f/st2.txt" | cut -c1-220
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
