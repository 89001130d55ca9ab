#!/usr/bin/env bash
# Round 11, call 2: the grid of ranks that share a GPU. Call 1 found 4 emulated ranks at
# 256 KiB 0.9 us faster zero copy on 16 blocks than on the policy's 32 (3.92 vs 4.80 us):
# at 32 blocks the default variant cannot hold two grids of every rank (4 x 32 x 2 > 132
# SMs), so the launcher drops programmatic dependent launch (registered calls run the default
# variant) or runs the lean variant (copy calls). Here: every size where the policy's grid
# is larger than the most that holds twice (132 SMs / (2 x ranks): 33, 16, 8 blocks), the
# policy's grid against that cap, zero copy by the plan's rule (auto) and forced (1), the
# head binary of call 1 (tpar-new). Then the fused call at 8 ranks on 8 blocks.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r11
gunzip -c $C/tpar-new.gz > $D/new; chmod +x $D/new
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) new $(sha256sum $D/new | cut -c1-16)"
mkdir -p "$OUT/g"
for r in 2 4 8; do
  cap=$((132 / (2 * r))); [ $cap -gt 32 ] && cap=32
  for bl in auto $cap; do for zc in auto 1; do
    n=r$r-b$bl-zc$zc
    TPAR_BLOCKS=$bl TPAR_ZERO_COPY=$zc timeout 60 $D/new bench --mode graph -b 16K -e 16M -f 4 -d bfloat16 --sequence 122x43008 -n 20 -w 3 --emulate-ranks $r --algo oneshot-push,oneshot-pull,twoshot-pull > "$OUT/g/$n.txt" 2>&1
    echo "$n rc=$? t=$((SECONDS-T0))"
  done; done
done
FU=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 --algo oneshot-push,oneshot-pull)
for bl in auto 8; do TPAR_BLOCKS=$bl timeout 60 $D/new "${FU[@]}" > "$OUT/g/fused-b$bl.txt" 2>&1; echo "fused b$bl rc=$? t=$((SECONDS-T0))"; done
for f in "$OUT"/g/r*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n  %s ", $3} /^ +[0-9]+ +[0-9]+ +bfloat16/ {printf "%s=%s ", $1, $5} /^   graph +[a-z].*per call/ {printf "\n  step %s=%s ", $2, $(NF-3)}' "$f"; echo; done
for f in "$OUT"/g/fused*.txt; do echo "== $(basename $f .txt)"; grep -E "^ +7168" "$f"; done
cd "$OUT" && tar czf all.tgz g && rm -rf g
echo "end at $((SECONDS - T0)) s"
