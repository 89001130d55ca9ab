#!/usr/bin/env bash
# Issue 25, large messages: tpar's kernels beside vLLM's custom all-reduce on one H200
# (emulated ranks, CUDA graphs, bf16), with the correctness steps the zero-copy path
# (registered graph calls, tpar/kernels/io.cuh) needs. One `run` call; builds nothing but
# vLLM's library (nvcc, ~10 s, bench/compare/vllm.sh build).
#
#   OUT=... bash scripts/gpu-large.sh DIR final   the issue's "Done when" run (~7-8 min):
#       correctness (zero copy forced, skewed graphs in place and out of place on scratch
#       buffers, the guard removed must be caught in both, an eager check sweep), then 2/4/8 emulated ranks, 1 KiB-16 MiB
#       by x4, bf16, graphs, the 122 x 42 KiB step, every algorithm against vLLM,
#       TPAR_PDL=1 then TPAR_PDL=0 (the plan's pick in the table: h200-nvswitch-8)
#   OUT=... bash scripts/gpu-large.sh DIR dev     the development call: correctness, then the
#       same timings with zero copy forced on (TPAR_ZERO_COPY=1) and off (=0), PDL on and off
#   ONLY='regex'                                  only the steps whose names match
#
# DIR (carried, e.g. ".gpu/k") holds `tpar` (cargo build --release -p tpar-cli). vLLM's two
# headers must be in .gpu/vllm-src (bash bench/compare/vllm.sh fetch; carry it too).
# Writes $OUT/summary.txt, $OUT/compare.txt (every tpar-against-vLLM table), $OUT/large.log
# and one file per step; exit status nonzero if a step failed.
set -uo pipefail
D="${1:?usage: gpu-large.sh DIR final|dev}"
MODE="${2:?usage: gpu-large.sh DIR final|dev}"
# ROOT: the repository root (bench/compare/vllm.sh); the script may travel in a carried folder.
ROOT="${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
VSRC="${VLLM_SRC:-$ROOT/.gpu/vllm-src}"
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
B="$D/tpar"; LOG="$OUT/large.log"; : >"$LOG"; : >"$OUT/compare.txt"
[ -x "$B" ] || { echo "no release tpar at $B" >&2; exit 2; }
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
CACHE="$(mktemp -d)"; export XDG_CACHE_HOME="$CACHE/warm"
T0=$SECONDS; BUDGET=${BUDGET:-560}; summary=(); failed=0

# step NAME LIMIT [expect_fail] [ENV=V ...] -- CMD ARGS...   (as scripts/gpu-kernels.sh)
step() {
    local name="$1" limit="$2" expect=pass; shift 2
    [ "$1" = expect_fail ] && { expect=fail; shift; }
    local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local el=$((SECONDS - T0))
    if [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]]; then summary+=("SKIP  $name (not in ONLY)"); return; fi
    if [ $((el + limit / 3)) -gt "$BUDGET" ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
    echo "=== $name (t=${el}s): ${envs[*]:1} $*" >>"$LOG"
    local t=$SECONDS out="$OUT/step-$name.txt"
    env "${envs[@]}" timeout "$limit" "$@" >"$out" 2>&1; local rc=$?
    cat "$out" >>"$LOG"; echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
    if [ $expect = pass ]; then
        if [ $rc -eq 0 ]; then summary+=("PASS  $name ($((SECONDS - t)) s)"); else summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s): $(grep -m1 -i 'error\|fail' "$out")"); failed=1; fi
    elif grep -Eq "timed out after|[1-9][0-9]* wrong" "$out"; then
        summary+=("PASS  $name: caught as it must be, rc=$rc ($((SECONDS - t)) s)")
    else summary+=("FAIL  $name: not caught (rc=$rc, no wrong sum or timeout reported)"); failed=1; fi
    # Every comparison table of the step, with its command, for compare.txt.
    if grep -q '^# peer: ' "$out"; then
        { echo "=== $name: ${envs[*]:1} $*"; awk '/^# group: |^# tpar bench/ {s=0} /^# group: / {print} /^# peer: / {s=1} s' "$out"; echo; } >>"$OUT/compare.txt"
    fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  echo "tpar $(sha256sum "$B" | cut -c1-16)"; "$B" --version; } >>"$LOG" 2>&1

LIB="$ROOT/.gpu/vllm-build/libtpar_vllm_ar.so"
bash "$ROOT/bench/compare/vllm.sh" build "$VSRC" >"$OUT/nvcc.log" 2>&1 && [ -f "$LIB" ] \
    && summary+=("PASS  vllm-build") || { summary+=("FAIL  vllm-build (nvcc.log)"); failed=1; }
