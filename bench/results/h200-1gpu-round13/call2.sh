#!/usr/bin/env bash
# Round 13, call 2 (one H200): what is left of the fused call's cost with the row exchange,
# the tree, 1/rms and the residual store switched off (call 1's `all`, +0.8 us at 8 ranks):
# `exp` (call 1's, plus TPAR_X_NOSTAGE: no cp.async, the residual and weight loaded where
# used; TPAR_X_NOOPEN: no mbarrier or cluster barrier at entry; TPAR_X_NONORM: no
# normalised output; TPAR_X_NOSEND now also in the plain fused variant; TPAR_X_ARCLUSTER=c:
# the all-reduce alone launched in clusters of c). Results wrong where a switch is on: timing
# attribution only, never committed. 8 and 2 emulated ranks, 7168 x 1 bf16, graphs, one-shot
# pull, alternating, twice.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r13
gunzip -c $C/tpar-exp.gz > $D/exp; chmod +x $D/exp
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r13-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) exp $(sha256sum $D/exp | cut -c1-16)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f"
ALL="-DTPAR_X_NOSEND -DTPAR_X_NOINV -DTPAR_X_NOTREE -DTPAR_X_NORES"
declare -A X=([none]="" [all]="$ALL" [nostage]="$ALL -DTPAR_X_NOSTAGE" [noopen]="$ALL -DTPAR_X_NOOPEN" [nonorm]="$ALL -DTPAR_X_NONORM" [bare]="$ALL -DTPAR_X_NOSTAGE -DTPAR_X_NOOPEN -DTPAR_X_NONORM")
FX=(bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 50 -w 5 --algo oneshot-pull)
for i in 1 2; do
  for e in none all nostage noopen nonorm bare; do
    TPAR_EXP_DEFINES="${X[$e]}" timeout 60 $D/exp "${FX[@]}" > "$OUT/f/x-$e-$i.txt" 2>&1; echo "x-$e-$i rc=$? t=$((SECONDS-T0))"
  done
  for e in all bare; do
    TPAR_FUSED_CLUSTER=0 TPAR_EXP_DEFINES="${X[$e]}" timeout 60 $D/exp "${FX[@]}" > "$OUT/f/x-$e-nocl-$i.txt" 2>&1; echo "x-$e-nocl-$i rc=$? t=$((SECONDS-T0))"
  done
  TPAR_X_ARCLUSTER=7 timeout 60 $D/exp bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/x-arcl7-$i.txt" 2>&1; echo "arcl7-$i rc=$?"
  TPAR_X_ARCLUSTER=1 timeout 60 $D/exp bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/x-arcl1-$i.txt" 2>&1; echo "arcl1-$i rc=$?"
done
for e in all bare; do
  TPAR_EXP_DEFINES="${X[$e]}" TPAR_TEST_STAMPS=1 timeout 60 $D/exp bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-$e.txt" 2>&1; echo "stamps-$e rc=$?"
done
TPAR_X_ARCLUSTER=7 TPAR_TEST_STAMPS=1 timeout 60 $D/exp bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-arcl7.txt" 2>&1
for f in $(ls "$OUT/f" | grep -v stamps | sed 's/\.txt$//'); do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'; done
for f in "$OUT/f"/stamps-*.txt; do echo "== $f"; grep -h "rank [0-3]:" $f | sed 's/median ns from a block.s entry//' | cut -c1-200; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
