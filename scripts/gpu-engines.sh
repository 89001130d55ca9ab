#!/usr/bin/env bash
# vLLM's and SGLang's own distributed code driving tpar on one GPU (the lent nvidia-h200
# machine: torch 2.11 / CUDA 13, Python 3.12, no network, no Rust). Builds nothing.
#
#   OUT=/some/dir bash scripts/gpu-engines.sh WHEELDIR [CARRYDIR]
#
# WHEELDIR holds tpar's abi3 wheel (`maturin build --release -o .gpu/k`); CARRYDIR (default
# .gpu/engines) is what `python3 scripts/engine_carry.py` writes: the engines' unmodified files
# that the harness loads plus the module-level import closure of their communicator modules,
# the pure-Python (and three small compiled) wheels they import that the GPU image lacks, three
# stubs (engine_carry.STUBS says which and why) and MANIFEST.json. Every engine entry of the
# manifest is run: a newer engine version is its line in engine_carry.ENGINES (version and the
# wheel's sha256), then the carry is written again (`--only NAME-VERSION` keeps it in budget).
#
# Prepare here (CPU, network), then run on the GPU machine from the repository root:
#
#   scripts/install-python.sh && .venv/bin/python -m pip install .   # torch (CPU) and tpar
#   .venv/bin/python scripts/engine_carry.py  # traces the harness on CPU: .gpu/engines, ~40 MiB
#   maturin build --release -o .gpu/k         # tpar's wheel: about 5 MiB
#   du -sh .gpu/k .gpu/engines                # with the repository (~6 MiB): under 64 MiB
#   run(command="bash scripts/gpu-engines.sh .gpu/k .gpu/engines",      # $OUT: the run tool's
#       carry=[".gpu/k", ".gpu/engines"], kind="nvidia-h200", timeout_s=600)
#
# (carry limits: 64 MiB over at most 8 paths, the travelling working tree included; if .gpu/k
# holds more than the wheel, carry the wheel's own path instead.)
#
# For each world in WORLDS (default "2 4 8") every engine entry runs at once, in its own rank
# processes sharing GPU 0, with TPAR_ENABLE=1 (scripts/engine_harness.py): the engine's plug-in
# loading and group set-up, the check that every TP rank's ca_comm is tpar's and enabled, the
# plug-in's settings read back through the engine, eager calls for every dtype and the engines'
# size classes, torch.compile(fullgraph=True) through the engine's own op, graph_capture() with
# replays on fresh inputs, a call from a worker thread, vLLM's sequence-parallel
# sp_all_gather / sp_reduce_scatter eager (sp), inside torch.compile(fullgraph=True)
# (sp_compile) and captured in graph_capture() with replays (sp_graph), SGLang's DP-attention
# dp_gather_partial / dp_reduce_scatter_tensor likewise (dp, dp_compile, dp_graph; each engine
# skips the other's), and a rank killed
# mid-step (every survivor must raise a tpar error within 1 s of the death; the time is
# printed). Results are bitwise against tpar.testing.reference. Then each vLLM entry once more with
# VLLM_BATCH_INVARIANT=1 on a PCIe preset (tpar must take every size, bitwise one numeric path).
# Then, per vLLM entry, world in WORLDS and capability in FUSION_CAPS (default "120 90"), the
# fusion stage (scripts/engine_fusion.py): a layer compiled by Inductor with vLLM's pass
# manager, which tpar's plug-in gives its all-reduce + RMSNorm (+ FP8) pass, on an
# rtxpro6000 preset; every form must become tpar's op, and `fusion_routed` counts the calls
# tpar's fused kernels served, judged bitwise against tpar.testing. FUSION_ONLY=1 runs only
# these (Inductor compiles seven graphs a rank: FUSION_DEADLINE_BASE, default 300 s a run).
#
# Writes to $OUT (at most 8 files come back): engine-summary.md (one line per run and stage,
# then a matrix), gpu-engines.log (everything printed), engine-logs.tar.gz (every rank's log
# and record). Exits non-zero on any FAIL. Wall time: estimated 150-240 s (not yet measured on
# the GPU; each run is cut at 80 + 10 x world seconds, so a hang cannot pass 600 s).
#
# Configuration, and why: rank processes share one GPU (NCCL refuses two ranks on one GPU), so
# torch's groups use gloo and the engines' NCCL is off; tpar plans on a preset topology
# (TPAR_TOPOLOGY, default h200-nvswitch-8) since one GPU has no peers. Processes on one GPU are
# time-sliced: nothing here is a timing except the kill stage's detection time (wall clock).
set -uo pipefail
WHEELS="${1:?usage: gpu-engines.sh WHEELDIR [CARRYDIR]}"
CARRY="${2:-.gpu/engines}"
WORLDS="${WORLDS:-2 4 8}"
STAGES="${STAGES:-settings,eager,compile,graph,thread,sp,sp_compile,sp_graph,dp,dp_compile,dp_graph,kill}"
DEVICE="${DEVICE:-cuda}" # cpu: the same runs on tpar's CPU backend (checks this script without a GPU)
OUT="${OUT:-.}"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK=/tmp/tpar-engines # per-rank logs: more files than $OUT brings back, tarred at the end
SITE=/tmp/tpar-site
rm -rf "$WORK" "$SITE"
mkdir -p "$WORK"
[ -f "$CARRY/MANIFEST.json" ] || { echo "no $CARRY/MANIFEST.json: run python3 scripts/engine_carry.py first" >&2; exit 1; }
CARRY="$(cd "$CARRY" && pwd)"
WHEEL="$(ls -t "$WHEELS"/tpar-*.whl 2>/dev/null | head -1)" # the newest, if several
[ -n "$WHEEL" ] || { echo "no tpar-*.whl in $WHEELS" >&2; exit 1; }
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$WHEEL" || exit 1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# One compile cache for every run (the graphs are the same at every world), compiled in the
# rank's own process (a worker pool per rank would oversubscribe the 16 cores).
export XDG_CACHE_HOME=/tmp/tpar-cache TRITON_CACHE_DIR=/tmp/tpar-cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/tpar-cache/inductor
export TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONDONTWRITEBYTECODE=1
export TPAR_TIMEOUT_MS="${TPAR_TIMEOUT_MS:-10000}" TPAR_TOPOLOGY="${TPAR_TOPOLOGY:-h200-nvswitch-8}"
# entry name dir, one line per engine entry of the carry
mapfile -t ENTRIES < <(python3 -c 'import json, sys
for k, e in json.load(open(sys.argv[1]))["engines"].items(): print(k, e["name"], e["dir"])' "$CARRY/MANIFEST.json")
# Seconds a run may take at world $1 before its ranks are killed (a hang; a run takes far less).
deadline() { echo $((${DEADLINE_BASE:-80} + 10 * $1)); } # DEADLINE_BASE: for slow machines (the CPU check)

# harness ENTRY NAME DIR WORLD STAGES [VAR=VALUE...]: one run, its ranks' logs under $WORK/ENTRY-wWORLD[-TAG]
harness() {
    local entry=$1 name=$2 dir=$3 w=$4 stages=$5 tag=$6
    shift 6
    local d="$WORK/$entry-w$w$tag" t0=$SECONDS rc
    mkdir -p "$d"
    env "$@" PYTHONPATH="$CARRY/$dir:$CARRY/site:$SITE" timeout $(($(deadline "$w") + 20)) \
        python3 "$HERE/engine_harness.py" "$name" "$w" --device "$DEVICE" --stages "$stages" --out "$d" \
        --label "$entry$tag" --deadline "$(deadline "$w")" >"$d/harness.log" 2>&1
    rc=$?
    echo "\$ $entry$tag world $w: rc=$rc ($((SECONDS - t0)) s)"
    cat "$d/harness.log"
    [ -s "$d/engine-summary.md" ] || echo "| $entry$tag w$w $DEVICE | run | FAIL | no summary (rc=$rc): see $d/harness.log |" >"$d/engine-summary.md"
    return $rc
}

fail=0
t_all=$SECONDS
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || [ "$DEVICE" = cpu ]
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    # The image's versions of what the carry does not bring (MANIFEST "host": pinned for the CPU test).
    python3 - "$CARRY/MANIFEST.json" <<'EOF'
import importlib.metadata as md, json, sys
m = json.load(open(sys.argv[1]))
print("engines:", ", ".join(f"{e['name']} {e['version']}" for e in m["engines"].values()), "| carried:", ", ".join(f"{k} {v}" for k, v in m["carried"].items()))
seen = []
for name in m.get("host_used", []):
    pinned = m["host"][name]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = "MISSING"
    seen.append(f"{name} {have}" + ("" if have == pinned else f" (the CPU test pins {pinned})"))
print("from the image:", ", ".join(seen))
EOF
    [ "${FUSION_ONLY:-0}" = 1 ] || for w in $WORLDS; do
        pids=()
        for e in "${ENTRIES[@]}"; do
            read -r entry name dir <<<"$e"
            harness "$entry" "$name" "$dir" "$w" "$STAGES" "" &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || fail=1; done
    done
    # VLLM_BATCH_INVARIANT: on a PCIe preset tpar's plan gives large messages to NCCL; under
    # batch invariance tpar must take every size through one numeric path.
    pids=()
    for e in "${ENTRIES[@]}"; do
        read -r entry name dir <<<"$e"
        [ "$name" = vllm ] && [ "${FUSION_ONLY:-0}" != 1 ] || continue
        harness "$entry" "$name" "$dir" 4 settings,batchinv -batchinv VLLM_BATCH_INVARIANT=1 TPAR_TOPOLOGY=rtxpro6000-pcie-switch-8 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail=1; done
    # vLLM's compile stack with tpar's fusion pass, the capability faked (sm_120: vLLM's own
    # pass never runs there; sm_90: tpar's runs before it).
    for cap in ${FUSION_CAPS:-120 90}; do
        pids=()
        for w in $WORLDS; do
            for e in "${ENTRIES[@]}"; do
                read -r entry name dir <<<"$e"
                [ "$name" = vllm ] || continue
                DEADLINE_BASE=${FUSION_DEADLINE_BASE:-300} harness "$entry" "$name" "$dir" "$w" settings,fusion "-fusion-sm$cap" FUSION_CAPABILITY="$cap" TPAR_TOPOLOGY=rtxpro6000-pcie-switch-8 &
                pids+=($!)
            done
        done
        for p in "${pids[@]}"; do wait "$p" || fail=1; done
    done
    echo "wall: $((SECONDS - t_all)) s"
    exit $fail
} 2>&1 | tee "$OUT/gpu-engines.log"
fail=${PIPESTATUS[0]}
{
    echo "| run | stage | result | detail |"
    echo "|---|---|---|---|"
    cat "$WORK"/*/engine-summary.md
} >"$WORK/lines.md"
python3 "$HERE/engine_harness.py" --matrix "$WORK/lines.md" >"$OUT/engine-summary.md" || fail=1
cat "$OUT/engine-summary.md" | tee -a "$OUT/gpu-engines.log"
grep -q "| FAIL |" "$WORK/lines.md" && fail=1
tar czf "$OUT/engine-logs.tar.gz" -C "$WORK" .
echo "engines on one GPU: $([ $fail -eq 0 ] && echo PASS || echo FAIL) (table: $OUT/engine-summary.md, logs: $OUT/engine-logs.tar.gz)"
exit $fail
