#!/usr/bin/env bash
# Round 17, call 1 (one H200): where the fused call's time goes, step by step, in cycles.
# `head` = the head's binary (built at 4f9143a, kernels unchanged since; sha256 32dc5cb5cf973906);
# `trace` = the head + trace.diff (an experiment, not merged): under TPAR_TEST_STAMPS=1 thread 0
# of every block of one-shot pull writes the SM's 32-bit %clock at 13 points of a call (each
# read after a store of the value it waits for) and %globaltimer at entry and end; the bench
# prints every block's raw words (`# raw`). Also: the SM clock during the head's bench
# (nvidia-smi sampling every 50 ms).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D
for b in head trace; do gunzip -c .gpu/r17a/tpar-$b.gz > $D/tpar-$b; chmod +x $D/tpar-$b; done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r17-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) head $(sha256sum $D/tpar-head | cut -c1-16) trace $(sha256sum $D/tpar-trace | cut -c1-16)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,clocks.applications.graphics,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
nvidia-smi -q -d CLOCK,PERFORMANCE > "$OUT/f/smi-q.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,clocks_event_reasons.active --format=csv -lms 50 > "$OUT/f/clocks.csv" 2>&1 &
SMI=$!
timeout 120 $D/tpar-head bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull > "$OUT/f/head.txt" 2>&1; echo "head rc=$? t=$((SECONDS-T0))"
kill $SMI 2>/dev/null; wait $SMI 2>/dev/null
TPAR_TEST_STAMPS=1 timeout 120 $D/tpar-trace bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 20 -w 3 --algo oneshot-pull > "$OUT/f/trace.txt" 2>&1; echo "trace rc=$? t=$((SECONDS-T0))"
TPAR_TEST_STAMPS=1 TPAR_FUSED_CLUSTER=0 timeout 60 $D/tpar-trace bench --fused --emulate-ranks 2 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 20 -w 3 --algo oneshot-pull > "$OUT/f/trace-nocluster.txt" 2>&1; echo "trace-nocluster rc=$? t=$((SECONDS-T0))"
TPAR_TEST_STAMPS=1 timeout 120 $D/tpar-trace bench --fused --emulate-ranks 2,8 -d bfloat16 --mode graph --hidden 7168 --rows 1 -n 20 -w 3 --algo oneshot-pull > "$OUT/f/trace2.txt" 2>&1; echo "trace2 rc=$? t=$((SECONDS-T0))"
for f in head trace; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# launches|^# [0-9]+ emulated" "$OUT/f/$f.txt" | cut -c1-160; done
grep -c "^# raw" "$OUT/f/trace.txt"
awk -F, 'NR>1{print $2}' "$OUT/f/clocks.csv" | sort | uniq -c | sort -rn | head -5
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f
