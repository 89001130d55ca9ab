#!/usr/bin/env bash
# Round 13, call 1 (one H200): where the fused call's time over the all-reduce goes, and the
# cluster variant at 3 rows for 8 emulated ranks.
#  - `exp` = the working tree of this call (launcher: cluster_shapes) + exp-hook.diff (extra
#    NVRTC defines from TPAR_EXP_DEFINES) + xdefs.diff (norm.cuh: TPAR_X_* switches that
#    drop one piece of the fused epilogue each, results then wrong: timing attribution only;
#    never committed). TPAR_X_RCP is bit-identical (rcp.rn for div.rn(1, x)).
#  - 8 and 2 emulated ranks, 7168 x 1 bf16, graphs, one-shot pull, each switch set twice,
#    alternating; the phases (TPAR_TEST_STAMPS) for none and all;
#  - TPAR_X_SHAPE=k (exp only): the cluster shapes after the first k (7168 x 1: 7 x 128,
#    4 x 224, 2 x 448; 7168 x 3 at 8 ranks: 4 x 224, 2 x 448), 8 ranks, 1 and 3 rows, twice;
#  - exp without switches, TPAR_FUSED_CLUSTER=0 (= the previous head's launch everywhere)
#    against 1, 8 ranks, 4096 / 7168 / 8192 x 1, 3, 8, one-shot pull and push, twice.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r13
gunzip -c $C/tpar-exp.gz > $D/exp; chmod +x $D/exp
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r13-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) exp $(sha256sum $D/exp | cut -c1-16)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f"
declare -A X=([none]="" [nosend]="-DTPAR_X_NOSEND" [noinv]="-DTPAR_X_NOINV" [notree]="-DTPAR_X_NOTREE" [nores]="-DTPAR_X_NORES" [rcp]="-DTPAR_X_RCP" [all]="-DTPAR_X_NOSEND -DTPAR_X_NOINV -DTPAR_X_NOTREE -DTPAR_X_NORES")
FX=(bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 50 -w 5 --algo oneshot-pull)
for i in 1 2; do
  for e in none nosend noinv notree nores rcp all; do
    TPAR_EXP_DEFINES="${X[$e]}" timeout 60 $D/exp "${FX[@]}" > "$OUT/f/x-$e-$i.txt" 2>&1; echo "x-$e-$i rc=$? t=$((SECONDS-T0))"
  done
done
for e in none all; do
  TPAR_EXP_DEFINES="${X[$e]}" TPAR_TEST_STAMPS=1 timeout 60 $D/exp bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-$e.txt" 2>&1; echo "stamps-$e rc=$?"
done
FS=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3 -n 50 -w 5 --algo oneshot-pull)
for i in 1 2; do
  for k in 0 1 2; do
    TPAR_X_SHAPE=$k timeout 60 $D/exp "${FS[@]}" > "$OUT/f/shape$k-$i.txt" 2>&1; echo "shape$k-$i rc=$? t=$((SECONDS-T0))"
  done
done
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
for i in 1 2; do
  TPAR_FUSED_CLUSTER=0 timeout 90 $D/exp "${FB[@]}" > "$OUT/f/nocl-$i.txt" 2>&1; echo "nocl-$i rc=$? t=$((SECONDS-T0))"
  timeout 90 $D/exp "${FB[@]}" > "$OUT/f/new-$i.txt" 2>&1; echo "new-$i rc=$? t=$((SECONDS-T0))"
done
for f in $(ls "$OUT/f" | grep -v stamps | sed 's/\.txt$//'); do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'; grep -E "emulated ranks" "$OUT/f/$f.txt" | head -3; done
grep -h "rank 0:\|first entry" "$OUT/f"/stamps-*.txt | grep fused | cut -c1-220
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
