#!/usr/bin/env bash
# tpar's Python package on one GPU (the lent nvidia-h200 machine: torch 2.11 / CUDA 13,
# Python 3.12, no Rust). Builds nothing: DIR holds the abi3 wheel built elsewhere
# (`maturin build --release`), scripts/gpu_python_check.py, examples/tp_decode.py and,
# optionally, a release `tpar` binary for the Rust API's reference figures.
#
#   OUT=/some/dir bash scripts/gpu-python.sh DIR [main|host]
#
# main (default): eager and graph checks at 2, 4, 8 ranks, a killed rank, a mismatched
# capture, host-side cost, examples/tp_decode.py, two-shot at 4 ranks.
# host: tpar.torch over the host transport (one shared host-memory segment for every rank's
# workspaces): forced with TPAR_TRANSPORT=host on a P2P preset, and chosen by the communicator
# itself on a preset without P2P; a killed rank; no segment left in /dev/shm.
#
# Rank processes share the GPU (NCCL refuses two ranks on one GPU, so torch's own
# collectives use gloo); tpar's kernels are forced with TPAR_ALGO and planned on a preset
# topology (TPAR_TOPOLOGY), since one GPU's own topology has no peers. Without MPS the GPU
# time-slices between the processes' contexts (~2 ms a slice): timings of a collective here
# measure that scheduling, not the collective; host-side costs are what this run measures.
set -uo pipefail
DIR="${1:?usage: gpu-python.sh DIR [main|host]}"
STAGE="${2:-main}"
OUT="${OUT:-.}"
mkdir -p "$OUT"
SITE=/tmp/tpar-site
rm -rf "$SITE"
python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$DIR"/tpar-*.whl || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 XDG_CACHE_HOME=/tmp/tpar-cache
export TPAR_TIMEOUT_MS=10000
CHECK="$DIR/gpu_python_check.py"
run() { echo "\$ $*"; local t0=$SECONDS; DEADLINE_S=$((T - 5)) timeout "$T" "$@" 2>&1 | grep -E '^(RESULT|tp_decode|  |Traceback|[A-Za-z]*Error)' ; echo "rc=${PIPESTATUS[0]} ($((SECONDS - t0)) s)"; }
case "$STAGE" in
main) {
    export TPAR_TOPOLOGY=h200-nvswitch-8
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch, tpar; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "tpar", tpar.__version__)'
    for w in 2 4 8; do
        T=$((30 + 15 * w)) TPAR_ALGO=oneshot-push run python3 "$CHECK" "$w" correct --out "$OUT"
    done
    T=30 TPAR_ALGO=oneshot-push TPAR_TIMEOUT_MS=3000 run python3 "$CHECK" 4 dead --out "$OUT"
    T=30 TPAR_ALGO=oneshot-push run python3 "$CHECK" 4 gmismatch --out "$OUT"
    T=30 TPAR_ALGO=oneshot-push run python3 "$CHECK" 2 cost --out "$OUT"
    T=45 TPAR_ALGO=oneshot-push run python3 -m torch.distributed.run --standalone --nproc-per-node 2 "$DIR/tp_decode.py" \
        --preset tiny --tokens 4 --allreduce tpar --same-gpu --iters 10
    T=40 TPAR_ALGO=twoshot-push run python3 "$CHECK" 4 correct --out "$OUT"
    if [ -x "$DIR/tpar" ]; then # the Rust API's eager and graph calls, 2 emulated ranks on this GPU (one process)
        echo "\$ tpar bench --emulate-ranks 2 -b 42K -e 42K -d bfloat16 --mode graph"
        timeout 25 "$DIR/tpar" bench --emulate-ranks 2 -b 42K -e 42K -d bfloat16 --mode graph 2>&1 | tail -60; echo "rc=$?"
    fi
} 2>&1 | tee "$OUT/gpu-python.log" ;;
host) {
    date -u +%FT%TZ
    python3 -c 'import sys, torch, tpar; print("python", sys.version.split()[0], "torch", torch.__version__, "tpar", tpar.__version__)'
    # Forced: TPAR_TRANSPORT=host on a P2P preset.
    T=40 TPAR_TOPOLOGY=h200-nvswitch-8 TPAR_TRANSPORT=host TPAR_ALGO=oneshot-push run python3 "$CHECK" 2 correct --out "$OUT"
    # Chosen: a preset without P2P; the communicator takes the host transport by itself.
    T=45 TPAR_TOPOLOGY=rtx4090-nop2p-4 TPAR_ALGO=twoshot-push run python3 "$CHECK" 4 correct --out "$OUT"
    T=25 TPAR_TOPOLOGY=rtx4090-nop2p-4 TPAR_ALGO=oneshot-push TPAR_TIMEOUT_MS=3000 run python3 "$CHECK" 4 dead --out "$OUT"
    echo "tpar segments in /dev/shm at the end: $(ls /dev/shm | grep -c '^tpar-')"
} 2>&1 | tee "$OUT/gpu-host-python.log" ;;
*) echo "unknown stage $STAGE (main or host)" >&2; exit 2 ;;
esac
