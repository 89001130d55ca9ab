#!/usr/bin/env bash
# The multi-GPU run behind bench/results/h200-x2.md, for one `run` call on a machine with 2+
# GPUs (kind nvidia-h200-x2): what tpar sees of the fabric, the plan-driven GpuCommunicator
# (one process per GPU) against NCCL in the same run, long random sequences, a SIGKILLed rank.
# Builds nothing: BIN is a release `tpar` built elsewhere. Log: $OUT/x2.log.
#
#   scripts/gpu-x2.sh [BIN]
set -uo pipefail
BIN="${1:-./tpar}"
OUT="${OUT:-.}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/tpar-cache
run() { echo "\$ tpar $*"; timeout "$T" "$BIN" "$@"; echo "rc=$?"; echo; }
{
date -u +%FT%TZ
nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
nvidia-smi topo -m
T=30 run topo
T=200 run bench-cuda --emulate-ranks 2 --comm-test -e 1M -d all -n 50 -w 5
T=60 run bench-cuda --emulate-ranks 2 --nccl-rdzv-test
T=120 run bench-cuda --emulate-ranks 2 --comm-stress 10000 -e 256K -d all
T=120 run bench-cuda --emulate-ranks 2 --comm-stress 60 -e 16M -d all
echo "\$ TPAR_TIMEOUT_MS=3000 tpar bench-cuda --emulate-ranks 2 --comm-fault-test"
TPAR_TIMEOUT_MS=3000 timeout 90 "$BIN" bench-cuda --emulate-ranks 2 --comm-fault-test; echo "rc=$?"
} 2>&1 | tee "$OUT/x2.log"
