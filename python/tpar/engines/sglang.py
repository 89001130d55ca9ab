"""SGLang plug-in (entry point ``sglang.srt.plugins``): with ``TPAR_ENABLE=1``, SGLang's
groups build :class:`~tpar.engines.common.TparCustomAllreduce` instead of the class that
``dispatch_custom_allreduce`` would pick.

``GroupCoordinator.__init__`` imports ``dispatch_custom_allreduce`` from
``sglang.srt.distributed.device_communicators.custom_all_reduce`` inside the function and
calls it for the class to instantiate; its signature changes between versions, so the
replacement takes ``*args, **kwargs``. ``--disable-custom-all-reduce`` still switches it off.
"""

from tpar.engines import fusion
from tpar.engines.common import TparCustomAllreduce, patch_engine

TARGET_MODULE = "sglang.srt.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "dispatch_custom_allreduce"


def dispatch_custom_allreduce(*args, **kwargs):
    """Replacement of SGLang's dispatcher: always tpar's class."""
    return TparCustomAllreduce


def register() -> None:
    """The entry point. Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    patch_engine("SGLang", TARGET_MODULE, TARGET_ATTR, dispatch_custom_allreduce)
    fusion.install("sglang")  # its fused all-reduce + RMSNorm, to tpar (tpar/engines/fusion.py)
