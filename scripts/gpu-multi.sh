#!/usr/bin/env bash
# The multi-GPU runs behind bench/results/2026-11-29-h200-x4-all-algorithms/README.md, for `run` calls on a machine with 2+ GPUs
# (kinds nvidia-h200-x2/-x4/-x8). One stage per call, so each fits the 10-minute limit:
#
#   scripts/gpu-multi.sh check [BIN]   fabric, correctness sweeps (worlds 2..N), 10^4 random calls, dead peer
#   scripts/gpu-multi.sh bench [BIN]   latency vs NCCL (eager and graphs, 1 KiB-16 MiB), 122x42 KiB step, tune
#   scripts/gpu-multi.sh torch         PyTorch's NCCL and symmetric-memory all-reduces, same sizes
#   scripts/gpu-multi.sh blocks [BIN]  thread blocks per call (TPAR_BLOCKS) against the plan's default
#   scripts/gpu-multi.sh host [BIN]    the host transport one process per GPU (the no-P2P path: one
#                                      shared host segment), both protocols, against NCCL with P2P off
#
# Builds nothing: BIN is a release `tpar` built elsewhere (default ./tpar). Logs and JSON go to
# $OUT. NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
set -uo pipefail
STAGE="${1:?usage: gpu-multi.sh check|bench|torch|blocks|host [BIN]}"
BIN="${2:-./tpar}"
OUT="${OUT:-.}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 XDG_CACHE_HOME=/tmp/tpar-cache
GPUS=$(nvidia-smi -L | wc -l)
run() { echo "\$ tpar $*"; local t0=$SECONDS; timeout "$T" "$BIN" "$@"; echo "rc=$? ($((SECONDS - t0)) s)"; echo; }
worlds() { local w=2; while [ "$w" -le "$GPUS" ]; do echo "$w"; w=$((w + 1)); done; }

case "$STAGE" in
check) {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
    nvidia-smi topo -m
    T=60 run topo
    T=240 run check --backend cuda --world "$GPUS" -d all -e 16M --calls 300
    T=200 run check --backend cuda --world "$GPUS" -d all -e 1M --calls 10000 --seed 2
    for w in $(worlds); do
        [ "$w" -eq "$GPUS" ] && continue
        T=150 run check --backend cuda --world "$w" -d all -e 4M --calls 300 --seed 3
    done
    for e in 42K 8M; do # tpar's kernels, then NCCL (the plan's pick above 2 MiB)
        echo "\$ TPAR_TIMEOUT_MS=3000 tpar selftest kill-rank --world $GPUS --rank $((GPUS - 1)) -e $e"
        TPAR_TIMEOUT_MS=3000 timeout 90 "$BIN" selftest kill-rank --world "$GPUS" --rank $((GPUS - 1)) -e "$e"; echo "rc=$?"
    done
} 2>&1 | tee "$OUT/check.log" ;;
bench) {
    date -u +%FT%TZ
    for w in $(worlds | sort -rn); do
        T=200 run bench --backend cuda --world "$w" -b 1K -e 16M -f 2 -d bfloat16 -n 30 -w 5 \
            --sequence 122x43008 --json "$OUT/bench-w$w.json"
    done
    T=150 run tune --backend cuda --world "$GPUS" -b 1K -e 16M -f 2 -d bfloat16 -n 20 -w 3 --capture graph -o "$OUT/profile-w$GPUS-graph.toml"
    T=150 run tune --backend cuda --world "$GPUS" -b 1K -e 16M -f 2 -d bfloat16 -n 20 -w 3 --capture eager -o "$OUT/profile-w$GPUS-eager.toml"
    T=30 run plan --profile "$OUT/profile-w$GPUS-graph.toml" --table --graph
} 2>&1 | tee "$OUT/bench.log" ;;
torch) {
    date -u +%FT%TZ
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
    for w in $(worlds | sort -rn); do
        [ "$w" -eq 3 ] && continue # symmetric memory wants power-of-two worlds for two-shot; 2 and 4 are what TP uses
        echo "\$ torchrun --nproc-per-node $w bench/compare/torch_symm_mem.py"
        mkdir -p "$OUT/torch-w$w"
        timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node "$w" \
            "$HERE/../bench/compare/torch_symm_mem.py" --out "$OUT/torch-w$w"; echo "rc=$?"
    done
} 2>&1 | tee "$OUT/torch.log" ;;
blocks) {
    date -u +%FT%TZ
    for w in $GPUS 2; do
        for b in auto 2 4 8 16 32; do
            echo "\$ TPAR_BLOCKS=$b tpar bench --backend cuda --world $w -b 1K -e 1M -f 2 -d bfloat16 --algo oneshot-push,twoshot-push --mode graph -c 0"
            TPAR_BLOCKS=$b timeout 90 "$BIN" bench --backend cuda --world "$w" -b 1K -e 1M -f 2 -d bfloat16 \
                --algo oneshot-push,twoshot-push --mode graph -n 20 -w 3 -c 0 | grep -v "^#  "
            echo "rc=$?"
        done
    done
} 2>&1 | tee "$OUT/blocks.log" ;;
host) {
    # What a box without peer-to-peer gets: tpar's kernels over pinned host memory shared by
    # the rank processes (TPAR_TRANSPORT=host), and NCCL with P2P disabled (its shared-memory
    # path through the host), timed in the same runs. P2P stays available to the GPUs: these
    # figures are the host paths' own, over each GPU's PCIe link.
    date -u +%FT%TZ
    nvidia-smi --query-gpu=index,name,pcie.link.gen.current,pcie.link.width.current --format=csv
    export NCCL_P2P_DISABLE=1
    T=200 run check --backend cuda --world "$GPUS" --transport host -d all -e 4M --calls 300
    for w in $(worlds | sort -rn); do
        T=150 run bench --backend cuda --world "$w" --transport host -b 1K -e 16M -f 2 -d bfloat16 -n 30 -w 5 \
            --sequence 122x43008 --json "$OUT/host-w$w.json"
    done
    for p in flags sentinel; do # the protocol the plan does not pick at this world, for comparison
        echo "\$ TPAR_HOST_PROTOCOL=$p"
        TPAR_HOST_PROTOCOL=$p T=120 run bench --backend cuda --world "$GPUS" --transport host -b 16K -e 256K -f 2 \
            -d bfloat16 -n 30 -w 5 --algo oneshot-push,twoshot-push --mode graph --sequence 122x43008
    done
    echo "\$ TPAR_TIMEOUT_MS=3000 tpar selftest kill-rank --world $GPUS --rank $((GPUS - 1)) -e 42K (host)"
    TPAR_TIMEOUT_MS=3000 timeout 90 "$BIN" selftest kill-rank --world "$GPUS" --transport host --rank $((GPUS - 1)) -e 42K; echo "rc=$?"
} 2>&1 | tee "$OUT/host.log" ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
