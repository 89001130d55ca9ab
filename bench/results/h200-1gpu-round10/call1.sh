#!/usr/bin/env bash
# Round 10, call 1: the registered (zero-copy) path's barriers. Variants of head 282c94d
# (call1-exp.diff, selected by TPAR_EXP_DEFINES): the start barrier relaxed (volatile flag,
# volatile polls: vLLM's barrier_at_start), one-shot's end barrier relaxed (it reads peers'
# inputs and writes only its own output: vLLM's final_sync), both; blocks 32/48/64; vLLM's
# kernel in every run. Then correctness of the variant with both (skewed graphs).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar-exp.gz > $D/x; chmod +x $D/x; X=$D/x
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/t" "$OUT/c"
echo "## $(date -u +%FT%TZ) exp $(sha256sum $X | cut -c1-16) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
bash bench/compare/vllm.sh build $C/vllm-src > "$OUT/t/nvcc.log" 2>&1; echo "vllm build rc=$? t=$((SECONDS-T0))"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
L=(bench --mode graph -b 256K -e 4M -f 4 -d bfloat16 -n 30 -w 5 --algo oneshot-pull,twoshot-pull --compare "vllm=$LIB")
run() { local name=$1 ranks=$2; shift 2; env TPAR_ZERO_COPY=1 "$@" timeout 90 $X "${L[@]}" --emulate-ranks $ranks --json "$OUT/t/$name.json" > "$OUT/t/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0))"; }
S="-DEXP_ZC_START_RELAXED"; E="-DEXP_ZC_END_RELAXED"
run base 2,4,8 TPAR_EXP_DEFINES=""
run start 2,4,8 TPAR_EXP_DEFINES="$S"
run end 2,4,8 TPAR_EXP_DEFINES="$E"
run both 2,4,8 TPAR_EXP_DEFINES="$S $E"
run both-b48 2,4 TPAR_BLOCKS=48 TPAR_EXP_DEFINES="$S $E"
run both-b64 2,4 TPAR_BLOCKS=64 TPAR_EXP_DEFINES="$S $E"
run end-b64 2,4 TPAR_BLOCKS=64 TPAR_EXP_DEFINES="$E"
run both-pdl0 2,4,8 TPAR_PDL=0 TPAR_EXP_DEFINES="$S $E"
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; done 2>/dev/null | grep -v "^$" | cut -c1-200
# -- correctness of both relaxations: skewed ranks, graphs, every dtype, zero copy forced
chk() { local name=$1; shift; env "$@" > "$OUT/c/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0)) $(grep -cE ' 0 wrong|PASS|passed' "$OUT/c/$name.txt") ok-lines, $(grep -cE '[1-9][0-9]* wrong|FAIL' "$OUT/c/$name.txt") bad-lines"; }
chk zc-oop-1M TPAR_ZERO_COPY=1 TPAR_EXP_DEFINES="$S $E" timeout 120 $X selftest graph --emulate-ranks 2,8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch out-of-place -d bfloat16
chk zc-oop-256K-pdl0 TPAR_ZERO_COPY=1 TPAR_PDL=0 TPAR_EXP_DEFINES="$S $E" timeout 60 $X selftest graph --emulate-ranks 4 --replays 5 --skew-ns 20000 --sequence 24x256K --scratch out-of-place -d all
chk zc-inplace-1M TPAR_ZERO_COPY=1 TPAR_EXP_DEFINES="$S $E" timeout 90 $X selftest graph --emulate-ranks 2,8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch -d bfloat16
chk zc-42K TPAR_ZERO_COPY=1 TPAR_EXP_DEFINES="$S $E" timeout 60 $X selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
# the guard: without the end barrier the out-of-place test must see wrong sums (expected to fail)
chk guard-oop-no-end TPAR_ZERO_COPY=1 TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_NO_END_BARRIER=1 TPAR_ALGO=oneshot-pull timeout 60 $X selftest graph --emulate-ranks 8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch out-of-place -d bfloat16
echo "end at $((SECONDS - T0)) s"
