#!/usr/bin/env bash
# The kernel work's GPU run, for one `run` call on the one-H200 machine (emulated ranks and
# rank processes sharing the GPU through CUDA IPC). Builds nothing.
#
#   scripts/gpu-kernels.sh NEW_BIN [OLD_BIN] [smoke|full]
#
# NEW_BIN / OLD_BIN are release `tpar` binaries built elsewhere (OLD_BIN: the "before" build,
# timed in the same run). Writes every step's output to $OUT/kernels.log, the timing steps
# also to $OUT/<step>.txt, and prints a summary last; exit status nonzero if a step failed.
set -uo pipefail
NEW="${1:?new binary}"
OLD="${2:-}"
MODE="${3:-full}"
# skew: only the skewed-rank checks (guarded must pass, unguarded must be caught) and one timing
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/kernels.log"
: >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
CACHE="$(mktemp -d)"
export XDG_CACHE_HOME="$CACHE/warm"
summary=()
failed=0
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"

# step NAME LIMIT [ENV=V ...] -- BIN ARGS...   (expect success)
step() {
    local name="$1" limit="$2"
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    echo "=== $name: ${envs[*]} $*" | tee -a "$LOG"
    local t0 t1 rc
    t0=$(date +%s%N)
    env "${envs[@]}" timeout "$limit" "$@" >"$OUT/.step" 2>&1
    rc=$?
    t1=$(date +%s%N)
    cat "$OUT/.step" >>"$LOG"
    local secs="$(( (t1 - t0) / 1000000 ))e-3"
    echo "=== $name: rc=$rc in ${secs}s" | tee -a "$LOG"
    if [ "$rc" -eq 0 ]; then summary+=("PASS  $name (${secs}s)"); else summary+=("FAIL  $name rc=$rc (${secs}s)"); failed=1; fi
    return 0
}
# expect_fail NAME LIMIT ... : the guard-removed demonstration must FAIL (wrong or timeout).
expect_fail() {
    local name="$1"
    step "$@"
    local last="${summary[-1]}"
    if [[ "$last" == FAIL* ]]; then summary[-1]="PASS  $name: caught as expected (${last#FAIL  $name })"; failed=$((failed)); else summary[-1]="FAIL  $name: the unguarded kernels passed the skew stress"; failed=1; fi
    # the step above set failed=1 on its expected failure: recompute from the summary
    failed=0; for s in "${summary[@]}"; do [[ "$s" == FAIL* ]] && failed=1; done
}

{
    echo "# date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    echo "# new: $(sha256sum "$NEW" | cut -c1-16)  old: ${OLD:+$(sha256sum "$OLD" | cut -c1-16)}"
} 2>&1 | tee -a "$LOG"

# First call on a fresh machine: an empty cache, a whole process (8 ranks, one all-reduce of
# 42 KiB bf16, checked); then the same with the cache warm.
step first-call-cold 120 XDG_CACHE_HOME="$CACHE/cold" -- "$NEW" bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push
step first-call-warm 60 XDG_CACHE_HOME="$CACHE/cold" -- "$NEW" bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push
step first-call-corrupt 60 XDG_CACHE_HOME="$CACHE/cold" -- bash -c "for f in $CACHE/cold/tpar/*.cubin; do printf garbage | dd of=\$f bs=1 seek=100 conv=notrunc 2>/dev/null; done; $NEW bench --emulate-ranks 8 -b 42K -e 42K -n 1 -w 0 -d bfloat16 --algo oneshot-push"
step cache-8-procs 120 XDG_CACHE_HOME="$CACHE/par" -- bash -c "for i in 0 1 2 3 4 5 6 7; do $NEW check --emulate-ranks 2 -e 64K --calls 0 -d all --algo $K >/dev/null 2>&1 & done; wait; ls -la $CACHE/par/tpar | grep -c cubin; ls -a $CACHE/par/tpar | grep -c tmp || true"

if [ "$MODE" = skew ]; then
    step skew-stress 240 -- "$NEW" check --emulate-ranks 8 --calls 3000 --skew-ns 20000 -e 256K -d all --algo "$K"
    step skew-graph 240 -- "$NEW" selftest graph --emulate-ranks 2,8 --replays 50 --skew-ns 5000 --sequence 122x256K -d all
    expect_fail unguarded-skew 200 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 XDG_CACHE_HOME="$CACHE/unsafe" -- bash -c "TPAR_TIMEOUT_MS=300 $NEW selftest graph --emulate-ranks 2,8 --replays 50 --skew-ns 5000 --sequence 122x256K -d bfloat16"
    # the flag protocol's guard (host transport): one buffer must be caught (wrong sums)
    expect_fail unguarded-flags-skew 60 TPAR_TEST_UNSAFE_ONE_BUFFER=1 XDG_CACHE_HOME="$CACHE/unsafe1" -- bash -c "TPAR_TIMEOUT_MS=500 $NEW selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16"
    step seq-new 240 -- "$NEW" bench --emulate-ranks 8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16
    for s in "${summary[@]}"; do echo "$s"; done | tee "$OUT/summary.txt"
    exit "$failed"
fi
if [ "$MODE" = smoke ]; then
    step sweep 240 -- "$NEW" check --emulate-ranks 2,3,8 -e 1M --calls 0 -d all --algo "$K"
