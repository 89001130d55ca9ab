#!/usr/bin/env bash
# Round 4's merged head (lean variants, host flags written once) on one H200, in one call:
# `run` with carry [".gpu-r4"], `bash bench/results/h200-1gpu-round4/run.sh`.
# .gpu-r4/ holds what was built here (no Rust there): `tpar` (release, the merged head),
# `tpar-before` (the session's start, kernels of 0ad3d69), the abi3 wheel and
# scripts/gpu_python_check.py. Builds nothing. $OUT/summary.txt and timings.txt come back.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-r4; B=$D/tpar; OLD=$D/tpar-before; LOG="$OUT/round4.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r4cache
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push,hierarchical"
T0=$SECONDS; BUDGET=${BUDGET:-400}; summary=()
# step NAME LIMIT [expect_fail] [ENV=V ...] -- CMD ARGS...
step() {
  local name="$1" limit="$2" expect=pass; shift 2
  [ "$1" = expect_fail ] && { expect=fail; shift; }
  local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local el=$((SECONDS - T0))
  if [ $((el + limit / 3)) -gt $BUDGET ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
  echo "=== $name (t=${el}s): ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ $expect = pass ]; then [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s)")
  else [ $rc -ne 0 ] && summary+=("PASS  $name: failed as it must, rc=$rc ($((SECONDS - t)) s)") || summary+=("FAIL  $name: passed where it must fail"); fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tpar $(sha256sum $B | cut -c1-16) before $(sha256sum $OLD | cut -c1-16)"; $B --version; } >>"$LOG" 2>&1
# -- timings first (graph, bf16, emulated: kernel cost, not a fabric), before and after in this call --
SEQ=(bench --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$K")
SZ=(bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 40 -w 5 -d bfloat16 --algo "$K")
HS=(bench --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push)
step seq-before 40 -- $OLD "${SEQ[@]}" --emulate-ranks 2,4,8
step seq-after 40 -- $B "${SEQ[@]}" --emulate-ranks 2,4,8
step sizes-before 45 -- $OLD "${SZ[@]}"
step sizes-after 45 -- $B "${SZ[@]}"
step host-before 30 -- $OLD "${HS[@]}" --emulate-ranks 3,4,8
step host-after 30 -- $B "${HS[@]}" --emulate-ranks 3,4,8
# -- correctness, emulated ranks (streams of one process) --
step check-emulated 90 -- $B check --emulate-ranks 2,3,8 -e 4M --calls 200 -d all --algo all
step check-lean-forced 40 TPAR_LEAN=1 -- $B check --emulate-ranks 2,8 -e 1M --calls 100 -d all --algo oneshot-pull,twoshot-push,twoshot-pull
step check-lean-host 40 TPAR_LEAN=1 -- $B check --emulate-ranks 2,4 --transport host -e 1M --calls 60 -d all --algo twoshot-push
step check-islands 30 -- $B check --emulate-ranks 6,8 --islands map:012012,3+5 -e 256K --calls 100 -d all --algo hierarchical
step check-host 60 -- $B check --emulate-ranks 2,3,4,8 --transport host -e 1M --calls 100 -d all
step check-skew 60 -- $B check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step check-skew-4M 60 -- $B check --emulate-ranks 8 --calls 200 --skew-ns 20000 -e 4M -d bfloat16 --algo oneshot-pull,twoshot-push,twoshot-pull
step graph-skew 40 -- $B selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
step graph-skew-host 40 -- $B selftest graph --emulate-ranks 2,3,4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d all
step graph-skew-nopdl 25 TPAR_PDL=0 -- $B selftest graph --emulate-ranks 4 --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
step guard-sentinel-2buf 20 expect_fail TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_TWO_BUFFERS=1 XDG_CACHE_HOME=/tmp/r4u2 -- $B selftest graph --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
step guard-flags-1buf 20 expect_fail TPAR_TIMEOUT_MS=500 TPAR_TEST_UNSAFE_ONE_BUFFER=1 XDG_CACHE_HOME=/tmp/r4u1 -- $B selftest graph --emulate-ranks 4 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
step timeout 30 TPAR_TIMEOUT_MS=200 -- $B selftest timeout --emulate-ranks 2,8
step timeout-host 20 TPAR_TIMEOUT_MS=200 -- $B selftest timeout --emulate-ranks 4 --transport host
step mismatch-emulated 30 TPAR_TIMEOUT_MS=2000 -- $B selftest mismatch --emulate-ranks 2,8
step mismatch-host 25 TPAR_TIMEOUT_MS=2000 -- $B selftest mismatch --emulate-ranks 4 --transport host
step epoch-wrap 20 -- $B selftest epoch-wrap --emulate-ranks 3,4 --epoch-start 4294967290 -e 4M -d all
step epoch-wrap-host 15 -- $B selftest epoch-wrap --emulate-ranks 3 --transport host --epoch-start 4294967290 -e 64K -d all
# -- rank processes sharing the GPU (CUDA IPC, shared host segment) --
step procs-check 40 -- $B check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
step procs-check-lean 40 TPAR_LEAN=1 -- $B check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-pull,twoshot-push,twoshot-pull
step procs-host 50 -- $B check --backend cuda --world 4 --transport host --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-push,twoshot-push
step procs-host-plan 40 -- $B check --backend cuda --world 4 --plan-topology rtx4090-nop2p-4 -e 32K --calls 100 -d all --algo auto
step procs-mismatch 40 TPAR_TIMEOUT_MS=3000 -- $B selftest mismatch --world 4 --plan-topology h200-nvswitch-8
step procs-kill 40 TPAR_TIMEOUT_MS=3000 -- $B selftest kill-rank --world 4 --plan-topology h200-nvswitch-8 -e 42K
# -- Python (tpar.torch), rank processes sharing the GPU --
SITE=/tmp/site; python3 -m pip install --quiet --no-index --no-deps --target $SITE $D/tpar-*.whl >>"$LOG" 2>&1
mkdir -p /tmp/r4py
PYENV=(PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TIMEOUT_MS=10000 TPAR_ALGO=oneshot-push DEADLINE_S=60)
step python-correct-4 70 "${PYENV[@]}" -- python3 $D/gpu_python_check.py 4 correct --out /tmp/r4py
step python-host-4 60 "${PYENV[@]}" TPAR_TOPOLOGY=rtx4090-nop2p-4 -- python3 $D/gpu_python_check.py 4 correct --out /tmp/r4py
step python-gmismatch-4 40 "${PYENV[@]}" -- python3 $D/gpu_python_check.py 4 gmismatch --out /tmp/r4py
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary.txt"
grep -E "^RESULT" "$LOG" >>"$OUT/summary.txt"
# timings: every line the timing steps printed
awk '/^=== (seq|sizes|host)-/ {s=1} /^=== / && !/^=== (seq|sizes|host)-/ {s=0} s' "$LOG" >"$OUT/timings.txt"
gzip -kf "$LOG"; rm -f "$LOG"
cat "$OUT/summary.txt"
