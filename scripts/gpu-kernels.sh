#!/usr/bin/env bash
# The kernel work's GPU run on the one-H200 machine (emulated ranks, and rank processes sharing
# the GPU through CUDA IPC or one host segment), one `run` call per mode. Builds nothing.
#
#   OUT=... bash scripts/gpu-kernels.sh DIR timings   issue 11's targets, before and after (~5 min)
#   OUT=... bash scripts/gpu-kernels.sh DIR verify    every correctness step (~4-6 min)
#   OUT=... bash scripts/gpu-kernels.sh DIR python    only verify's Python steps (~2 min)
#   OUT=... bash scripts/gpu-kernels.sh DIR ab        the head against tpar-before, alternating
#                                                     REPS times (default 3): 2/4/8 emulated ranks,
#                                                     1 KiB-16 MiB and 122 x 42 KiB, graph and eager
#                                                     (~1.5 min; raw tables in $OUT/ab.txt;
#                                                     AB_TABLES="eager" etc.: some of sweep, seq, eager;
#                                                     AB_RANKS (2,4,8), AB_MAX (the sweep's -e, 16M))
#   OUT=... bash scripts/gpu-kernels.sh DIR collectives   all-gather and reduce-scatter: tpar check
#                                                     on emulated ranks (p2p and host, ~10^5
#                                                     random calls) and rank processes; the
#                                                     skewed graph test of one captured sequence
#                                                     alternating all-reduce, all-gather and
#                                                     reduce-scatter (copy and registered paths,
#                                                     the two guards removed must be caught);
#                                                     graph timings at 2/4/8 ranks beside the
#                                                     all-reduce of the same per-rank bytes
#                                                     ($OUT/*.json) (~6 min; more than one call
#                                                     with the graph tests: ONLY='mixed|guard'
#                                                     runs those alone)
#   ONLY='regex' ...                                   only the steps whose names match
#
# DIR (carried with `run`'s carry, e.g. ".gpu-k") holds what was built here:
#   tpar          release `tpar` of the head under test      (cargo build --release -p tpar-cli)
#   tpar-before   optional: the same of the commit to compare against (timings, same call)
#   first_call    optional: tpar/examples/first_call.rs      (cargo build --release -p tpar
#                 --features cuda --example first_call; target/release/examples/first_call)
#   *.whl, gpu_python_check.py   optional: the Python steps of verify (maturin build --release;
#                 scripts/gpu_python_check.py)
# Emulated ranks share one GPU: their timings are kernel cost, not a fabric (docs/cuda.md).
# Writes $OUT/summary.txt (PASS/FAIL/SKIP per step; timings: targets.txt beside it, the
# figures issue 11 names, extracted by scripts/kernel-targets.awk) and the gzipped log.
# Exit status nonzero if a step failed.
set -uo pipefail
D="${1:?usage: gpu-kernels.sh DIR timings|verify|python|ab|collectives}"
MODE="${2:?usage: gpu-kernels.sh DIR timings|verify|python|ab|collectives}"
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
B="$D/tpar"; OLD="$D/tpar-before"; LOG="$OUT/kernels-$MODE.log"; : >"$LOG"
[ -x "$B" ] || { echo "no release tpar at $B" >&2; exit 2; }
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
CACHE="$(mktemp -d)"; export XDG_CACHE_HOME="$CACHE/warm"
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push,hierarchical"
T0=$SECONDS; BUDGET=${BUDGET:-540}; summary=(); failed=0

