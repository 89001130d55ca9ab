#!/usr/bin/env bash
# vLLM's custom all-reduce, all-gather and reduce-scatter kernels beside tpar's, in the same run
# and the same harness (`tpar bench --compare vllm [--collective all-gather|reduce-scatter]`).
# Nothing of vLLM is in this repository: its source distribution is fetched by name with pip
# (pinned by sha256) and three headers of it are compiled, with bench/compare/vllm_ar/peer.cu
# (tpar's small C API over vllm::CustomAllreduce and the all-gather and reduce-scatter kernels),
# into a library that `tpar bench` loads.
#
#   bash bench/compare/vllm.sh fetch [SRC]     here, with a package index: pip fetches vllm's
#                                              0.33.0 sdist by name (47 MB, sha256 pinned),
#                                              the three headers go into SRC (default
#                                              .gpu/vllm-src, about 50 KB)
#   OUT=DIR bash bench/compare/vllm.sh run [--tpar BIN] [--src SRC] [--quick] [--collectives L]
#                                              on the GPU machine: build with nvcc, then the
#                                              comparison runs below; logs and tables under OUT.
#                                              L: which steps, a comma list of all-reduce,
#                                              all-gather, reduce-scatter (default all three)
#   bash bench/compare/vllm.sh build [SRC]     only the nvcc build (prints the command and errors)
#
# `run` (one H200: the all-reduce's steps about 5-7 minutes, the all-gather's and reduce-
# scatter's about 2-3 more, so more than one 10-minute device call holds: run them as two,
# --collectives all-reduce and --collectives all-gather,reduce-scatter; --quick: the 8-rank
# sizes and the verify step only, about 2):
#   build       nvcc -arch=sm_XY (the GPU's compute capability) -shared -Xcompiler -fPIC
#   correct     every dtype, eager and graph, 2 and 8 emulated ranks, 1 KiB-4 MiB by x16 (both of
#               vLLM's kernels; its eager copy path and its graph registration)
#   pdl1, pdl0  the issue's run: 2/4/8 emulated ranks, 1 KiB-16 MiB by x4, bf16, CUDA graphs,
#               plus the 122 x 42 KiB verify step; tpar with TPAR_PDL=1, then TPAR_PDL=0
#   stage1/2    8 ranks, 64 KiB-4 MiB, vLLM forced to one kernel (VLLM_CUSTOM_ALLREDUCE_ALGO)
#   ag-correct, rs-correct
#               the all-gather and the reduce-scatter (tpar's one-shot push and one-shot
#               pull beside vLLM's kernels): every dtype, eager and graph, 2 and 8
#               emulated ranks, 1 KiB-4 MiB per rank by x16 (vLLM's all-gather takes at most
#               2 MiB per rank, its reduce-scatter at most 16 MiB of input: beyond, the table
#               says so)
#   ag-N, rs-N  the issue's run for them: N = 2, 4, 8 emulated ranks, 1 KiB-4 MiB per rank by x4
#               (nccl-tests' size: N KiB-4N MiB), bf16, CUDA graphs
#   ag-procs-2, rs-procs-2
#               as procs below, for them: 2 rank processes sharing GPU 0 (correctness only)
#   procs       vLLM one process per rank (CUDA IPC handles over tpar's control plane, graph
#               inputs registered by IPC), 2 and 4 rank processes sharing GPU 0: a correctness
#               test of that mode; the processes time-slice the GPU, so its times mean nothing
# Writes OUT/summary.txt (PASS/FAIL/SKIP per step), OUT/compare.txt (every tpar-against-vLLM
# table), OUT/vllm.log (everything), OUT/nvcc.log, OUT/*.json (+ *.peers.json).
# Exit status: 0 all passed; 1 a step failed (a wrong result, a crash, a timeout); 3 nvcc or
# the headers are missing (nothing was measured; said in summary.txt).
#
# The GPU machine has no network: fetch here first and carry SRC and the tpar binary, e.g.
#   bash bench/compare/vllm.sh fetch && cargo build --release -p tpar-cli
#   run(carry=[".gpu/vllm-src", "target/release/tpar"],
#       command="OUT=$OUT bash bench/compare/vllm.sh run")
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

# The pinned source distribution of vllm 0.33.0, fetched by name with pip (the index it is
# configured with) and checked by pip against this sha256 (--require-hashes) before pip
# unpacks it. pip then prepares its metadata, which runs vLLM's setup.py: that needs torch
# and CUDA, so on a machine without them it fails after unpacking; --no-clean keeps the
# unpacked tree (in a private TMPDIR), and the three headers are taken from it. Where the
# metadata step succeeds, pip saves the archive too, and it is checked again here.
VLLM_VERSION=0.33.0
VLLM_SDIST_SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
HEADERS=(csrc/custom_all_reduce.cuh csrc/custom_collective_common.cuh csrc/custom_all_gather_reduce_scatter.cuh)

