"""SGLang plug-in (entry point ``sglang.srt.plugins``): with ``TPAR_ENABLE=1``, SGLang's
groups build :class:`SglangCustomAllreduce` (tpar's drop-in) instead of the class that
``dispatch_custom_allreduce`` would pick.

``GroupCoordinator.__init__`` imports ``dispatch_custom_allreduce`` from
``sglang.srt.distributed.device_communicators.custom_all_reduce`` inside the function and
calls it for the class to instantiate. The replacement checks each call against the original
function's signature (a TypeError, which SGLang logs before falling back to NCCL, rather than
tpar's class for a call it does not understand) and leaves ROCm to the original (tpar runs on
CUDA and CPUs). ``--disable-custom-all-reduce`` still switches it off.

SGLang auto-enables FlashInfer's all-reduce + RMSNorm fusion for some MoE models on sm_90/100;
the all-reduces it fuses never reach tpar. That is decided in the server's arguments before
plug-ins run in the scheduler processes, so each TP group's rank 0 warns with the setting
that turns it off (``--enforce-disable-flashinfer-allreduce-fusion``).
"""

import inspect
import sys

from tpar.engines.common import TparCustomAllreduce, logger, patch_engine

TARGET_MODULE = "sglang.srt.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "dispatch_custom_allreduce"
FUSION_OFF = "--enforce-disable-flashinfer-allreduce-fusion"


class SglangCustomAllreduce(TparCustomAllreduce):
    """tpar's drop-in as SGLang builds it: a start-up warning from SGLang's own settings."""

    def _engine_checks(self) -> None:
        if self.rank != 0:
            return
        try:
            from sglang.srt.runtime_context import get_exec

            backend = get_exec().comm.flashinfer_allreduce_fusion_backend
        except Exception as e:  # noqa: BLE001 - no published server arguments (tests) or a new layout
            logger.debug("tpar: SGLang settings not checked: %s", e)
            return
        if backend is not None:
            logger.warning(
                "tpar: SGLang's FlashInfer all-reduce fusion is on (flashinfer_allreduce_fusion_backend=%s, auto-enabled "
                "for some MoE models on sm_90/100): the all-reduces it fuses run in FlashInfer's kernel, not tpar's. "
                "Start the server with %s to give them to tpar", backend, FUSION_OFF,
            )


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
