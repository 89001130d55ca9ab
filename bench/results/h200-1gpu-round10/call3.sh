#!/usr/bin/env bash
# Round 10, call 3: why one-shot pull's registered reduce moves bytes at half vLLM's one-stage
# rate (2 ranks, 256 KiB -> 1 MiB: +1.9 us against +0.95): loads in flight
# (TPAR_IO_SLOTS 2/4/8/16), the vLLM-like loop (EXP_IO_SIMPLE), blocks 32/36/64
# (call3-exp.diff on head 1b7ff04). Then the lines call 2's zc-graph-skew did not reach.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar.gz > $D/tpar; gunzip -c $C/tpar-exp2.gz > $D/x; chmod +x $D/tpar $D/x; X=$D/x
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) tpar $(sha256sum $D/tpar | cut -c1-16) exp2 $(sha256sum $X | cut -c1-16)"
mkdir -p "$OUT/t"
L=(bench --mode graph -b 256K -e 4M -f 4 -d bfloat16 -n 30 -w 5 --algo oneshot-pull,twoshot-pull)
run() { local name=$1 ranks=$2; shift 2; env TPAR_ZERO_COPY=1 "$@" timeout 60 $X "${L[@]}" --emulate-ranks $ranks > "$OUT/t/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0))"; }
run base 2,4,8 TPAR_EXP_DEFINES=""
run slots2 2,4,8 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=2"
run slots4 2,4,8 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=4"
run slots16 2,4 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=16"
run simple 2,4,8 TPAR_EXP_DEFINES="-DEXP_IO_SIMPLE"
run base-b36 2 TPAR_BLOCKS=36 TPAR_EXP_DEFINES=""
run simple-b36 2 TPAR_BLOCKS=36 TPAR_EXP_DEFINES="-DEXP_IO_SIMPLE"
run slots2-b36 2 TPAR_BLOCKS=36 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=2"
run base-b64 2 TPAR_BLOCKS=64 TPAR_EXP_DEFINES=""
run simple-b64 2 TPAR_BLOCKS=64 TPAR_EXP_DEFINES="-DEXP_IO_SIMPLE"
run slots4-b64 2 TPAR_BLOCKS=64 TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=4"
run base-b16 2,4,8 TPAR_BLOCKS=16 TPAR_EXP_DEFINES=""
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; done 2>/dev/null | grep -v "^$" | cut -c1-200
TPAR_ZERO_COPY=1 timeout 150 $D/tpar selftest graph --emulate-ranks 8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch -d bfloat16 > "$OUT/zc-graph-skew-8-bf16.txt" 2>&1; echo "zc-graph-skew-8-bf16 rc=$? t=$((SECONDS-T0))"; grep -c " 0 wrong" "$OUT/zc-graph-skew-8-bf16.txt"; tail -2 "$OUT/zc-graph-skew-8-bf16.txt"
cd "$OUT" && tar czf t.tgz t && rm -rf t
echo "end at $((SECONDS - T0)) s"