MODE="${1:-run}"; [ $# -gt 0 ] && shift

fetch() {
    local src="${1:-$ROOT/.gpu/vllm-src}" work tree="" tgz h py
    mkdir -p "$src"
    py="$(command -v python3 || command -v python)" || { echo "fetch: no python3 for pip" >&2; return 1; }
    work="$(mktemp -d)"
    echo "vllm==$VLLM_VERSION --hash=sha256:$VLLM_SDIST_SHA256" >"$work/req.txt"
    mkdir -p "$work/tmp" "$work/out"
    echo "# pip download vllm==$VLLM_VERSION (source distribution, sha256 pinned)"
    TMPDIR="$work/tmp" "$py" -m pip download --disable-pip-version-check --no-cache-dir --no-deps \
        --no-binary vllm --no-build-isolation --no-clean --require-hashes -r "$work/req.txt" -d "$work/out" \
        >"$work/pip.log" 2>&1
    if grep -q "DO NOT MATCH THE HASHES" "$work/pip.log"; then
        grep -A3 "Expected sha256" "$work/pip.log" >&2
        echo "pip refused vllm-$VLLM_VERSION.tar.gz: its sha256 is not $VLLM_SDIST_SHA256" >&2
        rm -rf "$work"; return 1
    fi
    tgz="$work/out/vllm-$VLLM_VERSION.tar.gz"
    if [ -f "$tgz" ]; then
        if ! echo "$VLLM_SDIST_SHA256  $tgz" | sha256sum -c --status; then
            echo "sha256 of $tgz is $(sha256sum "$tgz" | cut -c1-64), expected $VLLM_SDIST_SHA256: refusing it" >&2
            rm -rf "$work"; return 1
        fi
        mkdir -p "$work/x"
        tar -xzf "$tgz" -C "$work/x" "${HEADERS[@]/#/vllm-$VLLM_VERSION/}" && tree="$work/x/vllm-$VLLM_VERSION"
    else
        # The tree pip unpacked after checking the hash (its metadata step failed: no CUDA here).
        h="$(find "$work/tmp" -path "*/${HEADERS[0]}" -print -quit)"
        [ -n "$h" ] && tree="${h%/"${HEADERS[0]}"}"
    fi
    if [ -z "$tree" ]; then
        tail -20 "$work/pip.log" >&2
        echo "fetch: pip did not fetch vllm==$VLLM_VERSION (log above)" >&2
        rm -rf "$work"; return 1
    fi
    for h in "${HEADERS[@]}"; do cp "$tree/$h" "$src/" || { rm -rf "$work"; return 1; }; done
    rm -rf "$work"
    {
        echo "vllm $VLLM_VERSION source distribution"
        echo "fetched by name: pip download --no-binary vllm vllm==$VLLM_VERSION"
        echo "sha256 $VLLM_SDIST_SHA256 (checked by pip --require-hashes $(date -u +%FT%TZ): OK)"
        (cd "$src" && sha256sum "${HEADERS[@]##*/}")
    } >"$src/SOURCE"
    echo "# vLLM $VLLM_VERSION headers in $src ($(du -sh "$src" | cut -f1))"
    cat "$src/SOURCE"
}

# Finds nvcc and the GPU's architecture, compiles peer.cu against SRC's headers into BUILD.
# Prints the command and every line nvcc writes. Returns 3 when nvcc or the headers are absent.
build() {
    local src="$1" build="$2" log="$3" nvcc arch cc
    nvcc="$(command -v nvcc || true)"
    [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
    if [ -z "$nvcc" ]; then
        echo "SKIP: no nvcc on this machine (PATH, /usr/local/cuda/bin): vLLM's kernel cannot be built here" | tee -a "$log"
        return 3
    fi
    for h in "${HEADERS[@]##*/}"; do
        if [ ! -f "$src/$h" ]; then
            echo "SKIP: $src/$h missing: run 'bash bench/compare/vllm.sh fetch' on a machine with network and carry $src" | tee -a "$log"
            return 3
        fi
    done
    if [ -f "$src/SOURCE" ] && ! (cd "$src" && tail -n ${#HEADERS[@]} SOURCE | sha256sum -c --status); then
        echo "FAIL: the headers in $src differ from the ones fetched (SOURCE)" | tee -a "$log"
        return 1
    fi
    cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
    arch="sm_${cc:-90}"
    # libcuda for cuPointerGetAttribute (vLLM's get_graph_buffer_ipc_meta): the toolkit's stub
    # at build time, the driver's libcuda.so.1 at run time.
    local home stubs=()
    home="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc")")")}"
    for d in "$home/lib64/stubs" "$home/targets/x86_64-linux/lib/stubs"; do
        [ -f "$d/libcuda.so" ] && { stubs=(-L"$d"); break; }
    done
    mkdir -p "$build"
    local cmd=("$nvcc" -O3 -std=c++17 -arch="$arch" -shared -Xcompiler -fPIC -I"$src" -o "$build/libtpar_vllm_ar.so"
        "$HERE/vllm_ar/peer.cu" "${stubs[@]}" -lcuda)
    { echo "# $("$nvcc" --version | tail -2 | tr '\n' ' ')"; echo "\$ ${cmd[*]}"; } | tee -a "$log"
    local t0=$SECONDS
    if ! "${cmd[@]}" >>"$log" 2>&1; then
        echo "FAIL: nvcc failed; its output:" ; cat "$log"
        return 1
    fi
    echo "# built $build/libtpar_vllm_ar.so in $((SECONDS - t0)) s ($(du -h "$build/libtpar_vllm_ar.so" | cut -f1))" | tee -a "$log"
}

case "$MODE" in
fetch) fetch "$@"; exit $? ;;
build)
    SRC="${1:-$ROOT/.gpu/vllm-src}"; OUT="${OUT:-$ROOT/.gpu/vllm-out}"; mkdir -p "$OUT"
    build "$SRC" "$ROOT/.gpu/vllm-build" "$OUT/nvcc.log"; exit $? ;;