# step NAME LIMIT [expect_fail] [ENV=V ...] -- CMD ARGS...
# A step that would start with less than a third of its limit left in BUDGET is skipped (and
# said so): the call must end inside the device's 10-minute limit with its summary written.
step() {
    local name="$1" limit="$2" expect=pass; shift 2
    [ "$1" = expect_fail ] && { expect=fail; shift; }
    local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local el=$((SECONDS - T0))
    # ONLY (an extended regex over step names) runs a subset, e.g. after a change that a few
    # steps cover; the others are listed as filtered.
    if [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]]; then summary+=("SKIP  $name (not in ONLY)"); return; fi
    if [ $((el + limit / 3)) -gt "$BUDGET" ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
    echo "=== $name (t=${el}s): ${envs[*]} $*" >>"$LOG"
    local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >"$CACHE/step" 2>&1; local rc=$?
    cat "$CACHE/step" >>"$LOG"
    echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
    if [ $expect = pass ]; then
        if [ $rc -eq 0 ]; then summary+=("PASS  $name ($((SECONDS - t)) s)"); else summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s)"); failed=1; fi
    # A guard removed must be caught by the check itself (wrong sums or a device timeout),
    # not fail for any other reason (no GPU, a bad flag).
    elif grep -Eq "timed out after|[1-9][0-9]* wrong" "$CACHE/step"; then
        summary+=("PASS  $name: caught as it must be, rc=$rc ($((SECONDS - t)) s)")
    else summary+=("FAIL  $name: not caught (rc=$rc, no wrong sum or timeout reported)"); failed=1; fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "tpar $(sha256sum "$B" | cut -c1-16)$( [ -x "$OLD" ] && echo " before $(sha256sum "$OLD" | cut -c1-16)")"; "$B" --version; } >>"$LOG" 2>&1

# Python (tpar.torch), rank processes sharing the GPU: the wheel installed into a scratch
# site, eager calls and a 122-call graph on p2p and over host, a mismatched capture.
python_steps() {
    local whl; whl=$(ls "$D"/tpar-*.whl 2>/dev/null | head -1)
    if [ -z "$whl" ] || [ ! -e "$D/gpu_python_check.py" ]; then
        summary+=("SKIP  python (no wheel or gpu_python_check.py in $D)"); return
    fi
    local SITE="$CACHE/site"; mkdir -p "$CACHE/py"
    python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$whl" >>"$LOG" 2>&1
    local PYENV=(PYTHONPATH="$SITE" TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TIMEOUT_MS=10000 TPAR_ALGO=oneshot-push DEADLINE_S=60)
    step python-correct-4 70 "${PYENV[@]}" -- python3 "$D/gpu_python_check.py" 4 correct --out "$CACHE/py"
    step python-host-4 60 "${PYENV[@]}" TPAR_TOPOLOGY=rtx4090-nop2p-4 -- python3 "$D/gpu_python_check.py" 4 correct --out "$CACHE/py"
    step python-gmismatch-4 40 "${PYENV[@]}" -- python3 "$D/gpu_python_check.py" 4 gmismatch --out "$CACHE/py"
    step python-thread-2 40 "${PYENV[@]}" -- python3 "$D/gpu_python_check.py" 2 thread --out "$CACHE/py"
    step python-collectives-4 60 "${PYENV[@]}" -- python3 "$D/gpu_python_check.py" 4 collectives --out "$CACHE/py"
    step python-collectives-host-3 60 "${PYENV[@]}" TPAR_TOPOLOGY=rtx4090-nop2p-4 -- python3 "$D/gpu_python_check.py" 3 collectives --out "$CACHE/py"
    # A rank killed mid-step: the others raise PeerDiedError naming it within 1 s, never
    # calling check() (deadsync: while blocked in a host synchronisation).
    step python-deadeager-4 40 "${PYENV[@]}" TPAR_TIMEOUT_MS=30000 -- python3 "$D/gpu_python_check.py" 4 deadeager --out "$CACHE/py"
    step python-deadsync-4 40 "${PYENV[@]}" TPAR_TIMEOUT_MS=30000 -- python3 "$D/gpu_python_check.py" 4 deadsync --out "$CACHE/py"
}

