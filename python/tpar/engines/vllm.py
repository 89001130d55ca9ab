"""vLLM plug-in (entry point ``vllm.general_plugins``): with ``TPAR_ENABLE=1``, vLLM's
tensor-parallel groups build :class:`~tpar.engines.common.TparCustomAllreduce` instead of
vLLM's ``CustomAllreduce``.

``CudaCommunicator.__init__`` imports ``CustomAllreduce`` from
``vllm.distributed.device_communicators.custom_all_reduce`` inside the function, so replacing
that module attribute before the groups are built (plug-ins load first) is enough.
``--disable-custom-all-reduce`` still switches it off, as for vLLM's own class.
"""

from tpar.engines.common import TparCustomAllreduce, _say, enabled, logger

#: Where vLLM looks the class up, and its name there.
TARGET_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "CustomAllreduce"


def register() -> None:
    """The entry point. Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    if not enabled():
        return
    import importlib

    try:
        mod = importlib.import_module(TARGET_MODULE)
    except Exception as e:  # noqa: BLE001 - vLLM must start without tpar
        logger.warning("tpar: cannot patch vLLM (%s): %s", TARGET_MODULE, e)
        return
    if getattr(mod, TARGET_ATTR, None) is TparCustomAllreduce:
        return
    mod._tpar_original_CustomAllreduce = getattr(mod, TARGET_ATTR, None)
    setattr(mod, TARGET_ATTR, TparCustomAllreduce)
    _say("tpar: vLLM's CustomAllreduce replaced by tpar (TPAR_ENABLE=1)")
