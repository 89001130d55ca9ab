"""tpar: a fabric-aware all-reduce for tensor-parallel LLM inference inside one host.

| module | what |
|---|---|
| ``tpar.torch`` | ``Communicator`` from a ``torch.distributed`` group: CUDA tensors on torch's current stream (graphs included), CPU tensors through shared memory; ``torch.ops.tpar.all_reduce`` |
| ``tpar.engines`` | drop-in custom all-reduce for vLLM and SGLang, switched on by ``TPAR_ENABLE=1`` |
| ``tpar._tpar`` | the native module (Rust, PyO3): raw addresses, no torch |

Every error is an exception of the ``TparError`` family carrying tpar's own message, which
names the rank and the peer or field involved. ``import tpar`` does not import torch.

At import, the package tells the native module where this Python environment keeps its CUDA
libraries, so that tpar finds NVRTC and NCCL where the engine's torch finds its own: the
directories that hold the ``nvidia`` namespace package (pip's ``nvidia-cuda-nvrtc``,
``nvidia-nccl-cu13``), torch's ``lib`` directory and ``sys.prefix``'s ``lib`` (conda), in
that order; the system's loader path comes after them, ``TPAR_NVRTC_LIB`` / ``TPAR_NCCL_LIB``
before them.
"""

import importlib.util as _importlib_util
import os as _os
import sys as _sys

from tpar._tpar import (  # noqa: F401
    AbortedError,
    ConfigError,
    CpuComm,
    GpuComm,
    InvalidArgumentError,
    LibraryError,
    MismatchError,
    PeerDiedError,
    PoisonedError,
    TparError,
    TparTimeoutError,
    UnsupportedError,
    __version__,
)
from tpar import _tpar


def _environment_dirs():
    """This environment's directories for NVRTC and NCCL, found without importing anything:
    each directory holding the ``nvidia`` namespace package (``sys.path`` order, as torch
    searches), torch's ``lib``, ``sys.prefix``'s ``lib``."""
    dirs = []

    def spec_of(name):
        try:
            return _importlib_util.find_spec(name)
        except (ImportError, ValueError):
            return None

    nvidia = spec_of("nvidia")
    for d in (nvidia.submodule_search_locations or []) if nvidia is not None else []:
        dirs.append(_os.path.dirname(_os.path.abspath(d)))
    torch = spec_of("torch")
    if torch is not None and torch.origin:
        dirs.append(_os.path.join(_os.path.dirname(torch.origin), "lib"))
    dirs.append(_os.path.join(_sys.prefix, "lib"))
    seen = set()
    return [d for d in dirs if not (d in seen or seen.add(d))]


_tpar.set_library_dirs(_environment_dirs())

__all__ = [
    "TparError",
    "TparTimeoutError",
    "PeerDiedError",
    "AbortedError",
    "MismatchError",
    "PoisonedError",
    "InvalidArgumentError",
    "UnsupportedError",
    "LibraryError",
    "ConfigError",
    "CpuComm",
    "GpuComm",
    "__version__",
]
