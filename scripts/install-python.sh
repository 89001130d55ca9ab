#!/usr/bin/env bash
# Makes .venv/ (git-ignored) with what tpar's Python tests need: maturin, pytest, numpy, and
# torch 2.11.0 (the GPU machine's version) for CPU use. Idempotent: a complete .venv is kept.
#
# Why not plain `pip install torch`: on x86_64 Linux, PyPI's torch pulls triton, cuda-bindings
# and every CUDA library (cusolver, nvrtc, nvtx, ...). torch is installed with --no-deps, plus
# only the wheels its shared libraries are linked against (libtorch_cuda.so, libtorch_python.so,
# libtorch_nvshmem.so name them as DT_NEEDED, so `import torch` fails without them even on a
# CPU-only machine): about 2.5 GB to download, 3.5 GB on disk, 1-2 minutes. triton,
# cuda-bindings, cusolver (loaded lazily), nvrtc and nvtx are left out; gloo, CPU tensors,
# torch.library and torch.multiprocessing work without them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP="$VENV/.tpar-complete-1"
if [ -f "$STAMP" ]; then exit 0; fi
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir)
"${PIP[@]}" "maturin>=1.9.3,<2" pytest numpy filelock "typing-extensions>=4.10" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" "setuptools<82"
"${PIP[@]}" --no-deps torch==2.11.0
# The versions torch 2.11.0 pins (its Requires-Dist), libraries only.
"${PIP[@]}" --no-deps \
    cuda-toolkit==13.0.2 \
    "nvidia-cuda-runtime==13.0.96" "nvidia-cublas==13.1.0.3" "nvidia-cufft==12.0.0.61" "nvidia-cufile==1.15.1.6" \
    "nvidia-curand==10.4.0.35" "nvidia-cusparse==12.6.3.3" "nvidia-nvjitlink==13.0.88" "nvidia-cuda-cupti==13.0.85" \
    nvidia-cudnn-cu13==9.19.0.56 nvidia-cusparselt-cu13==0.8.0 nvidia-nccl-cu13==2.28.9 nvidia-nvshmem-cu13==3.4.5
"$VENV/bin/python" -c 'import torch, torch.distributed as d; assert d.is_gloo_available(); print("torch", torch.__version__, "ready (CPU, gloo)")' >&2
touch "$STAMP"
