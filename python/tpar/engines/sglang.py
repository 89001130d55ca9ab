"""SGLang plug-in (entry point ``sglang.srt.plugins``): with ``TPAR_ENABLE=1``, SGLang's
groups build :class:`SglangCustomAllreduce` (tpar's drop-in) instead of the class that
``dispatch_custom_allreduce`` would pick.

``GroupCoordinator.__init__`` imports ``dispatch_custom_allreduce`` from
``sglang.srt.distributed.device_communicators.custom_all_reduce`` inside the function and
calls it for the class to instantiate. The replacement checks each call against the original
function's signature (a TypeError, which SGLang logs before falling back to NCCL, rather than
tpar's class for a call it does not understand) and leaves ROCm to the original (tpar runs on
CUDA and CPUs). ``--disable-custom-all-reduce`` still switches it off.

The all-gather and the reduce-scatter (DP attention's gathers, ``dp_gather_partial``,
``dp_reduce_scatter_tensor``, ``attn_tp_all_gather_into_tensor`` ...): every one of SGLang's
reaches ``GroupCoordinator._all_gather_into_tensor(output, input)`` /
``_reduce_scatter_tensor(output, input)`` (through its custom ops
``reg_all_gather_into_tensor`` / ``reg_reduce_scatter_tensor`` on CUDA, directly on CPUs),
which on CUDA ask no custom object, only MSCCL++ and pynccl. The plug-in wraps those two
methods of the class: on a group whose ``ca_comm`` is tpar's enabled drop-in, a call that
fits and that tpar's plan gives to one of tpar's kernels runs there
(:meth:`SglangCustomAllreduce.serve_collective`); every other call runs SGLang's original
method unchanged.

SGLang's FlashInfer all-reduce + RMSNorm fusion (auto-enabled for some MoE models on
sm_90/100) is routed to tpar's fused kernel (:mod:`tpar.engines.fusion`).
"""

import inspect
import sys

from tpar.engines import fusion
from tpar.engines.common import TparCustomAllreduce, _say, enabled, logger, patch_engine

TARGET_MODULE = "sglang.srt.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "dispatch_custom_allreduce"

#: Where ``GroupCoordinator`` lives, and the two methods its all-gathers and reduce-scatters
#: end in (the custom ops ``reg_all_gather_into_tensor`` / ``reg_reduce_scatter_tensor`` call
#: them by these names).
GROUP_MODULE = "sglang.srt.distributed.parallel_state"
GROUP_CLASS = "GroupCoordinator"
COLLECTIVES = {"_all_gather_into_tensor": "all-gather", "_reduce_scatter_tensor": "reduce-scatter"}


class SglangCustomAllreduce(TparCustomAllreduce):
    """tpar's drop-in as SGLang builds it (SGLang's own name for it in logs and checks)."""

    def serve_collective(self, group, collective: str, output, input) -> bool:  # noqa: A002 - SGLang's names
        """SGLang's ``GroupCoordinator._all_gather_into_tensor`` / ``_reduce_scatter_tensor``
        of ``input`` into ``output`` run by tpar: True when tpar ran it (its counter grew),
        False to leave it to SGLang's own path, which then runs unchanged. tpar takes a call
        when both tensors are eligible (dtype, contiguous, this device, 16-byte aligned), of
        one dtype, of the sizes the collective defines (``output`` ``world`` times
        ``input``, or the reverse), not overlapping (NCCL's in-place forms stay NCCL's), whole
        16-byte parts per rank within ``max_size``, tpar's plan names one of its kernels, and
        the user did not give these tensors to another backend: MSCCL++ where it would take
        the all-gather (``--enable-mscclpp``), NCCL's symmetric memory
        (``--enable-symm-mem``), whose pool SGLang allocates these buffers in."""
        if self.disabled or self._comm is None:
            return False
        small, big = (input, output) if collective == "all-gather" else (output, input)
        if big.dtype != small.dtype or big.numel() != small.numel() * self.world_size:
            return False
        if not (self._eligible(input) and self._eligible(output)):
            return False
        a0, a1 = input.data_ptr(), output.data_ptr()
        if a0 < a1 + output.numel() * output.element_size() and a1 < a0 + input.numel() * input.element_size():
            return False
        try:
            if callable(getattr(group, "is_symmetric_memory_enabled", None)) and group.is_symmetric_memory_enabled():
                return False
            mscclpp = getattr(group, "pymscclpp_comm", None)
            if collective == "all-gather" and mscclpp is not None and mscclpp.should_mscclpp_allgather(output, input):
                return False
        except Exception as e:  # noqa: BLE001 - SGLang's own path decides then
            logger.debug("tpar: SGLang's backend checks failed (%s): its own %s runs", e, collective)
            return False
        if not self._takes_collective(collective, small, small):
            return False
        if collective == "all-gather":
            self._comm.all_gather_into_tensor(output, input)
        else:
            self._comm.reduce_scatter_tensor(output, input)
        return True


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


def _tracing() -> bool:
    """Whether Dynamo is tracing this call. On CUDA SGLang calls the methods inside its opaque
    ops, so they run eagerly; only SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) calls
    them in Python, where Dynamo would trace into tpar's decision (``data_ptr``, native
    code): there SGLang's own path is traced instead."""
    import torch

    return torch.compiler.is_compiling()


def _wrap(attr: str, collective: str, original):
    def method(self, output, input):  # noqa: A002 - SGLang's names
        ca = getattr(self, "ca_comm", None)
        if isinstance(ca, SglangCustomAllreduce) and not _tracing() and ca.serve_collective(self, collective, output, input):
            return output if collective == "reduce-scatter" else None  # what the originals return
        return original(self, output, input)

    method.__name__ = method.__qualname__ = attr
    method.__doc__ = f"tpar's plug-in: SGLang's {attr} through tpar where it takes the call, else SGLang's original."
    method._tpar_original = original
    return method


def install_collectives() -> None:
    """Wraps ``GroupCoordinator._all_gather_into_tensor`` / ``_reduce_scatter_tensor`` (module
    doc). Idempotent; the originals are kept as ``GroupCoordinator._tpar_original_<name>``;
    an SGLang without them is logged, never raised (it keeps its own collectives)."""
    if not enabled():
        return
    import importlib

    try:
        cls = getattr(importlib.import_module(GROUP_MODULE), GROUP_CLASS)
    except Exception as e:  # noqa: BLE001 - the engine must start without tpar
        logger.warning("tpar: SGLang's all-gather / reduce-scatter stay SGLang's (%s.%s: %s)", GROUP_MODULE, GROUP_CLASS, e)
        return
    for attr, collective in COLLECTIVES.items():
        current = cls.__dict__.get(attr)
        if current is None:
            logger.warning("tpar: SGLang's %s.%s has no %s: that collective stays SGLang's", GROUP_MODULE, GROUP_CLASS, attr)
            continue
        if getattr(current, "_tpar_original", None) is not None:
            continue
        setattr(cls, "_tpar_original_" + attr, current)
        setattr(cls, attr, _wrap(attr, collective, current))
    _say("tpar: SGLang's all-gather and reduce-scatter go through tpar where its plan takes them (TPAR_ENABLE=1)")


def register() -> None:
    """The entry point. Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    patch_engine("SGLang", TARGET_MODULE, TARGET_ATTR, dispatch_custom_allreduce)
    install_collectives()
    fusion.install("sglang")  # its fused all-reduce + RMSNorm, to tpar (tpar/engines/fusion.py)
