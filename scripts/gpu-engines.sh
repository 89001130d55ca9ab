#!/usr/bin/env bash
# vLLM's and SGLang's own distributed code driving tpar on one GPU (the lent nvidia-h200
# machine: torch 2.11 / CUDA 13, Python 3.12, no network, no Rust). Builds nothing: DIR holds
# tpar's abi3 wheel (`maturin build --release -o DIR`) and DIR/engines/, the carry that
# `python3 scripts/engine_carry.py` writes (the engines' unmodified files and the wheels they
# import that the machine's image lacks).
#
#   OUT=/some/dir bash scripts/gpu-engines.sh DIR [WORLDS] [STAGES]
#
# WORLDS: rank counts (default "2 4 8"); STAGES: the harness's stages (default all:
# eager,compile,graph,thread,kill). For each engine and world, scripts/engine_harness.py
# starts that many rank processes sharing GPU 0 with TPAR_ENABLE=1; then vLLM once more with
# VLLM_BATCH_INVARIANT=1 on a PCIe preset (tpar must take every size, bitwise one numeric
# path). Writes $OUT/engine-summary.md (one line per engine, world and stage), the ranks'
# records and logs; exits non-zero if anything failed.
#
# Configuration, and why: rank processes share one GPU (NCCL refuses two ranks on one GPU), so
# torch's groups use gloo and the engines' NCCL is off; tpar plans on a preset topology
# (TPAR_TOPOLOGY, default h200-nvswitch-8) since one GPU has no peers. Processes on one GPU are
# time-sliced: nothing here is a timing.
set -uo pipefail
DIR="${1:?usage: gpu-engines.sh DIR [WORLDS] [STAGES]}"
WORLDS="${2:-2 4 8}"
STAGES="${3:-eager,compile,graph,thread,kill}"
OUT="${OUT:-.}"
mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")" && pwd)"
CARRY="$DIR/engines"
SITE=/tmp/tpar-site
rm -rf "$SITE"
python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$DIR"/tpar-*.whl || exit 1
[ -f "$CARRY/MANIFEST.json" ] || { echo "no $CARRY/MANIFEST.json: run python3 scripts/engine_carry.py first" >&2; exit 1; }
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XDG_CACHE_HOME=/tmp/tpar-cache TRITON_CACHE_DIR=/tmp/tpar-cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/tpar-cache/inductor
export TPAR_TIMEOUT_MS="${TPAR_TIMEOUT_MS:-10000}" TPAR_TOPOLOGY="${TPAR_TOPOLOGY:-h200-nvswitch-8}"
: >"$OUT/engine-summary.md"
fail=0
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    # The image's versions of what the carry does not bring (MANIFEST "host": pinned for the CPU test).
    python3 - "$CARRY/MANIFEST.json" <<'EOF'
import importlib.metadata as md, json, sys
m = json.load(open(sys.argv[1]))
print("engines:", ", ".join(f"{n} {e['version']}" for n, e in m["engines"].items()), "| carried:", len(m["carried"]), "wheels")
for name, pinned in sorted(m["host"].items()):
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = "MISSING"
    print(f"  host {name}: {have}" + ("" if have == pinned else f" (the CPU test pins {pinned})"))
EOF
    echo "| engine, world, device | stage | result | detail |" >>"$OUT/engine-summary.md"
    echo "|---|---|---|---|" >>"$OUT/engine-summary.md"
    for engine in vllm sglang; do
        edir=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['engines'][sys.argv[2]]['dir'])" "$CARRY/MANIFEST.json" "$engine")
        for w in $WORLDS; do
            echo "\$ $engine world $w"
            PYTHONPATH="$CARRY/$edir:$CARRY/site:$SITE" timeout $((240 + 40 * w)) \
                python3 "$HERE/engine_harness.py" "$engine" "$w" --device cuda --stages "$STAGES" --out "$OUT" \
                --deadline $((220 + 40 * w)) || fail=1
        done
    done
    # VLLM_BATCH_INVARIANT: on a PCIe preset tpar's plan gives large messages to NCCL; under
    # batch invariance tpar must take every size through one numeric path.
    echo "\$ vllm world 4, VLLM_BATCH_INVARIANT=1, rtx-pro-6000-pcie-8"
    VLLM_BATCH_INVARIANT=1 TPAR_TOPOLOGY=rtx-pro-6000-pcie-8 PYTHONPATH="$CARRY/vllm-0.33.0:$CARRY/site:$SITE" timeout 400 \
        python3 "$HERE/engine_harness.py" vllm 4 --device cuda --stages batchinv --out "$OUT" --deadline 380 || fail=1
} 2>&1 | tee "$OUT/gpu-engines.log"
fail=$((fail | PIPESTATUS[0]))
grep -q "| FAIL |" "$OUT/engine-summary.md" && fail=1
echo "engines on one GPU: $([ $fail -eq 0 ] && echo PASS || echo FAIL) (table: $OUT/engine-summary.md)"
exit $fail
