#!/usr/bin/env bash
# Second call of the round (after run.sh): the fixes it asked for, on one H200.
# `run` with carry [".gpu-r3"], `bash bench/results/h200-1gpu-round3/run2.sh`.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-r3; B=$D/tpar; W=$(mktemp -d); LOG="$W/run2.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/r3cache
unset CUDA_DEVICE_MAX_CONNECTIONS
T0=$SECONDS; summary=()
step() {
  local name="$1" limit="$2"; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "=== $name (t=$((SECONDS - T0))s): ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s)")
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tpar $(sha256sum $B | cut -c1-16)"; } >>"$LOG" 2>&1
# 16 emulated ranks with nothing set by hand (the command sets CUDA_DEVICE_MAX_CONNECTIONS=32)
step w16-all 60 TPAR_TIMEOUT_MS=3000 -- $B check --emulate-ranks 16 -e 256K --calls 100 -d all --algo all
step w16-islands 30 TPAR_TIMEOUT_MS=3000 -- $B check --emulate-ranks 16 --islands 5+5+6 -e 256K --calls 100 -d all --algo hierarchical
step w16-seq 30 -- $B bench --emulate-ranks 16 --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,oneshot-pull,twoshot-push,hierarchical
# the host transport across rank processes: the plan's pick on a no-P2P preset (small sizes), and both kernels forced
step procs-host-plan 40 -- $B check --backend cuda --world 4 --plan-topology rtx4090-nop2p-4 -e 32K --calls 100 -d all --algo auto
step procs-host-forced 50 -- $B check --backend cuda --world 4 --transport host --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-push,twoshot-push
# Python: a dtype that differs at captured call 5 must raise MismatchError on every rank
SITE=/tmp/site; python3 -m pip install --quiet --no-index --no-deps --target $SITE $D/tpar-*.whl >>"$LOG" 2>&1
mkdir -p "$W/py"
step python-gmismatch-4 40 PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TIMEOUT_MS=10000 TPAR_ALGO=oneshot-push DEADLINE_S=35 -- python3 $D/gpu_python_check.py 4 gmismatch --out "$W/py"
step python-correct-4-twoshot 70 PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TIMEOUT_MS=10000 TPAR_ALGO=twoshot-push DEADLINE_S=65 -- python3 $D/gpu_python_check.py 4 correct --out "$W/py"
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; grep -E "^RESULT|^   graph " "$LOG"; } | tee -a "$LOG" >"$OUT/summary2.txt"
cp "$LOG" "$OUT/run2.log"; tar -C "$W" -czf "$OUT/run2.tgz" . 2>/dev/null
cat "$OUT/summary2.txt"
