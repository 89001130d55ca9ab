#!/usr/bin/env bash
# Round 11, call 1: (a) the pull copy paths without the canonical-form pass on their own
# input (no sentinel is polled in the pull region) and f16 packed by cvt.rn.f16x2.f32:
# tpar-old (head 9e52800) and tpar-new alternating, 2/4/8 emulated ranks, 16 KiB-4 MiB, bf16,
# graphs, vLLM's kernel in the same runs; (b) 4 ranks 256 KiB taken apart: blocks, lean
# variant, zero copy, and the landed TPAR_TEST_STAMPS; (c) the fused one-shot pull's phases
# (TPAR_TEST_STAMPS) and its cost with fewer blocks; (d) the new binary's correctness.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r11
gunzip -c $C/tpar-old.gz > $D/old; gunzip -c $C/tpar-new.gz > $D/new; chmod +x $D/old $D/new
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) old $(sha256sum $D/old | cut -c1-16) new $(sha256sum $D/new | cut -c1-16)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
bash bench/compare/vllm.sh build $C/vllm-src > /dev/null 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
mkdir -p "$OUT/t" "$OUT/s" "$OUT/f" "$OUT/c"
L=(bench --mode graph -b 16K -e 4M -f 4 -d bfloat16 --sequence 122x43008 -n 20 -w 3 --emulate-ranks 2,4,8 --algo oneshot-push,oneshot-pull,twoshot-push,twoshot-pull)
for i in 1 2; do for b in old new; do
  timeout 60 $D/$b "${L[@]}" --compare "vllm=$LIB" --json "$OUT/t/$b-$i.json" > "$OUT/t/$b-$i.txt" 2>&1; echo "$b-$i rc=$? t=$((SECONDS-T0))"
done; done
# (b) 4 ranks 256 KiB, new binary: blocks x zero copy (lean auto), lean forced off, stamps.
S=(bench --mode graph -b 256K -e 256K -d bfloat16 -n 30 -w 5 --emulate-ranks 4 --algo oneshot-pull,twoshot-pull)
for zc in 0 1; do for bl in 8 16 24 32 48 64; do
  TPAR_ZERO_COPY=$zc TPAR_BLOCKS=$bl timeout 30 $D/new "${S[@]}" > "$OUT/s/zc$zc-b$bl.txt" 2>&1
done; echo "sweep zc=$zc t=$((SECONDS-T0))"; done
for zc in 0 1; do for bl in 16 32; do TPAR_LEAN=0 TPAR_ZERO_COPY=$zc TPAR_BLOCKS=$bl timeout 30 $D/new "${S[@]}" > "$OUT/s/zc$zc-b$bl-lean0.txt" 2>&1; done; done
for zc in 0 1; do TPAR_TEST_STAMPS=1 TPAR_ZERO_COPY=$zc timeout 30 $D/new "${S[@]}" --compare "vllm=$LIB" > "$OUT/s/stamps-zc$zc.txt" 2>&1; echo "stamps zc=$zc rc=$? t=$((SECONDS-T0))"; done
TPAR_TEST_STAMPS=1 timeout 30 $D/new bench --mode graph -b 64K -e 1M -d bfloat16 -n 30 -w 5 --emulate-ranks 8 --algo oneshot-pull,twoshot-pull > "$OUT/s/stamps-8r.txt" 2>&1; echo "stamps 8r rc=$? t=$((SECONDS-T0))"
# (c) fused: every algorithm's fused call, then one-shot pull's phases, then fewer blocks.
FU=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5)
timeout 90 $D/new "${FU[@]}" > "$OUT/f/fused-all.txt" 2>&1; echo "fused all rc=$? t=$((SECONDS-T0))"
TPAR_TEST_STAMPS=1 timeout 60 $D/new "${FU[@]}" --algo oneshot-pull > "$OUT/f/fused-stamps.txt" 2>&1; echo "fused stamps rc=$? t=$((SECONDS-T0))"
for bl in 1 2 4; do TPAR_BLOCKS=$bl timeout 60 $D/new "${FU[@]}" --algo oneshot-pull > "$OUT/f/fused-b$bl.txt" 2>&1; done; echo "fused blocks t=$((SECONDS-T0))"
TPAR_TEST_STAMPS=1 TPAR_BLOCKS=1 timeout 60 $D/new "${FU[@]}" --algo oneshot-pull > "$OUT/f/fused-b1-stamps.txt" 2>&1
# (d) the new binary's correctness.
chk() { local name=$1; shift; env "$@" > "$OUT/c/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0)) $(grep -cE ' 0 wrong|PASS|passed' "$OUT/c/$name.txt") ok-lines, $(grep -cE '[1-9][0-9]* wrong|FAIL' "$OUT/c/$name.txt") bad-lines"; }
chk check timeout 90 $D/new check --emulate-ranks 2,3,8 -e 4M --calls 30 -d all --algo all
chk zc-oop TPAR_ZERO_COPY=1 timeout 60 $D/new selftest graph --emulate-ranks 2,8 --replays 3 --skew-ns 20000 --sequence 12x1M --scratch out-of-place -d all
chk copy-graph TPAR_ZERO_COPY=0 timeout 60 $D/new selftest graph --emulate-ranks 4,8 --replays 3 --skew-ns 20000 --sequence 12x256K --scratch -d all
chk fused timeout 60 $D/new selftest fused --emulate-ranks 8 -d bfloat16,half --hidden 4096,7168 --rows 1,3,8,33 --seq-calls 6
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; grep -E "^   graph  bfloat16" "$f" | awk 'NF>=10 {printf "%s:%s/%s=%s ", $3, $5, $6, $10} END {print ""}'; done
for f in "$OUT"/s/*.txt; do echo "== $(basename $f .txt) $(awk '/^# algorithm:/ {a=$3} /^ +262144 +131072/ {printf "%s=%s ", a, $5}' $f)"; done
grep -h "^# stamps\|stamps" "$OUT"/s/stamps-zc*.txt | head -40
for f in "$OUT"/f/*.txt; do echo "== $(basename $f .txt)"; grep -E "^ +7168|stamps|^#.*rank 0" "$f" | head -30 | cut -c1-200; done
cd "$OUT" && tar czf all.tgz t s f c && rm -rf t s f c
echo "end at $((SECONDS - T0)) s"
