#!/usr/bin/env bash
# Round 15, call 2 (one H200): `base` = 83a8798 (round 14's head, call 1's base); `stage` =
# base + staging alone (call 1's `new` without the norm in groups): every kernel but two-shot
# push stages its first vector's residual and weight in shared memory (cp.async) in both
# fused variants, behind the start barrier's signal in the pull kernels (two-shot pull:
# its chunk's first vector; was an L1 prefetch, which the barrier's acquire invalidates);
# + the bench's launch lines.
#  - one-shot A/B alternating twice: 8 emulated ranks, 7168 x 1, 3, 8, pull and push, graphs;
#  - two-shot pull against the copy path (TPAR_ZERO_COPY=0), base / stage / base / stage:
#    2, 4, 8 ranks, 7168 x 1, 3, 8, 16, 32, 64;
#  - scripts/gpu-fused.sh on `stage` (its binary and wheel) with the time left.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r15b
for b in base stage; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
cp $D/stage $D/tpar; cp $C/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r15-cache2 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in base stage; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,16,32,64 -n 30 -w 5 --algo twoshot-pull)
for i in 1 2; do
  for b in base stage; do
    timeout 60 $D/$b "${FB[@]}" > "$OUT/f/fb-$b-$i.txt" 2>&1; echo "fb-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
for i in 1 2; do
  for b in base stage; do
    TPAR_ZERO_COPY=0 timeout 90 $D/$b "${TS[@]}" > "$OUT/f/ts-$b-$i.txt" 2>&1; echo "ts-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
for f in fb-base-1 fb-stage-1 fb-base-2 fb-stage-2 ts-base-1 ts-stage-1 ts-base-2 ts-stage-2; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$OUT/f/$f.txt" | awk '/^#/{print "w" $2; next} {printf "%s/%s %s AR %s F %s U %s f-AR %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$15}'; done
OUT="$OUT/gf" BUDGET=$((560 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -16
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