case "$MODE" in
timings)
    # Before and after in one call, same machine; each timing step's lines go to targets.txt.
    SEQ=(bench --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$K")
    SZ=(bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 40 -w 5 -d bfloat16 --algo "$K")
    HS=(bench --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push)
    if [ -x "$D/first_call" ]; then
        # First in the call: an empty cache (on a machine that just started, libnvrtc itself is
        # not yet in the page cache either: the fresh-machine figure is the first call's
        # first step), then warm; then every cache entry corrupted (rebuilt, never trusted);
        # then eight processes filling one empty cache at once.
        step first-call-cold 60 XDG_CACHE_HOME="$CACHE/cold" -- "$D/first_call"
        step first-call-warm 30 XDG_CACHE_HOME="$CACHE/cold" -- "$D/first_call"
        step first-call-corrupt 60 -- bash -c "for f in $CACHE/cold/tpar/*; do printf garbage | dd of=\$f bs=1 seek=100 conv=notrunc 2>/dev/null; done; XDG_CACHE_HOME=$CACHE/cold $D/first_call"
        step cache-8-procs 90 XDG_CACHE_HOME="$CACHE/par" -- bash -c "pids=(); for i in 0 1 2 3 4 5 6 7; do $D/first_call & pids+=(\$!); done; rc=0; for p in \${pids[@]}; do wait \$p || rc=1; done; exit \$rc"
    else
        summary+=("SKIP  first-call (no $D/first_call)")
    fi
    for who in after before; do
        bin=$B; [ $who = before ] && bin=$OLD
        [ -x "$bin" ] || continue
        step "seq-$who" 60 -- "$bin" "${SEQ[@]}" --emulate-ranks 2,4,8
        step "sizes-$who" 60 -- "$bin" "${SZ[@]}"
        step "host-$who" 40 -- "$bin" "${HS[@]}" --emulate-ranks 3,4,8
        step "small-$who" 40 -- "$bin" bench --emulate-ranks 2,4,8 --mode graph -b 1K -e 1K -n 40 -w 5 -d bfloat16 --algo "$K"
    done
    step seq-16-after 60 -- "$B" "${SEQ[@]}" --emulate-ranks 16
    awk '/^=== (seq|sizes|small|host|first-call|cache)/ {s=1} /^=== / && !/^=== (seq|sizes|small|host|first-call|cache)/ {s=0} s' "$LOG" >"$OUT/timings.txt"
    awk -f "$HERE/kernel-targets.awk" "$OUT/timings.txt" >"$OUT/targets.txt"
    ;;
verify)
    # -- emulated ranks (streams of one process) --
    step check-emulated 90 -- "$B" check --emulate-ranks 2,3,8 -e 4M --calls 200 -d all --algo all
    step check-16 60 -- "$B" check --emulate-ranks 16 -e 1M --calls 50 -d all --algo "$K"
    step check-lean-forced 40 TPAR_LEAN=1 -- "$B" check --emulate-ranks 2,8 -e 1M --calls 100 -d all --algo oneshot-pull,twoshot-push,twoshot-pull
    step check-lean-host 40 TPAR_LEAN=1 -- "$B" check --emulate-ranks 2,4 --transport host -e 1M --calls 60 -d all --algo twoshot-push
    step check-islands 30 -- "$B" check --emulate-ranks 6,8 --islands map:012012,3+5 -e 256K --calls 100 -d all --algo hierarchical
    step check-host 60 -- "$B" check --emulate-ranks 2,3,4,8 --transport host -e 1M --calls 100 -d all
    step check-skew 60 -- "$B" check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
    step check-skew-4M 60 -- "$B" check --emulate-ranks 8 --calls 200 --skew-ns 20000 -e 4M -d bfloat16 --algo oneshot-pull,twoshot-push,twoshot-pull
    step graph-skew 90 -- "$B" selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
    step graph-skew-host 90 -- "$B" selftest graph --emulate-ranks 2,3,4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d all
    step graph-skew-nopdl 25 TPAR_PDL=0 -- "$B" selftest graph --emulate-ranks 4 --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
    # The guards removed: the skewed graphs must fail (wrong sums or a timeout).
    step guard-sentinel-2buf 20 expect_fail TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 XDG_CACHE_HOME="$CACHE/u2" -- "$B" selftest graph --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
    step guard-flags-1buf 20 expect_fail TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_ONE_BUFFER=1 XDG_CACHE_HOME="$CACHE/u1" -- "$B" selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
    step timeout 30 TPAR_TIMEOUT_MS=200 -- "$B" selftest timeout --emulate-ranks 2,8
    step timeout-host 20 TPAR_TIMEOUT_MS=200 -- "$B" selftest timeout --emulate-ranks 4 --transport host
    step mismatch-emulated 30 TPAR_TIMEOUT_MS=2000 -- "$B" selftest mismatch --emulate-ranks 2,8
    step mismatch-host 25 TPAR_TIMEOUT_MS=2000 -- "$B" selftest mismatch --emulate-ranks 4 --transport host
    step epoch-wrap 20 -- "$B" selftest epoch-wrap --emulate-ranks 3,4 --epoch-start 4294967290 -e 4M -d all
    step epoch-wrap-host 15 -- "$B" selftest epoch-wrap --emulate-ranks 3 --transport host --epoch-start 4294967290 -e 64K -d all
    # -- rank processes sharing the GPU (CUDA IPC; one shared host segment) --
    step procs-check 90 -- "$B" check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
    step procs-check-lean 40 TPAR_LEAN=1 -- "$B" check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-pull,twoshot-push,twoshot-pull
    step procs-host 50 -- "$B" check --backend cuda --world 4 --transport host --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-push,twoshot-push
    step procs-host-plan 40 -- "$B" check --backend cuda --world 4 --plan-topology rtx4090-nop2p-4 -e 32K --calls 100 -d all --algo auto
    step procs-mismatch 40 TPAR_TIMEOUT_MS=3000 -- "$B" selftest mismatch --world 4 --plan-topology h200-nvswitch-8
    step procs-kill 40 TPAR_TIMEOUT_MS=3000 -- "$B" selftest kill-rank --world 4 --plan-topology h200-nvswitch-8 -e 42K
    python_steps
    ;;