else
    step sweep 400 -- "$NEW" check --emulate-ranks 2,3,4,8 -e 8M --calls 0 -d all --algo "$K"
    step epoch-wrap 120 -- "$NEW" selftest epoch-wrap --emulate-ranks 4 --epoch-start 4294967290 -e 64K -d all
    step host-check 180 -- "$NEW" check --emulate-ranks 2,8 --transport host -e 1M --calls 200 -d all
fi
step stress 240 -- "$NEW" check --emulate-ranks 8 --calls 4000 -e 256K -d all --algo "$K"
step skew-stress 240 -- "$NEW" check --emulate-ranks 8 --calls 3000 --skew-ns 20000 -e 256K -d all --algo "$K"
step skew-graph 240 -- "$NEW" selftest graph --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
step skew-graph-nopdl 240 TPAR_PDL=0 -- "$NEW" selftest graph --emulate-ranks 4 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
expect_fail unguarded-skew 200 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 XDG_CACHE_HOME="$CACHE/unsafe" -- bash -c "TPAR_TIMEOUT_MS=300 $NEW check --emulate-ranks 2,8 --calls 5000 --skew-ns 20000 -e 1M -d bfloat16 --algo oneshot-push,twoshot-push,staged-push && TPAR_TIMEOUT_MS=300 $NEW selftest graph --emulate-ranks 2,8 --replays 50 --skew-ns 5000 --sequence 122x256K -d bfloat16"
expect_fail unguarded-flags-skew 60 TPAR_TEST_UNSAFE_ONE_BUFFER=1 XDG_CACHE_HOME="$CACHE/unsafe1" -- bash -c "TPAR_TIMEOUT_MS=500 $NEW selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16"
step timeout-test 120 TPAR_TIMEOUT_MS=200 -- "$NEW" selftest timeout --emulate-ranks 2,8
step timeout-env 60 TPAR_TIMEOUT_MS=300 -- "$NEW" selftest timeout --emulate-ranks 4
step mismatch-test 120 TPAR_TIMEOUT_MS=2000 -- "$NEW" selftest mismatch --emulate-ranks 2,8
step graph-test 180 -- "$NEW" selftest graph --emulate-ranks 8 --replays 50 --sequence 122x42K -d all
step ipc-test 120 -- "$NEW" selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d bfloat16

# Timings: before (OLD) and after (NEW), same machine, same call.
# NEW speaks the subcommand CLI; OLD (a build of 9819435) the bench-cuda one.
seqargs=(bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16)
grargs=(bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K")
step seq-new 240 -- "$NEW" "${seqargs[@]}"; cp "$OUT/.step" "$OUT/seq-new.txt"
step seq-new-nopdl 240 TPAR_PDL=0 -- "$NEW" bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16; cp "$OUT/.step" "$OUT/seq-nopdl.txt"
step graph-new 240 -- "$NEW" "${grargs[@]}"; cp "$OUT/.step" "$OUT/graph-new.txt"
step blocks-env 120 TPAR_BLOCKS=2 -- "$NEW" bench --emulate-ranks 8 --mode graph -b 1M -e 1M -n 50 -w 5 -d bfloat16 --algo oneshot-push,twoshot-push
step blocks-env16 120 TPAR_BLOCKS=16 -- "$NEW" bench --emulate-ranks 8 --mode graph -b 1M -e 1M -n 50 -w 5 -d bfloat16 --algo oneshot-push,twoshot-push
if [ -n "$OLD" ]; then
    step seq-old 240 -- "$OLD" bench-cuda --emulate-ranks 2,4,8 --sequence 122x43008 -n 50 -w 5 -d bfloat16; cp "$OUT/.step" "$OUT/seq-old.txt"
    step graph-old 240 -- "$OLD" bench-cuda --emulate-ranks 8 --graph -b 1K -e 4M -f 4 -n 100 -w 10 -d bfloat16 --algo "$K"; cp "$OUT/.step" "$OUT/graph-old.txt"
fi
rm -f "$OUT/.step"
gzip -kf "$LOG"
{
    echo
    echo "# ---- per call in the 122-call graph, 42 KiB bf16 (us): new | old ----"
    for f in seq-new seq-nopdl seq-old; do [ -e "$OUT/$f.txt" ] && { echo "## $f"; grep -E "ranks|floor|push|pull" "$OUT/$f.txt" | grep -v "^# group" | awk '{ if ($1 ~ /^#/) print; else printf "%16s %9s\n", $1, $6 }'; }; done
    echo "# ---- 8 ranks graph: bytes algo time(us) ----"
    for f in graph-new graph-old; do [ -e "$OUT/$f.txt" ] && { echo "## $f"; awk '/^# algorithm/ {a=$3} /^ +[0-9]/ { if ($1==1024 || $1==65536 || $1==1048576 || $1==4194304) printf "%8s %-14s %8s\n", $1, a, $5 } /launch floor/ {print}' "$OUT/$f.txt"; }; done
    echo "# ---- summary ($MODE) ----"
    for s in "${summary[@]}"; do echo "$s"; done
} | tee "$OUT/summary.txt"
exit "$failed"
