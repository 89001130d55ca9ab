#!/usr/bin/env bash
# tpar.torch over the host transport, rank processes sharing one GPU (the lent nvidia-h200):
# TPAR_TRANSPORT=host (or a preset without P2P) makes every rank's workspaces one shared
# host-memory segment. DIR holds the abi3 wheel and scripts/gpu_python_check.py.
#
#   OUT=/some/dir bash scripts/gpu-host-python.sh DIR
#
# The processes time-slice the GPU (no MPS): this checks correctness and failure handling,
# not speed.
set -uo pipefail
DIR="${1:?usage: gpu-host-python.sh DIR}"
OUT="${OUT:-.}"
mkdir -p "$OUT"
SITE=/tmp/tpar-site
rm -rf "$SITE"
python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$DIR"/tpar-*.whl || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 XDG_CACHE_HOME=/tmp/tpar-cache TPAR_TIMEOUT_MS=10000
CHECK="$DIR/gpu_python_check.py"
run() { echo "\$ $*"; local t0=$SECONDS; DEADLINE_S=$((T - 5)) timeout "$T" "$@" 2>&1 | grep -E '^(RESULT|  |Traceback|[A-Za-z]*Error)' ; echo "rc=${PIPESTATUS[0]} ($((SECONDS - t0)) s)"; }
{
    date -u +%FT%TZ
    python3 -c 'import sys, torch, tpar; print("python", sys.version.split()[0], "torch", torch.__version__, "tpar", tpar.__version__)'
    # Forced: TPAR_TRANSPORT=host on a P2P preset.
    T=40 TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TRANSPORT=host TPAR_ALGO=oneshot-push run python3 "$CHECK" 2 correct --out "$OUT"
    # Chosen: a preset without P2P; the communicator takes the host transport by itself.
    T=45 TPAR_TOPOLOGY=rtx4090-nop2p-4 TPAR_ALGO=twoshot-push run python3 "$CHECK" 4 correct --out "$OUT"
    T=25 TPAR_TOPOLOGY=rtx4090-nop2p-4 TPAR_ALGO=oneshot-push TPAR_TIMEOUT_MS=3000 run python3 "$CHECK" 4 dead --out "$OUT"
    echo "tpar segments in /dev/shm at the end: $(ls /dev/shm | grep -c '^tpar-')"
} 2>&1 | tee "$OUT/gpu-host-python.log"
