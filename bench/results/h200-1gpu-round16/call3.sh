#!/usr/bin/env bash
# Round 16, call 3 (one H200): two-shot pull's fused kernel with the norm spread over the
# whole grid (norm.cuh TPAR_NORM_SPREAD: puts publish their tiles after a release fence, the
# norm runs grid-stride over the message; was: the grid's first cvec threads, world vectors
# each). `old` = call 1's binary under TPAR_FUSED_ROWS=0 (the previous head's kernels), `new`
# = the change (every other PTX unchanged).
#  - A/B alternating twice: TPAR_ZERO_COPY=0 (the copy path a GpuCommunicator runs), 2, 4, 8
#    emulated ranks, 7168 x 1, 3, 8, 16, 32, 64 bf16, graphs, two-shot pull;
#  - stamps (new) at 2 and 8 ranks, 1 and 10 rows;
#  - scripts/gpu-fused.sh on `new` (binary and wheel) with the time left.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r16b
for b in old new; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
cp $D/new $D/tpar; cp $C/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache3 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in old new; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,16,32,64 -n 30 -w 5 --algo twoshot-pull)
for i in 1 2; do
  TPAR_FUSED_ROWS=0 TPAR_ZERO_COPY=0 timeout 90 $D/old "${TS[@]}" > "$OUT/f/ts-old-$i.txt" 2>&1; echo "ts-old-$i rc=$? t=$((SECONDS-T0))"
  TPAR_ZERO_COPY=0 timeout 90 $D/new "${TS[@]}" > "$OUT/f/ts-new-$i.txt" 2>&1; echo "ts-new-$i rc=$? t=$((SECONDS-T0))"
done
TPAR_TEST_STAMPS=1 TPAR_ZERO_COPY=0 timeout 60 $D/new bench --fused --emulate-ranks 2,8 --mode graph -d bfloat16 --hidden 7168 --rows 1,10 -n 20 -w 3 --algo twoshot-pull > "$OUT/f/st-new.txt" 2>&1; echo "st-new rc=$? t=$((SECONDS-T0))"
for f in ts-old-1 ts-new-1 ts-old-2 ts-new-2; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$OUT/f/$f.txt" | awk '/^# [0-9]+ emulated/{print "ranks " $2; next} {printf "%s/%s AR %s F %s U %s f-AR %s unf %s w%s\n", $1,$2,$5,$7,$9,$13,$14,$15}'; done
grep -E "stamps (all-reduce|fused) twoshot-pull [0-9]+ x 7168:" "$OUT/f/st-new.txt" | cut -c1-160
OUT="$OUT/gf" BUDGET=$((570 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null | head -40
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
