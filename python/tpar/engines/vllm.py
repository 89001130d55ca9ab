"""vLLM plug-in (entry point ``vllm.general_plugins``): with ``TPAR_ENABLE=1``, vLLM's
tensor-parallel groups build :class:`~tpar.engines.common.TparCustomAllreduce` instead of
vLLM's ``CustomAllreduce``.

``CudaCommunicator.__init__`` imports ``CustomAllreduce`` from
``vllm.distributed.device_communicators.custom_all_reduce`` inside the function, so replacing
that module attribute before the groups are built (plug-ins load first) is enough.
``--disable-custom-all-reduce`` still switches it off, as for vLLM's own class.
"""

from tpar.engines import fusion
from tpar.engines.common import TparCustomAllreduce, patch_engine

#: Where vLLM looks the class up, and its name there.
TARGET_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "CustomAllreduce"


def register() -> None:
    """The entry point. Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    patch_engine("vLLM", TARGET_MODULE, TARGET_ATTR, TparCustomAllreduce)
    fusion.install("vllm")  # its fused all-reduce + RMSNorm, to tpar (tpar/engines/fusion.py)
