#!/usr/bin/env bash
# This round's merged head on one H200, in one call: `run` with carry [".gpu-r3"],
#   bash bench/results/h200-1gpu-round3/run.sh
# .gpu-r3/ holds what was built here (no Rust there): `tpar` (release, commit in the log),
# the abi3 wheel, scripts/gpu_python_check.py and scripts/gpu-tune-probe.sh. Builds nothing.
# Everything lands in a work folder, packed into $OUT/round3.tgz; $OUT/summary.txt last.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-r3; B=$D/tpar; W=$(mktemp -d); LOG="$W/round3.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r3cache
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push,hierarchical"
T0=$SECONDS; BUDGET=430; summary=()
# step NAME LIMIT [expect_fail] [ENV=V ...] -- CMD ARGS...
step() {
  local name="$1" limit="$2" expect=pass; shift 2
  [ "$1" = expect_fail ] && { expect=fail; shift; }
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local el=$((SECONDS - T0))
  if [ $((el + limit / 3)) -gt $BUDGET ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
  echo "=== $name (t=${el}s): ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ $expect = pass ]; then [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s)")
  else [ $rc -ne 0 ] && summary+=("PASS  $name: failed as it must, rc=$rc ($((SECONDS - t)) s)") || summary+=("FAIL  $name: passed where it must fail"); fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tpar $(sha256sum $B | cut -c1-16)"; $B --version; } >>"$LOG" 2>&1
# -- correctness, emulated ranks (streams of one process) --
step check-emulated 70 -- $B check --emulate-ranks 2,3,8 -e 1M --calls 300 -d all --algo all
step check-islands 30 -- $B check --emulate-ranks 6,8 --islands map:012012,3+5 -e 256K --calls 100 -d all --algo hierarchical
step check-host 30 -- $B check --emulate-ranks 2,4 --transport host -e 1M --calls 100 -d all
step check-skew 30 -- $B check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step graph-skew 30 -- $B selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
step timeout 25 TPAR_TIMEOUT_MS=200 -- $B selftest timeout --emulate-ranks 2,8
step mismatch-emulated 25 TPAR_TIMEOUT_MS=2000 -- $B selftest mismatch --emulate-ranks 2,8
# 16 emulated ranks: did not finish in the hierarchical run; try one kernel, short deadline, both queue settings
step w16-oneshot 20 TPAR_TIMEOUT_MS=3000 -- $B check --emulate-ranks 16 -e 64K --calls 30 -d bfloat16 --algo oneshot-push
step w16-oneshot-conn32 20 TPAR_TIMEOUT_MS=3000 CUDA_DEVICE_MAX_CONNECTIONS=32 -- $B check --emulate-ranks 16 -e 64K --calls 30 -d bfloat16 --algo oneshot-push,hierarchical
# -- rank processes sharing the GPU (CUDA IPC, shared host segment) --
step procs-check 40 -- $B check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
step procs-graph 30 -- $B bench --backend cuda --world 4 --plan-topology h200-nvswitch-8 --mode graph --sequence 20x42K -b 42K -e 42K -n 3 -w 1 -d bfloat16 --algo oneshot-push,twoshot-push
step procs-host 40 -- $B check --backend cuda --world 4 --plan-topology rtx4090-nop2p-4 -e 1M --calls 100 -d all
step procs-mismatch 40 TPAR_TIMEOUT_MS=3000 -- $B selftest mismatch --world 4 --plan-topology h200-nvswitch-8
step procs-kill 40 TPAR_TIMEOUT_MS=3000 -- $B selftest kill-rank --world 4 --plan-topology h200-nvswitch-8 -e 42K
# -- Python (tpar.torch), rank processes sharing the GPU --
SITE=/tmp/site; python3 -m pip install --quiet --no-index --no-deps --target $SITE $D/tpar-*.whl >>"$LOG" 2>&1
mkdir -p "$W/py"
PYENV=(PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TIMEOUT_MS=10000 TPAR_ALGO=oneshot-push DEADLINE_S=80)
step python-correct-2 85 "${PYENV[@]}" -- python3 $D/gpu_python_check.py 2 correct --out "$W/py"
step python-gmismatch-4 40 "${PYENV[@]}" -- python3 $D/gpu_python_check.py 4 gmismatch --out "$W/py"
step python-cost-2 40 "${PYENV[@]}" -- python3 $D/gpu_python_check.py 2 cost --out "$W/py"
# -- tune with the link probe --
step tune-probe 60 OUT="$W/tune" -- bash $D/gpu-tune-probe.sh $B
# -- timings (graph, bf16, emulated: kernel cost, not a fabric) --
step seq 40 -- $B bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$K"
step sizes-8 45 -- $B bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 50 -w 5 -d bfloat16 --algo "$K"
step host-seq 25 -- $B bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary.txt"
grep -E "^RESULT" "$LOG" >>"$OUT/summary.txt"
cp "$LOG" "$OUT/round3.log"; tar -C "$W" -czf "$OUT/round3.tgz" . 2>/dev/null
cat "$OUT/summary.txt"