python) python_steps ;;
collectives)
    # Both of tpar's kernels for them over p2p (one-shot pull reads peers: not over host).
    for c in all-gather reduce-scatter; do
        step "$c-emulated-p2p" 150 -- "$B" check --emulate-ranks 2,3,4,8 --collective $c -e 4M --calls 10000 -d all --algo oneshot-push,oneshot-pull --quiet
        step "$c-emulated-16" 60 -- "$B" check --emulate-ranks 16 --collective $c -e 4M --calls 1000 -d all --algo oneshot-push,oneshot-pull --quiet
        step "$c-emulated-host" 90 -- "$B" check --emulate-ranks 2,3,8 --transport host --collective $c -e 1M --calls 3000 -d all --algo oneshot-push --quiet
        step "$c-emulated-skew" 60 -- "$B" check --emulate-ranks 8 --skew-ns 20000 --collective $c -e 256K --calls 1000 -d bfloat16 --algo oneshot-push,oneshot-pull --quiet
        step "$c-procs-p2p-4" 90 -- "$B" check --backend cuda --world 4 --plan-topology h200-nvswitch-8 --collective $c -e 1M --calls 300 -d all --quiet
        step "$c-procs-host-3" 90 -- "$B" check --backend cuda --world 3 --plan-topology h200-nvswitch-8 --transport host --collective $c -e 256K --calls 200 -d all --quiet
    done
    # One graph alternating the three collectives (one-shot push and pull for the all-gather
    # and reduce-scatter; those and two-shot pull for the all-reduce), skewed ranks, fresh
    # inputs and poisoned outputs before every replay, every call judged bit for bit. The copy
    # path (TPAR_ZERO_COPY=0), small and large parts; the registered path by size (one-shot
    # pull from 256 KiB per rank: 4M / 8 ranks) and forced, out of place between scratch
    # buffers copied in and out (a rank that leaves while a peer still reads its input shows
    # as wrong sums); over host (one-shot push).
    MIX=(selftest graph --collective all-reduce,all-gather,reduce-scatter --skew-ns 20000)
    step mixed-graph-copy 90 TPAR_ZERO_COPY=0 -- "$B" "${MIX[@]}" --emulate-ranks 2,8 --replays 10 --sequence 122x42K -d all
    step mixed-graph-copy-large 90 TPAR_ZERO_COPY=0 -- "$B" "${MIX[@]}" --emulate-ranks 2,8 --replays 4 --sequence 24x4M --scratch out-of-place -d bfloat16
    step mixed-graph-registered 90 -- "$B" "${MIX[@]}" --emulate-ranks 2,8 --replays 4 --sequence 24x4M --scratch out-of-place -d bfloat16
    step mixed-graph-zc 90 TPAR_ZERO_COPY=1 -- "$B" "${MIX[@]}" --emulate-ranks 3,8 --replays 5 --sequence 61x43008 --scratch out-of-place -d all
    step mixed-graph-host 60 -- "$B" "${MIX[@]}" --emulate-ranks 3,4 --transport host --replays 5 --sequence 122x42K -d bfloat16
    # The guards removed: buffer reuse (two buffers; copy path) and the registered path's end
    # barrier (one-shot pull forced registered) must be caught (wrong sums or a timeout).
    step guard-mixed-2buf 30 expect_fail TPAR_TIMEOUT_MS=500 TPAR_ZERO_COPY=0 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 XDG_CACHE_HOME="$CACHE/u2" -- "$B" selftest graph --collective all-gather,reduce-scatter --algo oneshot-push,oneshot-pull --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
    step guard-mixed-no-end-barrier 40 expect_fail TPAR_TIMEOUT_MS=500 TPAR_ZERO_COPY=1 TPAR_TEST_UNSAFE_NO_END_BARRIER=1 XDG_CACHE_HOME="$CACHE/ne" -- "$B" selftest graph --collective all-gather,reduce-scatter --algo oneshot-pull --emulate-ranks 8 --replays 5 --skew-ns 20000 --sequence 24x1M --scratch out-of-place -d bfloat16
    # Timings: per rank 1 KiB to 4 MiB at 8 ranks (nccl-tests' sizes are every rank's part),
    # the all-reduce of each per-rank size beside them in the same call.
    for w in 2 4 8; do
        for c in all-gather reduce-scatter; do
            step "$c-graph-w$w" 60 -- "$B" bench --emulate-ranks $w --collective $c --mode graph -b $((1024 * w)) -e $((4194304 * w)) -f 4 -n 30 -w 5 -d bfloat16 --algo oneshot-push,oneshot-pull --json "$OUT/$c-w$w.json"
        done
        step "all-reduce-graph-w$w" 60 -- "$B" bench --emulate-ranks $w --mode graph -b 1K -e 4M -f 4 -n 30 -w 5 -d bfloat16 --algo oneshot-push --json "$OUT/all-reduce-w$w.json"
    done ;;
