#!/usr/bin/env bash
# Round 13, call 3 (one H200): calls 1-2's `none` and `all` (exp binary of call 2) without
# programmatic dependent launch (TPAR_PDL=0) and eagerly (no graph), against the same with
# PDL in graphs: whether the fused call's extra time is inside the kernel or at the kernel
# boundary. 8 and 2 emulated ranks, 7168 x 1 bf16, one-shot pull, alternating, twice.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r13
gunzip -c $C/tpar-exp.gz > $D/exp; chmod +x $D/exp
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r13-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) exp $(sha256sum $D/exp | cut -c1-16)"
mkdir -p "$OUT/f"
ALL="-DTPAR_X_NOSEND -DTPAR_X_NOINV -DTPAR_X_NOTREE -DTPAR_X_NORES"
declare -A X=([none]="" [all]="$ALL" [bare]="$ALL -DTPAR_X_NOSTAGE -DTPAR_X_NOOPEN -DTPAR_X_NONORM")
for i in 1 2; do
  for e in none all bare; do
    for m in graph eager; do
      for p in 1 0; do
        TPAR_PDL=$p TPAR_EXP_DEFINES="${X[$e]}" timeout 60 $D/exp bench --fused --emulate-ranks 2,8 -d bfloat16 --mode $m --hidden 7168 --rows 1 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/x-$e-$m-pdl$p-$i.txt" 2>&1; echo "x-$e-$m-pdl$p-$i rc=$? t=$((SECONDS-T0))"
      done
    done
  done
done
for f in $(ls "$OUT/f" | sed 's/\.txt$//'); do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
