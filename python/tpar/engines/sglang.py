"""SGLang plug-in (entry point ``sglang.srt.plugins``): with ``TPAR_ENABLE=1``, SGLang's
groups build :class:`SglangCustomAllreduce` (tpar's drop-in) instead of the class that
``dispatch_custom_allreduce`` would pick.

``GroupCoordinator.__init__`` imports ``dispatch_custom_allreduce`` from
``sglang.srt.distributed.device_communicators.custom_all_reduce`` inside the function and
calls it for the class to instantiate. The replacement checks each call against the original
function's signature (a TypeError, which SGLang logs before falling back to NCCL, rather than
tpar's class for a call it does not understand) and leaves ROCm to the original (tpar runs on
CUDA and CPUs). ``--disable-custom-all-reduce`` still switches it off.

SGLang's FlashInfer all-reduce + RMSNorm fusion (auto-enabled for some MoE models on
sm_90/100) is routed to tpar's fused kernel (:mod:`tpar.engines.fusion`).
"""

import inspect
import sys

from tpar.engines import fusion
from tpar.engines.common import TparCustomAllreduce, patch_engine

TARGET_MODULE = "sglang.srt.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "dispatch_custom_allreduce"


class SglangCustomAllreduce(TparCustomAllreduce):
    """tpar's drop-in as SGLang builds it (SGLang's own name for it in logs and checks)."""


def _original():
    mod = sys.modules.get(TARGET_MODULE)
    return getattr(mod, "_tpar_original_" + TARGET_ATTR, None) if mod is not None else None


def dispatch_custom_allreduce(*args, **kwargs):
    """Replacement of SGLang's dispatcher: tpar's class, for calls the original accepts."""
    original = _original()
    if original is not None:
        inspect.signature(original).bind(*args, **kwargs)  # TypeError: SGLang's call changed
        import torch

        if getattr(torch.version, "hip", None):
            return original(*args, **kwargs)  # ROCm: tpar runs on CUDA and CPUs
    return SglangCustomAllreduce


def register() -> None:
    """The entry point. Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    patch_engine("SGLang", TARGET_MODULE, TARGET_ATTR, dispatch_custom_allreduce)
    fusion.install("sglang")  # its fused all-reduce + RMSNorm, to tpar (tpar/engines/fusion.py)