run) ;;
-h|--help) sed -n '2,43p' "$0"; exit 0 ;;
*) echo "usage: vllm.sh fetch [SRC] | build [SRC] | run [--tpar BIN] [--src SRC] [--quick] [--collectives LIST]" >&2; exit 2 ;;
esac

BIN="$ROOT/target/release/tpar"; SRC="$ROOT/.gpu/vllm-src"; QUICK=0; COLLECTIVES=all-reduce,all-gather,reduce-scatter
while [ $# -gt 0 ]; do
    case "$1" in
        --tpar) BIN="$2"; shift 2 ;;
        --src) SRC="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --collectives) COLLECTIVES="$2"; shift 2 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for c in ${COLLECTIVES//,/ }; do
    case "$c" in all-reduce|all-gather|reduce-scatter) ;; *) echo "--collectives: unknown $c (all-reduce, all-gather, reduce-scatter)" >&2; exit 2 ;; esac
done
runs() { case ",$COLLECTIVES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
OUT="${OUT:-$ROOT/.gpu/vllm-out}"; mkdir -p "$OUT"
LOG="$OUT/vllm.log"; : >"$LOG"; : >"$OUT/nvcc.log"
BUILD="$ROOT/.gpu/vllm-build"; LIB="$BUILD/libtpar_vllm_ar.so"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/tpar-vllm-cache}"
T0=$SECONDS; BUDGET=${BUDGET:-560}; summary=(); failed=0

[ -x "$BIN" ] || { echo "no tpar binary at $BIN (cargo build --release -p tpar-cli here, carry target/release/tpar)" | tee "$OUT/summary.txt"; exit 2; }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  echo "tpar $(sha256sum "$BIN" | cut -c1-16)"; "$BIN" --version; cat "$SRC/SOURCE" 2>/dev/null; } >>"$LOG" 2>&1

build "$SRC" "$BUILD" "$OUT/nvcc.log"; rc=$?
cat "$OUT/nvcc.log" >>"$LOG"
if [ $rc -ne 0 ]; then
    { [ $rc -eq 3 ] && grep -m1 '^SKIP' "$OUT/nvcc.log" || echo "FAIL  build (see nvcc.log)"; } | tee "$OUT/summary.txt"
    exit $rc
fi
summary+=("PASS  build ($(grep -m1 '^# built' "$OUT/nvcc.log" | sed 's/^# //'))")

