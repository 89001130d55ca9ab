#!/usr/bin/env bash
# Round 10, call 5: what of one-shot's registered call grows with the bytes (2 ranks, timing
# only, unsafe variants): the end barrier removed, the start wait removed, the stores
# skipped, every load from the own input (call5-exp.diff on head 4538a4a); vLLM in each run.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar-exp4.gz > $D/x; chmod +x $D/x; X=$D/x
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) exp4 $(sha256sum $X | cut -c1-16)"
bash bench/compare/vllm.sh build $C/vllm-src > /dev/null 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
mkdir -p "$OUT/t"
L=(bench --mode graph -b 64K -e 4M -f 4 -d bfloat16 -n 30 -w 5 --algo oneshot-pull,twoshot-pull --compare "vllm=$LIB")
run() { local name=$1 ranks=$2; shift 2; env TPAR_ZERO_COPY=1 "$@" timeout 60 $X "${L[@]}" --emulate-ranks $ranks > "$OUT/t/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0))"; }
run base 2,4 TPAR_EXP_DEFINES=""
run noend 2,4 TPAR_EXP_DEFINES="-DTPAR_TEST_UNSAFE_NO_END_BARRIER"
run nostartwait 2,4 TPAR_EXP_DEFINES="-DEXP_NO_START_WAIT"
run nostore 2,4 TPAR_EXP_DEFINES="-DEXP_IO_NOSTORE"
run ownonly 2,4 TPAR_EXP_DEFINES="-DEXP_IO_OWNONLY"
run noend-nostart 2,4 TPAR_EXP_DEFINES="-DTPAR_TEST_UNSAFE_NO_END_BARRIER -DEXP_NO_START_WAIT"
run base-pdl0 2 TPAR_PDL=0 TPAR_EXP_DEFINES=""
run noend-nostart-pdl0 2 TPAR_PDL=0 TPAR_EXP_DEFINES="-DTPAR_TEST_UNSAFE_NO_END_BARRIER -DEXP_NO_START_WAIT"
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; done 2>/dev/null | grep -v "^$" | cut -c1-220
cd "$OUT" && tar czf t.tgz t && rm -rf t
echo "end at $((SECONDS - T0)) s"
