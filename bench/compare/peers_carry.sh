#!/usr/bin/env bash
# The multi-GPU peers' packages, prepared here (with network) for a GPU machine without one,
# and run there. bench/compare/README.md ("FlashInfer and b12x") says why and what it shows.
#
#   bash bench/compare/peers_carry.sh pack [DIR]     here: download the pinned wheels for
#                                                    CPython 3.12 x86_64, install them into
#                                                    staging folders, slim FlashInfer, pack
#                                                    DIR/flashinfer-site.tar.xz (one carry) and
#                                                    DIR/b12x-wheels.tar.part-* (two carries:
#                                                    each part 60 MiB at most); DIR default .gpu/peers
#   OUT=... bash bench/compare/peers_carry.sh run [DIR] [ARGS...]
#                                                    on a machine with 2+ GPUs: unpack what DIR
#                                                    holds into .gpu/peers-site (kept while the
#                                                    machine stays warm), install tpar's wheel
#                                                    (DIR/*.whl) beside it, and run
#                                                    peers_multi_gpu.py on every GPU; ARGS go to it
#
# Carry plan (64 MiB per call, three calls on one warm machine): call 1 carries
# DIR/flashinfer-site.tar.xz (31 MB), DIR/SHA256SUMS and the tpar wheel, and runs NCCL, tpar
# and FlashInfer; call 2 carries DIR/b12x-wheels.tar.part-aa (60 MiB) with
# PEERS_WAIT_FOR_B12X=1 (unpack only); call 3 carries part-ab and runs everything. Each `run`
# keeps what it unpacked in .gpu/peers-site, so the last call has everything.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODE="${1:?usage: peers_carry.sh pack [DIR] | run [DIR] [ARGS...]}"; shift
DIR="${1:-$ROOT/.gpu/peers}"; [ $# -gt 0 ] && shift

# Pinned: the versions bench/compare/peers_multi_gpu.py's calls were read against, and the
# wheels `import flashinfer.comm.pcie_ipc_ar` / `import b12x.comm.pcie` need beyond what the
# GPU machine has (torch 2.11, numpy, transformers).
FLASHINFER=(flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2 cuda-python cuda-bindings cuda-pathfinder
    nvidia-ml-py requests urllib3 idna certifi tqdm ninja)
B12X=(b12x==1.5.1 nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0 nvidia-cutlass-dsl-libs-core==4.8.0
    nvidia-cutlass-dsl-libs-cu13==4.8.0 apache-tvm-ffi==0.1.15.post2 cuda-python cuda-bindings cuda-pathfinder rich
    markdown-it-py mdurl pygments)
PLATFORM=(--only-binary :all: --python-version 3.12 --implementation cp --abi cp312
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64
    --platform manylinux1_x86_64)
PART_BYTES=60m

stage() {  # NAME PKGS...: wheels into DIR/wheels-NAME, installed into DIR/stage-NAME
    local name="$1"; shift
    local wheels="$DIR/wheels-$name" st="$DIR/stage-$name"
    rm -rf "$st"; mkdir -p "$wheels" "$st"
    python3 -m pip download --quiet --no-deps "${PLATFORM[@]}" -d "$wheels" "$@"
    python3 -m pip install --quiet --no-deps --no-index "${PLATFORM[@]}" --target "$st" "$wheels"/*.whl
    echo "# $name: $(ls "$wheels" | wc -l) wheels, $(du -sh "$wheels" | cut -f1) downloaded, $(du -sh "$st" | cut -f1) installed"
}

case "$MODE" in
pack)
    mkdir -p "$DIR"
    stage flashinfer "${FLASHINFER[@]}"
    # The PCIe IPC all-reduce's JIT build needs data/csrc/pcie_ipc_all_reduce.cu, the
    # headers beside it and data/include; CUTLASS, CCCL and the other 270 kernel sources
    # (about 320 MB unpacked) serve other kernels.
    fi="$DIR/stage-flashinfer/flashinfer/data"
    rm -rf "$fi/cutlass" "$fi/cccl"
    find "$fi/csrc" -type f ! -name 'pcie_ipc_*' ! -name '*.h' -delete
    tar -C "$DIR/stage-flashinfer" -cf - . | xz -6 -T0 >"$DIR/flashinfer-site.tar.xz"
    # b12x travels as its wheels (already compressed; xz saves little on them and takes long
    # on a small machine), one tar split into parts, installed on the GPU machine by pip.
    stage b12x "${B12X[@]}"
    rm -f "$DIR"/b12x-wheels.tar.part-*
    tar -C "$DIR/wheels-b12x" -cf - . | split -b "$PART_BYTES" - "$DIR/b12x-wheels.tar.part-"
    (cd "$DIR" && sha256sum flashinfer-site.tar.xz b12x-wheels.tar.part-* >SHA256SUMS)
    ls -la "$DIR"/flashinfer-site.tar.xz "$DIR"/b12x-wheels.tar.part-* "$DIR/SHA256SUMS"
    echo "# carry: call 1 $DIR/flashinfer-site.tar.xz + $DIR/b12x-wheels.tar.part-aa + SHA256SUMS + a tpar wheel in $DIR;"
    echo "#        call 2 the remaining part(s); see bench/compare/README.md"
    ;;
run)
    SITE="$ROOT/.gpu/peers-site"; OUT="${OUT:-$ROOT/.gpu/peers-out}"; mkdir -p "$SITE" "$OUT"
    GPUS=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
    if [ "$GPUS" -lt 2 ]; then
        echo "SKIP: $GPUS GPU(s) here; these peers need one GPU per rank (processes sharing a GPU are time-sliced, so they would measure the scheduler). Unpacking only." | tee "$OUT/summary.txt"
    fi
    if [ -f "$DIR/flashinfer-site.tar.xz" ] && [ ! -f "$SITE/.flashinfer" ]; then
        tar -C "$SITE" -xJf "$DIR/flashinfer-site.tar.xz" && touch "$SITE/.flashinfer"
    fi
    # b12x arrives in parts over two calls: installed once every part listed in SHA256SUMS is here.
    for p in "$DIR"/b12x-wheels.tar.part-*; do [ -f "$p" ] && cp "$p" "$SITE/"; done
    [ -f "$DIR/SHA256SUMS" ] && cp "$DIR/SHA256SUMS" "$SITE/"
    if [ ! -f "$SITE/.b12x" ] && [ -f "$SITE/SHA256SUMS" ] && (cd "$SITE" && grep 'part-' SHA256SUMS | sha256sum -c --status); then
        mkdir -p "$SITE/.b12x-wheels"
        cat "$SITE"/b12x-wheels.tar.part-* | tar -C "$SITE/.b12x-wheels" -xf -
        python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$SITE"/.b12x-wheels/*.whl \
            && touch "$SITE/.b12x" && rm -rf "$SITE"/b12x-wheels.tar.part-* "$SITE/.b12x-wheels"
    fi
    if [ ! -f "$SITE/.b12x" ] && [ "${PEERS_WAIT_FOR_B12X:-0}" = 1 ]; then
        echo "# b12x incomplete (parts here: $(ls "$SITE"/b12x-wheels.tar.part-* 2>/dev/null | xargs -n1 basename | tr '\n' ' ')); PEERS_WAIT_FOR_B12X=1: unpacked only" | tee -a "$OUT/summary.txt"
        exit 0
    fi
    whl=$(ls "$DIR"/tpar-*.whl 2>/dev/null | head -1 || true)
    [ -n "$whl" ] && python3 -m pip install --quiet --no-index --no-deps --upgrade --target "$SITE" "$whl"
    echo "# site: flashinfer $([ -f "$SITE/.flashinfer" ] && echo yes || echo no), b12x $([ -f "$SITE/.b12x" ] && echo yes || echo "no (parts missing, or its install failed: see above)"), tpar $([ -d "$SITE/tpar" ] && echo yes || echo no)" | tee -a "$OUT/summary.txt"
    [ "$GPUS" -lt 2 ] && exit 5
    methods="nccl"
    [ -d "$SITE/tpar" ] && methods="$methods,tpar"
    [ -f "$SITE/.flashinfer" ] && methods="$methods,flashinfer"
    [ -f "$SITE/.b12x" ] && methods="$methods,b12x-oneshot,b12x-dma"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:/usr/local/cuda/bin:$PATH" NCCL_NVLS_ENABLE=0
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    set +e
    timeout 560 python3 -m torch.distributed.run --standalone --nproc-per-node "$GPUS" "$HERE/peers_multi_gpu.py" \
        --out "$OUT" --methods "$methods" --sequence 122x43008 "$@" >"$OUT/peers.txt" 2>"$OUT/peers.log"
    rc=$?
    echo "peers_multi_gpu.py: rc=$rc ($methods on $GPUS GPUs)" | tee -a "$OUT/summary.txt"
    cat "$OUT/peers.txt"; tail -n 30 "$OUT/peers.log"
    exit $rc
    ;;
*) echo "usage: peers_carry.sh pack [DIR] | run [DIR] [ARGS...]" >&2; exit 2 ;;
esac
