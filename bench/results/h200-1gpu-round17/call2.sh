#!/usr/bin/env bash
# Round 17, call 2 (one H200): the cluster path's row sum and exchange, two cuts, against the head.
# head = call 1's (32dc5cb5cf973906). A = head + A.diff's kernel change (the row's 28 tiles
# summed from two 16-byte shared loads a lane, three levels, two xor shuffles: the same tree
# as before, which summed 32 predicated loads in one lane) + call 1's trace points (only
# compiled under TPAR_TEST_STAMPS=1). AB = A + AB-over-A.diff (no mbarrier: the tile slots start
# as a sentinel, the sends are plain remote stores, the readers poll their octet; an
# experiment valid for rows of at most 32 tiles, so its selftests stop at hidden 8192).
# Timings alternate head / A / AB twice; then traces of A and AB; then selftests of A and AB.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D
gunzip -c .gpu/r17a/tpar-head.gz > $D/tpar-head
for b in A AB; do gunzip -c .gpu/r17b/tpar-$b.gz > $D/tpar-$b; done
chmod +x $D/tpar-*
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r17-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in head A AB; do echo -n "$b $(sha256sum $D/tpar-$b | cut -c1-16) "; done)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
for i in 1 2; do
  for b in head A AB; do
    timeout 120 $D/tpar-$b bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/t-$b-$i.txt" 2>&1; echo "t-$b-$i rc=$? t=$((SECONDS-T0))"
    timeout 120 $D/tpar-$b bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,8192 --rows 1 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/h-$b-$i.txt" 2>&1; echo "h-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
for b in A AB; do
  TPAR_TEST_STAMPS=1 timeout 120 $D/tpar-$b bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,8 -n 20 -w 3 --algo oneshot-pull > "$OUT/f/trace-$b.txt" 2>&1; echo "trace-$b rc=$? t=$((SECONDS-T0))"
done
for b in A AB; do
  timeout 200 $D/tpar-$b selftest fused --emulate-ranks 8 -d all --hidden 1024,2880,4096,7168,8192 --rows 1,2,3,5,8,13,32,33,63,64 --seq-calls 24 > "$OUT/f/sf8-$b.txt" 2>&1; echo "sf8-$b rc=$? t=$((SECONDS-T0))"; tail -2 "$OUT/f/sf8-$b.txt"
  timeout 90 $D/tpar-$b selftest fused --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,4,8,9,64 --seq-calls 12 > "$OUT/f/sf24-$b.txt" 2>&1; echo "sf24-$b rc=$? t=$((SECONDS-T0))"; tail -2 "$OUT/f/sf24-$b.txt"
  timeout 60 $D/tpar-$b selftest fused --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8 --replays 3 --seq-calls 48 > "$OUT/f/sk-$b.txt" 2>&1; echo "sk-$b rc=$? t=$((SECONDS-T0))"; tail -2 "$OUT/f/sk-$b.txt"
done
for f in "$OUT"/f/t-*.txt "$OUT"/f/h-*.txt; do echo "== $(basename $f)"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$f" | cut -c1-120; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
