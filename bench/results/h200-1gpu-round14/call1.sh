#!/usr/bin/env bash
# Round 14, call 1 (one H200): `base` = 02a11ea (round 13's head); `merge` = base with
# frame.cuh's barrier_block as barrier_block_then with nothing between (one copy of the
# barrier; instruction order changes in the plain one-shot and two-shot pull variants);
# `c1` = base with the cluster variant's weight address from the block's place in its
# cluster (no v % vrow division between the start signal and the wait); `final` = merge + c1.
#  - fused A/B, alternating twice: 8 emulated ranks, hidden 4096 / 7168 / 8192 x 1, 3, 8
#    rows, bf16, graphs, one-shot pull and push;
#  - plain all-reduce A/B (base, merge), alternating twice: 2, 4, 8 ranks, 1 KiB - 1 MiB,
#    bf16, graphs, one-shot pull and two-shot pull (-c 0: timing only; `final` is checked
#    below and in call 2);
#  - the fused two-shot calls against the copy-path all-reduce (TPAR_ZERO_COPY=0, what a
#    GpuCommunicator runs) and against the default (zero copy from 0 B for two-shot pull):
#    2, 4, 8 ranks, 7168 x 1, 3, 8, 64;
#  - scripts/gpu-fused.sh on `final` (its binary and wheel).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r14
for b in base merge c1 final; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
cp $D/final $D/tpar; cp $C/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r14-cache1 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in base merge c1 final; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
AR=(bench --emulate-ranks 2,4,8 -d bfloat16 --mode graph -b 1K -e 1M -f 4 -c 0 -n 50 -w 5 --algo oneshot-pull,twoshot-pull)
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,64 -n 50 -w 5 --algo oneshot-pull,twoshot-pull,twoshot-push)
for i in 1 2; do
  for b in base c1 merge final; do
    timeout 90 $D/$b "${FB[@]}" > "$OUT/f/fb-$b-$i.txt" 2>&1; echo "fb-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
for i in 1 2; do
  for b in base merge; do
    timeout 120 $D/$b "${AR[@]}" > "$OUT/f/ar-$b-$i.txt" 2>&1; echo "ar-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
TPAR_ZERO_COPY=0 timeout 120 $D/final "${TS[@]}" > "$OUT/f/ts-copy.txt" 2>&1; echo "ts-copy rc=$? t=$((SECONDS-T0))"
timeout 120 $D/final "${TS[@]}" > "$OUT/f/ts-default.txt" 2>&1; echo "ts-default rc=$? t=$((SECONDS-T0))"
for f in fb-base-1 fb-c1-1 fb-merge-1 fb-final-1 fb-base-2 fb-c1-2 fb-merge-2 fb-final-2 ts-copy ts-default; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)" "$OUT/f/$f.txt" | awk '{printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}' | grep -E "pull|7168|two"; done
for f in ar-base-1 ar-merge-1 ar-base-2 ar-merge-2; do echo "== $f"; awk '/^# algorithm:/{a=$3; r=$7} /^ +[0-9]+ +[0-9]+ +bfloat16/{printf "%s %s %s %s ", r, a, $1, $5} /^ +[0-9]+ +[0-9]+ +bfloat16/{n++; if (n % 3 == 0) print ""}' "$OUT/f/$f.txt"; echo; done
for b in base final; do
  TPAR_TEST_STAMPS=1 timeout 60 $D/$b bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 30 -w 5 --algo oneshot-pull > "$OUT/f/stamps-$b.txt" 2>&1; echo "stamps-$b rc=$?"
  grep -h "rank [0-2]:" "$OUT/f/stamps-$b.txt" | grep fused | sed 's/median ns from a block.s entry//' | cut -c1-200
done
OUT="$OUT/gf" BUDGET=$((570 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -16
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gf && rm -rf f gf
