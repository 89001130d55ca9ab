#!/usr/bin/env bash
# Round 11, call 4: scripts/gpu-kernels.sh verify on the head of call 3 (.gpu/k11/tpar, the
# first_call example; no wheel: the Python steps are skipped), then the 4-rank 122 x 42 KiB
# step repeated and by blocks (call 3: 2.89 us against the issue's 2.86), then the fused
# calls on this head (issue 24's figures).
set -u
T0=$SECONDS; K=.gpu/k11
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/v" "$OUT/s"
OUT="$OUT/v" BUDGET=380 bash scripts/gpu-kernels.sh $K verify > "$OUT/v/stdout.txt" 2>&1; echo "verify rc=$? t=$((SECONDS-T0))"
ST=(bench --mode graph -b 43008 -e 43008 -d bfloat16 --sequence 122x43008 -n 30 -w 5 --emulate-ranks 4 --algo oneshot-push,oneshot-pull)
for i in 1 2 3; do timeout 30 $K/tpar "${ST[@]}" > "$OUT/s/auto-$i.txt" 2>&1; done
for bl in 8 11 16 21 32; do TPAR_BLOCKS=$bl timeout 30 $K/tpar "${ST[@]}" > "$OUT/s/b$bl.txt" 2>&1; done
echo "step sweep t=$((SECONDS-T0))"
timeout 60 $K/tpar bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-push,oneshot-pull > "$OUT/s/fused.txt" 2>&1; echo "fused rc=$? t=$((SECONDS-T0))"
grep -E "^(PASS|FAIL|SKIP)|total" "$OUT/v/summary.txt"
for f in "$OUT"/s/auto-*.txt "$OUT"/s/b*.txt; do echo "$(basename $f .txt) $(awk '/^   graph +[a-z].*per call/ {printf "%s=%s ", $2, $(NF-3)}' $f)"; done
grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +one" "$OUT/s/fused.txt"
cd "$OUT" && tar czf all.tgz v s && rm -rf v s
echo "end at $((SECONDS - T0)) s"
