"""tpar: a fabric-aware all-reduce for tensor-parallel LLM inference inside one host.

| module | what |
|---|---|
| ``tpar.torch`` | ``Communicator`` from a ``torch.distributed`` group: CUDA tensors on torch's current stream (graphs included), CPU tensors through shared memory; ``torch.ops.tpar.all_reduce`` |
| ``tpar.engines`` | drop-in custom all-reduce for vLLM and SGLang, switched on by ``TPAR_ENABLE=1`` |
| ``tpar._tpar`` | the native module (Rust, PyO3): raw addresses, no torch |

Every error is an exception of the ``TparError`` family carrying tpar's own message, which
names the rank and the peer or field involved. ``import tpar`` does not import torch.
"""

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
