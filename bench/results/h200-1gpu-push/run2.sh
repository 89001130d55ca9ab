#!/usr/bin/env bash
# Push-kernel fix, call 2: before / main / fix (call 1) / final timings, then the full correctness list on final.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-push; NEW=$D/tpar-final; FIX=$D/tpar-fix; MAIN=$D/tpar-main; OLD=$D/tpar-before
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/cache-push
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
summary=()
step() { local name="$1" limit="$2"; shift 2
    echo "=== $name: $*"; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?
    echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"
    summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc" )  $name ($((SECONDS - t0)) s)"); }
SEQ=(--emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16)
GR=(--emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K")
{
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
sha256sum $NEW $FIX $MAIN $OLD | cut -c1-16
echo "@@ before"; step seq-before 60 $OLD bench-cuda --emulate-ranks 2,4,8 --sequence 122x43008 -n 50 -w 5 -d bfloat16
echo "@@ main";   step seq-main 40 $MAIN bench "${SEQ[@]}"
echo "@@ fix";    step seq-fix 40 $FIX bench "${SEQ[@]}"
echo "@@ final";  step seq-final 40 $NEW bench "${SEQ[@]}"
echo "@@ final-again"; step seq-final2 40 $NEW bench "${SEQ[@]}"
step graph-before 40 $OLD bench-cuda --emulate-ranks 8 --graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K"
step graph-main 40 $MAIN bench "${GR[@]}"
step graph-final 40 $NEW bench "${GR[@]}"
# Correctness of final.
step check-emulated 90 $NEW check --emulate-ranks 2,3,4,8 -e 1M --calls 300 -d all --algo all
step check-host 30 $NEW check --emulate-ranks 2,8 --transport host -e 256K --calls 100 -d all
step stress 60 $NEW check --emulate-ranks 8 --calls 4000 -e 256K -d all --algo "$K"
step check-skew 40 $NEW check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step graph-skew 40 $NEW selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 5000 --sequence 122x42K -d all
step graph-test 40 $NEW selftest graph --emulate-ranks 8 --replays 50 --sequence 122x42K -d all
TPAR_TIMEOUT_MS=200 step timeout 30 $NEW selftest timeout --emulate-ranks 2,8
TPAR_TIMEOUT_MS=2000 step mismatch 40 $NEW selftest mismatch --emulate-ranks 2,8
step epoch-wrap 30 $NEW selftest epoch-wrap --emulate-ranks 4 --epoch-start 4294967290 -e 64K -d all
step ipc 30 $NEW selftest ipc -e 1M -n 10 -w 2 --graph-inner 5 -d bfloat16
TPAR_TIMEOUT_MS=2000 step procs-mismatch 30 $NEW selftest mismatch --world 4 --plan-topology h200-nvswitch-8
TPAR_TEST_UNSAFE_TWO_BUFFERS=1 XDG_CACHE_HOME=/tmp/cache-unsafe TPAR_TIMEOUT_MS=300 step unguarded-MUSTFAIL 40 $NEW selftest graph --emulate-ranks 2,8 --replays 50 --skew-ns 5000 --sequence 122x256K -d bfloat16
echo; echo "# ---- summary ----"; printf '%s\n' "${summary[@]}"
} > "$OUT/run2.log" 2>&1
python3 "$D/table.py" "$OUT/run2.log" > "$OUT/table.txt"
grep -E "tpar: error|PASS:|FAIL" "$OUT/run2.log" | grep -v "^ " | tail -40 > "$OUT/brief.txt"
cat "$OUT/brief.txt" | tail -15; cat "$OUT/table.txt"; printf '%s\n' "${summary[@]}"
