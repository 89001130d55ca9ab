#!/usr/bin/env bash
# Installs NVRTC from the pinned pip wheel into the project-local, git-ignored .nvrtc/, for
# the kernel compile test on machines without CUDA (CI). The pin matches the GPU machine's
# CUDA 13.0: a newer NVRTC emits PTX that its driver refuses.
#
# Prints the two variables the test reads; use it as:
#   eval "$(scripts/install-nvrtc.sh)"   # sets TPAR_NVRTC_LIB and LD_LIBRARY_PATH
#   cargo test -p tpar --features cuda --test nvrtc_compile
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.nvrtc"
pin="nvidia-cuda-nvrtc==13.0.88"
lib="$dest/nvidia/cu13/lib/libnvrtc.so.13"
if [ ! -e "$lib" ]; then
    echo "installing $pin into $dest" >&2
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps --target "$dest" "$pin" >&2
fi
if [ ! -e "$lib" ]; then
    found="$(find "$dest" -name 'libnvrtc.so.13' -print -quit 2>/dev/null || true)"
    if [ -z "$found" ]; then
        echo "install-nvrtc.sh: libnvrtc.so.13 not found under $dest after installing $pin" >&2
        exit 1
    fi
    lib="$found"
fi
libdir="$(dirname "$lib")"
echo "export TPAR_NVRTC_LIB=$lib"
echo "export LD_LIBRARY_PATH=$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