ab)
    # A restructuring's cost, if any: the same tables from both binaries, alternating, so that
    # drift between repetitions shows as drift, not as a difference. Every step's table goes
    # to ab.txt under its "=== NAME" header (medians per size: compare like with like).
    [ -x "$OLD" ] || { echo "ab: no $OLD to compare against" >&2; exit 2; }
    A=oneshot-push,oneshot-pull,twoshot-pull,staged-push
    for rep in $(seq 1 "${REPS:-3}"); do
        for who in after before; do
            bin=$B; [ $who = before ] && bin=$OLD
            case " ${AB_TABLES:-sweep seq eager} " in *" sweep "*)
            step "sweep-$who-$rep" 100 -- "$bin" bench --emulate-ranks "${AB_RANKS:-2,4,8}" --mode graph -b 1K -e "${AB_MAX:-16M}" -f 4 -n 40 -w 5 -d bfloat16 --algo "$A" ;; esac
            case " ${AB_TABLES:-sweep seq eager} " in *" seq "*)
            step "seq-$who-$rep" 60 -- "$bin" bench --emulate-ranks "${AB_RANKS:-2,4,8}" --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$A" ;; esac
            case " ${AB_TABLES:-sweep seq eager} " in *" eager "*)
            step "eager-$who-$rep" 60 -- "$bin" bench --emulate-ranks "${AB_RANKS:-2,4,8}" --mode eager --sequence 122x42K -b 42K -e 42K -n 30 -w 5 -d bfloat16 --algo "$A" ;; esac
        done
    done
    awk '/^=== (sweep|seq|eager)-/ {s=1} /^=== / && !/^=== (sweep|seq|eager)-/ {s=0} s' "$LOG" >"$OUT/ab.txt"
    ;;
*) echo "unknown mode $MODE: timings, verify, python, ab or collectives" >&2; exit 2 ;;
esac

{ echo "# ---- $MODE summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary.txt"
grep -E "^RESULT" "$LOG" >>"$OUT/summary.txt"
[ -e "$OUT/targets.txt" ] && cat "$OUT/targets.txt" >>"$OUT/summary.txt"
gzip -f "$LOG"
rm -rf "$CACHE"
cat "$OUT/summary.txt"
exit "$failed"
