#!/usr/bin/env bash
# Round 17, call 3 (one H200): two more cuts at the cluster path's chain, against the head.
# trace = call 1's (head + trace.diff; untraced it runs the head's kernels). C = head +
# C.diff: trace.diff, and the cluster variant stores the updated residual after its tile's
# send instead of before its shuffles. CE = head + CE.diff: C, and the mbarrier wait
# acquires at CTA scope instead of cluster scope (no L1 invalidation after it; the tiles are
# read from this block's own shared memory). Timings alternate trace / C / CE twice
# (untraced), then traces of C and CE, then selftests of C and CE.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D
gunzip -c .gpu/r17a/tpar-trace.gz > $D/tpar-trace
for b in C CE; do gunzip -c .gpu/r17c/tpar-$b.gz > $D/tpar-$b; done
chmod +x $D/tpar-*
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r17-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in trace C CE; do echo -n "$b $(sha256sum $D/tpar-$b | cut -c1-16) "; done)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
for i in 1 2; do
  for b in trace C CE; do
    timeout 120 $D/tpar-$b bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/t-$b-$i.txt" 2>&1; echo "t-$b-$i rc=$? t=$((SECONDS-T0))"
  done
done
for b in C CE; do
  TPAR_TEST_STAMPS=1 timeout 120 $D/tpar-$b bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 20 -w 3 --algo oneshot-pull > "$OUT/f/trace-$b.txt" 2>&1; echo "trace-$b rc=$? t=$((SECONDS-T0))"
done
for b in C CE; do
  timeout 200 $D/tpar-$b selftest fused --emulate-ranks 8 -d all --hidden 1024,4096,7168,8192,16384 --rows 1,2,3,5,8,13,33,64 --seq-calls 24 > "$OUT/f/sf8-$b.txt" 2>&1; echo "sf8-$b rc=$? t=$((SECONDS-T0))"; tail -1 "$OUT/f/sf8-$b.txt"
  timeout 90 $D/tpar-$b selftest fused --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,4,8,9,64 --seq-calls 12 > "$OUT/f/sf24-$b.txt" 2>&1; echo "sf24-$b rc=$? t=$((SECONDS-T0))"; tail -1 "$OUT/f/sf24-$b.txt"
  timeout 60 $D/tpar-$b selftest fused --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8 --replays 3 --seq-calls 48 > "$OUT/f/sk-$b.txt" 2>&1; echo "sk-$b rc=$? t=$((SECONDS-T0))"; tail -1 "$OUT/f/sk-$b.txt"
done
for f in "$OUT"/f/t-*.txt; do echo "== $(basename $f)"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$f" | awk '/emulated/{w=$2; next} {printf "w%s %s x %s AR %s F %s f-AR %s\n", w, $1, $2, $5, $7, $13}'; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
