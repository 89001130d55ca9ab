#!/usr/bin/env bash
# Round 9, call 5: head 6ea01c9. The zero-copy skewed in-place graphs at 4 MiB (64 blocks a
# rank), which call 3 and call 4 cut at their 90 s / 30 s limits with every line so far
# 0 wrong: run whole, each line stamped with the wall clock, plus the 8-rank skewed check at 4 MiB.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; gunzip -c .gpu/c5/tpar.gz > $D/tpar; chmod +x $D/tpar; B=$D/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/c"
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $B | cut -c1-16)"
stamp() { while IFS= read -r l; do printf '[%5ds] %s\n' $((SECONDS - T0)) "$l"; done; }
TPAR_ZERO_COPY=1 TPAR_PDL=0 timeout 200 $B selftest graph --emulate-ranks 4 --replays 5 --skew-ns 20000 --sequence 24x4M --scratch -d bfloat16 2>&1 | stamp > "$OUT/c/zc-nopdl-4M.txt"; echo "zc-nopdl-4M rc=${PIPESTATUS[0]} t=$((SECONDS-T0))"
TPAR_ZERO_COPY=1 timeout 150 $B selftest graph --emulate-ranks 2,4 --replays 3 --skew-ns 20000 --sequence 8x16M --scratch -d bfloat16 2>&1 | stamp > "$OUT/c/zc-16M.txt"; echo "zc-16M rc=${PIPESTATUS[0]} t=$((SECONDS-T0))"
timeout 90 $B check --emulate-ranks 8 --calls 200 --skew-ns 20000 -e 4M -d bfloat16 --algo oneshot-pull,twoshot-push,twoshot-pull > "$OUT/c/check-skew-4M.txt" 2>&1; echo "check-skew-4M rc=$? t=$((SECONDS-T0))"
for f in "$OUT"/c/*.txt; do echo "== $(basename $f)"; grep -E "graph test|PASS|FAIL|error" "$f" | cut -c1-60,100-200 | tail -n 16; done
cd "$OUT" && tar czf all.tgz c && rm -rf c