# step NAME LIMIT [ENV=V ...] -- tpar ARGS...   (skipped, and said so, when the budget is short)
step() {
    local name="$1" limit="$2"; shift 2
    local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local el=$((SECONDS - T0))
    if [ $((el + limit / 2)) -gt "$BUDGET" ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
    echo "=== $name (t=${el}s): ${envs[*]} tpar $*" >>"$LOG"
    local t=$SECONDS out="$OUT/step-$name.txt"
    env "${envs[@]}" timeout "$limit" "$BIN" "$@" >"$out" 2>&1; local rc=$?
    cat "$out" >>"$LOG"; echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
    if [ $rc -eq 0 ]; then summary+=("PASS  $name ($((SECONDS - t)) s)")
    elif [ $rc -eq 124 ]; then summary+=("FAIL  $name: timed out after $limit s (a hang: see the log)"); failed=1
    else summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s): $(grep -m1 'error' "$out")"); failed=1; fi
    # Every comparison table of the step, with its command, for compare.txt.
    # (From each group's "# peer:" line to the next group's first line.)
    { echo "=== $name: ${envs[*]:1} tpar $*"; awk '/^# group: |^# tpar bench/ {s=0} /^# group: / {print} /^# peer: / {s=1} s' "$out"; echo; } >>"$OUT/compare.txt"
}
: >"$OUT/compare.txt"
V="vllm=$LIB"
MAIN=(bench --mode graph -b 1K -e 16M -f 4 -d bfloat16 -n 50 -w 5 --sequence 122x43008 --compare "$V")
if ! runs all-reduce; then
    :
elif [ $QUICK -eq 1 ]; then
    step pdl1-8 150 TPAR_PDL=1 -- "${MAIN[@]}" --emulate-ranks 8 --json "$OUT/pdl1-8.json"
    step pdl0-8 150 TPAR_PDL=0 -- "${MAIN[@]}" --emulate-ranks 8 --json "$OUT/pdl0-8.json"
else
    step correct 120 -- bench --emulate-ranks 2,8 --mode both -b 1K -e 4M -f 16 -d all -n 3 -w 1 --algo oneshot-push,twoshot-push --compare "$V"
    step pdl1 200 TPAR_PDL=1 -- "${MAIN[@]}" --emulate-ranks 2,4,8 --json "$OUT/pdl1.json"
    step pdl0 200 TPAR_PDL=0 -- "${MAIN[@]}" --emulate-ranks 2,4,8 --json "$OUT/pdl0.json"
    for s in 1stage 2stage; do
        step "$s-8" 60 VLLM_CUSTOM_ALLREDUCE_ALGO=$s -- bench --emulate-ranks 8 --mode graph -b 64K -e 4M -f 4 -d bfloat16 -n 50 -w 5 --compare "$V" --json "$OUT/$s-8.json"
    done
    for w in 2 4; do
        step "procs-$w" 90 TPAR_TIMEOUT_MS=20000 -- bench --backend cuda --world $w --plan-topology h200-nvswitch-8 -b 1K -e 256K -f 16 -d bfloat16 -n 2 -w 1 --graph-inner 2 --algo oneshot-push --compare "$V"
    done
fi
# The all-gather and the reduce-scatter (sizes as nccl-tests gives them: the all-gather's
# output, the reduce-scatter's input; per rank 1 KiB-4 MiB is N KiB-4N MiB at N ranks), by
# both of tpar's kernels for them (one-shot push, one-shot pull).
for c in all-gather reduce-scatter; do
    runs $c || continue
    k=ag; [ "$c" = reduce-scatter ] && k=rs
    if [ $QUICK -eq 0 ]; then
        for w in 2 8; do
            step "$k-correct-$w" 90 -- bench --collective $c --emulate-ranks $w --mode both -b $((w))K -e $((4 * w))M -f 16 -d all -n 3 -w 1 --algo oneshot-push,oneshot-pull --compare "$V"
        done
    fi
    for w in $([ $QUICK -eq 1 ] && echo 8 || echo 2 4 8); do
        step "$k-$w" 120 -- bench --collective $c --emulate-ranks $w --mode graph -b $((w))K -e $((4 * w))M -f 4 -d bfloat16 -n 50 -w 5 --algo oneshot-push,oneshot-pull --compare "$V" --json "$OUT/$k-$w.json"
    done
    if [ $QUICK -eq 0 ]; then
        step "$k-procs-2" 90 TPAR_TIMEOUT_MS=20000 -- bench --collective $c --backend cuda --world 2 --plan-topology h200-nvswitch-8 -b 2K -e 512K -f 16 -d bfloat16 -n 2 -w 1 --graph-inner 2 --algo oneshot-push,oneshot-pull --compare "$V"
    fi
done
printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
echo "total $((SECONDS - T0)) s" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"; echo; cat "$OUT/compare.txt"
gzip -kf "$LOG"
exit $failed
