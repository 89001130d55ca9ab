#!/usr/bin/env bash
# Round 10, call 7: the reduce's arithmetic. Call 6's stamps showed one-shot's registered
# reduce growing with the vectors a thread sums whatever its loads in flight: bound by the
# instructions per vector (a software f32 -> bf16 rounding and a canonical-form pass on
# every load). The head (tpar-new) packs bf16 with cvt.rn.bf16x2.f32 and drops the canon
# pass on the registered path's loads; tpar-old is call 2's binary. Timings alternate old,
# new, old, new (2/4/8 emulated ranks, 16 KiB-4 MiB, graphs, bf16, plan picks and vLLM);
# then the new binary's correctness (check sweep, skewed zero-copy graphs, fused selftests).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar.gz > $D/old; gunzip -c $C/tpar-new.gz > $D/new; chmod +x $D/old $D/new
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) old $(sha256sum $D/old | cut -c1-16) new $(sha256sum $D/new | cut -c1-16)"
bash bench/compare/vllm.sh build $C/vllm-src > /dev/null 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
mkdir -p "$OUT/t" "$OUT/c"
L=(bench --mode graph -b 16K -e 4M -f 4 -d bfloat16 --sequence 122x43008 -n 20 -w 3 --emulate-ranks 2,4,8 --algo oneshot-push,oneshot-pull,twoshot-push,twoshot-pull)
for i in 1 2; do for b in old new; do
  timeout 60 $D/$b "${L[@]}" --compare "vllm=$LIB" --json "$OUT/t/$b-$i.json" > "$OUT/t/$b-$i.txt" 2>&1; echo "$b-$i rc=$? t=$((SECONDS-T0))"
done; done
chk() { local name=$1; shift; env "$@" > "$OUT/c/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0)) $(grep -cE ' 0 wrong|PASS|passed' "$OUT/c/$name.txt") ok-lines, $(grep -cE '[1-9][0-9]* wrong|FAIL' "$OUT/c/$name.txt") bad-lines"; }
chk check timeout 60 $D/new check --emulate-ranks 2,3,8 -e 4M --calls 30 -d all --algo all
chk zc-oop TPAR_ZERO_COPY=1 timeout 60 $D/new selftest graph --emulate-ranks 2,8 --replays 3 --skew-ns 20000 --sequence 12x1M --scratch out-of-place -d bfloat16
chk zc-inplace-all TPAR_ZERO_COPY=1 TPAR_PDL=0 timeout 40 $D/new selftest graph --emulate-ranks 4 --replays 3 --skew-ns 20000 --sequence 12x256K --scratch -d all
chk fused timeout 40 $D/new selftest fused --emulate-ranks 8 -d bfloat16,half --hidden 4096,7168 --rows 1,3,8,33 --seq-calls 6
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; grep -E "^   graph  bfloat16" "$f" | awk '{printf "%s:%s/%s=%s ", $3, $5, $6, $10} END {print ""}'; done
cd "$OUT" && tar czf all.tgz t c && rm -rf t c
echo "end at $((SECONDS - T0)) s"
