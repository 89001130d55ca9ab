#!/usr/bin/env bash
# Round 16, call 1 (one H200): the fused one-shot pull's row-block variant (one row a
# block, the row's sums in the block's shared memory; kernels/norm.cuh -DTPAR_FUSED_ROWS).
# One binary (the change); TPAR_FUSED_ROWS=0 is the previous head's launch everywhere (every
# other variant's PTX is byte-identical to 0399838's: 198 files compared).
#  - A/B alternating twice: 8 emulated ranks, 4096 / 7168 / 8192 x 1, 3, 8 bf16, graphs,
#    one-shot pull: TPAR_FUSED_ROWS=0 (old), auto (the rule: 8 rows at 8 ranks), 1 (every
#    shape whose row fits a block, 1 and 3 rows included);
#  - correctness of the variant everywhere it can run (TPAR_FUSED_ROWS=1): selftest fused on
#    8 / 2 / 4 ranks, host transport, skewed graphs, epoch wrap;
#  - 1 row on TPAR_BLOCKS 4 and 2 (clusters of 4 and 2 blocks);
#  - stamps: the row-block variant at 8 rows; two-shot pull's copy path (bb6a734's stamps,
#    round 15's open question: puts or norm?).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; gunzip -c .gpu/r16a/tpar.gz > $D/tpar; chmod +x $D/tpar; B=$D/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $B | cut -c1-16)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull)
# run NAME LIMIT ENV... CMD: skipped (and said so) when the call would pass 540 s
run() { local n="$1" lim="$2"; shift 2; if [ $((SECONDS - T0 + lim / 3)) -gt 540 ]; then echo "$n SKIPPED t=$((SECONDS-T0))"; return; fi; env "$@" > "$OUT/f/$n.txt" 2>&1; echo "$n rc=$? t=$((SECONDS-T0))"; }
for i in 1 2; do
  for m in 0 auto 1; do run fb-$m-$i 60 TPAR_FUSED_ROWS=$m timeout 60 $B "${FB[@]}"; done
done
# 1 row in fewer, larger cluster blocks (TPAR_BLOCKS sets the all-reduce's grid too: compare
# the fused column with fb-*'s all-reduce)
for nb in 4 2; do run g$nb 40 TPAR_BLOCKS=$nb timeout 40 $B bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 50 -w 5 --algo oneshot-pull; done
SF=($B selftest fused)
run sf8 150 TPAR_FUSED_ROWS=1 timeout 150 "${SF[@]}" --emulate-ranks 8 -d all --hidden 1024,4096,7168,8192 --rows 1,2,3,5,8,13,16 --seq-calls 24
run sf24 90 TPAR_FUSED_ROWS=1 timeout 90 "${SF[@]}" --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,4,8,9,64 --seq-calls 12
run sfhost 90 TPAR_FUSED_ROWS=1 timeout 90 "${SF[@]}" --emulate-ranks 2,4 --transport host -d bfloat16,float --hidden 4096,7168 --rows 1,3,8,33 --seq-calls 12
run sfskew 60 TPAR_FUSED_ROWS=1 timeout 60 "${SF[@]}" --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8 --replays 3 --seq-calls 48
run sfauto 60 timeout 60 "${SF[@]}" --emulate-ranks 8 --mode graph -d bfloat16,float --hidden 4096,7168,8192 --rows 8,9,16 --seq-calls 24
run sfwrap 40 TPAR_FUSED_ROWS=1 timeout 40 "${SF[@]}" --emulate-ranks 4 --epoch-start 4294967290 -d bfloat16 --hidden 7168 --rows 1,3,8 --unfused-every 0 --seq-calls 12
run st-rows 60 TPAR_TEST_STAMPS=1 timeout 60 $B bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 3,8 -n 20 -w 3 --algo oneshot-pull
run st-rows0 60 TPAR_TEST_STAMPS=1 TPAR_FUSED_ROWS=0 timeout 60 $B bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 3,8 -n 20 -w 3 --algo oneshot-pull
run st-2shot 90 TPAR_TEST_STAMPS=1 TPAR_ZERO_COPY=0 timeout 90 $B bench --fused --emulate-ranks 2,8 --mode graph -d bfloat16 --hidden 7168 --rows 1,10 -n 20 -w 3 --algo twoshot-pull
for f in fb-0-1 fb-auto-1 fb-1-1 fb-0-2 fb-auto-2 fb-1-2 g4 g2; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# launches" "$OUT/f/$f.txt" | awk '/^# launches/{sub(/.*; fused /,"",$0); sub(/;.*/,"",$0); l=$0; next} {printf "%s/%s AR %s F %s U %s f-AR %s unf %s w%s | fused %s\n", $1,$2,$5,$7,$9,$13,$14,$15, l}'; done
for f in sf8 sf24 sfhost sfskew sfauto sfwrap; do echo "== $f: $(tail -2 $OUT/f/$f.txt | tr '\n' ' ' | cut -c1-300)"; done
for f in st-rows st-rows0 st-2shot; do echo "== $f"; grep -E "^# stamps|^# launches" "$OUT/f/$f.txt" | cut -c1-260 | head -24; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