V=(--compare "vllm=$LIB")

# Correctness of the zero-copy path (forced at every size: TPAR_ZERO_COPY=1): skewed ranks in
# graphs, every call in place on a scratch buffer copied in and out around it (a rank that
# left while a peer still read its input or wrote its output gives wrong sums), odd counts
# (a partial last vector), every dtype, 2 and 8 ranks; the end barrier removed must be caught.
Z=TPAR_ZERO_COPY=1
step zc-graph-skew 240 $Z -- "$B" selftest graph --emulate-ranks 2,8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch -d all
step zc-graph-odd 40 $Z -- "$B" selftest graph --emulate-ranks 3,8 --replays 5 --skew-ns 20000 --sequence 61x43010 --scratch -d all
step zc-graph-42K 40 $Z -- "$B" selftest graph --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
step zc-graph-nopdl 90 $Z TPAR_PDL=0 -- "$B" selftest graph --emulate-ranks 4 --replays 5 --skew-ns 20000 --sequence 24x4M --scratch -d bfloat16
# Out of place between two scratch buffers: one-shot's registered path runs only out of place
# (its end barrier is the relaxed, reads-only one: the guard below must be caught there too).
step zc-graph-oop 120 $Z -- "$B" selftest graph --emulate-ranks 2,8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch out-of-place -d bfloat16
step zc-graph-oop-256K 60 $Z TPAR_PDL=0 -- "$B" selftest graph --emulate-ranks 4 --replays 5 --skew-ns 20000 --sequence 24x256K --scratch out-of-place -d all
step guard-zc-oop-no-end-barrier 40 expect_fail $Z TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_NO_END_BARRIER=1 XDG_CACHE_HOME="$CACHE/ne" -- "$B" selftest graph --emulate-ranks 8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch out-of-place -d bfloat16
step guard-zc-no-end-barrier 30 expect_fail $Z TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_NO_END_BARRIER=1 XDG_CACHE_HOME="$CACHE/ne" -- "$B" selftest graph --emulate-ranks 8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch -d bfloat16
step check 120 -- "$B" check --emulate-ranks 2,8 -e 4M --calls 30 -d all --algo oneshot-push,oneshot-pull,twoshot-push,twoshot-pull

MAIN=(bench --mode graph -b 1K -e 16M -f 4 -d bfloat16 --sequence 122x43008)
case "$MODE" in
dev)
    A=(--algo oneshot-push,oneshot-pull,twoshot-push,twoshot-pull)
    step zc1 120 TPAR_PDL=1 $Z -- "$B" "${MAIN[@]}" -n 20 -w 3 --emulate-ranks 2,4,8 "${A[@]}" "${V[@]}" --json "$OUT/zc1.json"
    step zc0 60 TPAR_PDL=1 TPAR_ZERO_COPY=0 -- "$B" "${MAIN[@]}" -n 20 -w 3 --emulate-ranks 2,4,8 --algo oneshot-pull,twoshot-pull --json "$OUT/zc0.json"
    step zc1-nopdl 120 TPAR_PDL=0 $Z -- "$B" "${MAIN[@]}" -n 20 -w 3 --emulate-ranks 2,4,8 "${A[@]}" "${V[@]}" --json "$OUT/zc1-nopdl.json"
    step zc0-nopdl 60 TPAR_PDL=0 TPAR_ZERO_COPY=0 -- "$B" "${MAIN[@]}" -n 20 -w 3 --emulate-ranks 2,4,8 --algo oneshot-pull,twoshot-pull --json "$OUT/zc0-nopdl.json"
    ;;
final)
    A=(--algo oneshot-push,oneshot-pull,twoshot-push,twoshot-pull)
    step pdl1 200 TPAR_PDL=1 -- "$B" "${MAIN[@]}" -n 30 -w 5 --emulate-ranks 2,4,8 "${A[@]}" "${V[@]}" --json "$OUT/pdl1.json"
    step pdl0 200 TPAR_PDL=0 -- "$B" "${MAIN[@]}" -n 30 -w 5 --emulate-ranks 2,4,8 "${A[@]}" "${V[@]}" --json "$OUT/pdl0.json"
    ;;
*) echo "unknown mode $MODE (final|dev)" >&2; exit 2 ;;
esac
printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
echo "total $((SECONDS - T0)) s" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"; echo; cat "$OUT/compare.txt"
gzip -kf "$LOG"
exit $failed
