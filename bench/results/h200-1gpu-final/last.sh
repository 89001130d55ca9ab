#!/usr/bin/env bash
# The last merged head on one H200 (the CPU backend's new protocol, the plan memo, frame.cuh,
# the PCIe block rule): `run` with carry [".gpu-final"], `bash bench/results/h200-1gpu-final/last.sh`.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
NEW=.gpu-final/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/cache
summary=()
step() { local name="$1" limit="$2"; shift 2; echo "=== $name: $*"; local t0=$SECONDS; timeout "$limit" "$@"; local rc=$?
    echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"; summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc" )  $name ($((SECONDS - t0)) s)"); }
{
date -u +%FT%TZ; sha256sum $NEW | cut -c1-16
step check-emulated 150 $NEW check --emulate-ranks 2,8 -e 1M --calls 300 -d all --algo all
step check-host 100 $NEW check --emulate-ranks 4 --transport host -e 256K --calls 100 -d all
step procs-check 120 $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
step host-seq 60 $NEW bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo oneshot-push,twoshot-push
step cpu-check 60 $NEW check --backend cpu --world 8 --calls 2000
SITE=/tmp/site; python3 -m pip install --quiet --no-index --no-deps --target $SITE .gpu-final/tpar-*.whl
export PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TIMEOUT_MS=10000
TPAR_ALGO=oneshot-push step python-4 90 python3 .gpu-final/gpu_python_check.py 4 correct --out "$OUT"
TPAR_ALGO=oneshot-push step python-cost 60 python3 .gpu-final/gpu_python_check.py 2 cost --out "$OUT"
echo "# ---- summary ----"; printf '%s\n' "${summary[@]}"
} 2>&1 | tee "$OUT/last.log" | grep -E "^===|^PASS|^FAIL|RESULT|per call|Traceback|Error"
