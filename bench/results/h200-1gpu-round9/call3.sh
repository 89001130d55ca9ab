#!/usr/bin/env bash
# Round 9, call 3: (1) where the registered (zero-copy) reduce's time goes (exp binary, 2 and
# 8 emulated ranks); (2) correctness of the new head (64 blocks a rank from 2 MiB, 8 loads in
# flight in the registered reduce, TparState 352 B, tile words from byte 512).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/c3
gunzip -c $C/tpar-exp64.gz > $D/x; gunzip -c $C/tpar.gz > $D/tpar; chmod +x $D/x $D/tpar; X=$D/x; B=$D/tpar
cp $C/whl/*.whl scripts/gpu_python_check.py $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/t" "$OUT/c" "$OUT/kern"
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $B | cut -c1-16) exp64-ablation $(sha256sum $X | cut -c1-16)"
bash bench/compare/vllm.sh build $C/vllm-src > "$OUT/t/nvcc.log" 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
L=(bench --mode graph -b 256K -e 16M -f 4 -d bfloat16 -n 20 -w 3 --emulate-ranks 2,8)
run() { local name=$1; shift; env TPAR_ZERO_COPY=1 "$@" timeout 60 $X "${L[@]}" --algo oneshot-pull,twoshot-pull --json "$OUT/t/$name.json" > "$OUT/t/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0))"; }
run base TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8"
run nostore TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8 -DEXP_IO_NOSTORE"
run ownonly TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8 -DEXP_IO_OWNONLY"
run simple TPAR_EXP_DEFINES="-DEXP_IO_SIMPLE"
run noend TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8 -DTPAR_TEST_UNSAFE_NO_END_BARRIER"
run base-b32 TPAR_BLOCKS=32 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8"
run nopdl TPAR_PDL=0 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8"
TPAR_ZERO_COPY=1 timeout 60 $X "${L[@]}" --algo oneshot-pull --compare "vllm=$LIB" > "$OUT/t/vllm.txt" 2>&1; echo "vllm rc=$? t=$((SECONDS-T0))"
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; done 2>/dev/null | grep -v "^$" | cut -c1-200
# -- correctness of the head
chk() { local name=$1 lim=$2; shift 2; env "$@" > "$OUT/c/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0)) $(grep -cE ' 0 wrong|PASS|passed' "$OUT/c/$name.txt") ok-lines, $(grep -cE '[1-9][0-9]* wrong|FAIL' "$OUT/c/$name.txt") bad-lines"; }
chk check-16M 120 timeout 120 $B check --emulate-ranks 2,3,8 -e 16M --calls 60 -d all --algo all
chk zc-skew-4M 90 TPAR_ZERO_COPY=1 timeout 90 $B selftest graph --emulate-ranks 2,4 --replays 5 --skew-ns 20000 --sequence 12x4M --scratch -d all
chk zc-skew-16M 60 timeout 60 $B selftest graph --emulate-ranks 2,8 --replays 3 --skew-ns 20000 --sequence 6x16M -d bfloat16
chk fused-8 120 timeout 120 $B selftest fused --emulate-ranks 8 -d all --hidden 1024,4096,7168,8192,16384 --rows 1,3,8,33,64 --seq-calls 12
chk fused-host 60 timeout 60 $B selftest fused --emulate-ranks 2,4 --transport host -d bfloat16,float --hidden 4096,7168 --rows 1,3,8,33 --seq-calls 12
chk fused-skew 60 timeout 60 $B selftest fused --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8 --replays 3 --seq-calls 48
LEFT=$((570 - (SECONDS - T0)))
echo "verify with BUDGET=$LEFT"
OUT="$OUT/kern" BUDGET=$LEFT ONLY="^(check-host|check-lean-forced|graph-skew|timeout|timeout-host|mismatch-emulated|epoch-wrap|procs-check|procs-kill|python-correct-4|python-deadeager-4)$" timeout $((LEFT + 10)) bash scripts/gpu-kernels.sh $D verify > "$OUT/kern/stdout.txt" 2>&1; echo "kernels verify rc=$?"
grep -v "not in ONLY" "$OUT/kern/summary.txt"
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz t c kern && rm -rf t c kern
