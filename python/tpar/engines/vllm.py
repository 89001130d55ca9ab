"""vLLM plug-in (entry point ``vllm.general_plugins``): with ``TPAR_ENABLE=1``, vLLM's
tensor-parallel groups build :class:`VllmCustomAllreduce` (tpar's drop-in) instead of vLLM's
``CustomAllreduce``.

``CudaCommunicator.__init__`` imports ``CustomAllreduce`` from
``vllm.distributed.device_communicators.custom_all_reduce`` inside the function, so replacing
that module attribute before the groups are built (plug-ins load first) is enough.
``--disable-custom-all-reduce`` still switches it off, as for vLLM's own class.

What else the plug-in does in every vLLM process (docs/engines.md says why):

- ``VLLM_ALLREDUCE_USE_FLASHINFER``: vLLM asks FlashInfer's all-reduce before the custom
  all-reduce, and it is on by default (Hopper/Blackwell with FlashInfer installed), so
  ``TPAR_ENABLE=1`` alone would change nothing there. vLLM reads the variable lazily, when
  ``CudaCommunicator`` is built, after its plug-ins ran: unset, the plug-in sets it to ``0``;
  set by the user, it is left alone (a warning says FlashInfer then comes first).
- ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` gains ``TPAR_``: Ray workers get only variables
  with vLLM's known prefixes, and without ``TPAR_ENABLE`` there they would run vLLM's class.
- The all-reduce + RMSNorm fusion: tpar adds its own pass to vLLM's compile passes
  (:mod:`tpar.engines.vllm_pass`, every architecture, tpar's size table), in the place of
  vLLM's FlashInfer pass where that one is configured; the op vLLM's pass emits is also routed
  to tpar (:mod:`tpar.engines.fusion`) for a pass manager tpar's wrapper did not reach.
- ``VLLM_BATCH_INVARIANT``: the drop-in takes every size through kernels that sum in rank
  order (:meth:`TparCustomAllreduce.should_custom_ar`), as vLLM's own class takes every size.
"""

import os

from tpar.engines import fusion, vllm_pass
from tpar.engines.common import TparCustomAllreduce, _say, enabled, logger, patch_engine

#: Where vLLM looks the class up, and its name there.
TARGET_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
TARGET_ATTR = "CustomAllreduce"

#: vLLM's switch for its standalone FlashInfer all-reduce (vllm/envs.py, default on).
FLASHINFER_ENV = "VLLM_ALLREDUCE_USE_FLASHINFER"
#: Extra prefixes of variables vLLM copies to Ray workers (vllm/ray/ray_env.py).
RAY_PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
TPAR_PREFIX = "TPAR_"


def prepare_environment(environ=os.environ) -> None:
    """The environment changes the plug-in makes (module doc); idempotent."""
    if FLASHINFER_ENV not in environ:
        environ[FLASHINFER_ENV] = "0"
        _say("tpar: %s=0 set, so that vLLM asks tpar before FlashInfer's all-reduce (set it to 1 to keep FlashInfer first)", FLASHINFER_ENV)
    prefixes = [p.strip() for p in environ.get(RAY_PREFIXES_ENV, "").split(",") if p.strip()]
    if TPAR_PREFIX not in prefixes:
        environ[RAY_PREFIXES_ENV] = ",".join(prefixes + [TPAR_PREFIX])


class VllmCustomAllreduce(TparCustomAllreduce):
    """tpar's drop-in as vLLM builds it: batch invariance and a start-up warning from vLLM's
    own settings."""

    def __init__(self, group, device, max_size: int = 8192 * 1024, **engine_options) -> None:
        try:
            import vllm.envs as envs

            self.batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)
        except Exception:  # noqa: BLE001 - outside vLLM (tests), the default holds
            pass
        super().__init__(group, device, max_size=max_size, **engine_options)

    def _engine_fallback(self, collective: str, inp):
        """What vLLM's ``sp_all_gather`` / ``sp_reduce_scatter`` run when the custom
        collective answers None (``tensor_model_parallel_all_gather(x, 0)`` /
        ``..._reduce_scatter(x, 0)``): the same ``GroupCoordinator`` call, on the coordinator
        whose CPU group is this drop-in's."""
        from vllm.distributed import parallel_state as ps

        for ref in list(ps._groups.values()):
            g = ref()
            if g is not None and g.cpu_group is self.group:
                return g.all_gather(inp, 0) if collective == "all-gather" else g.reduce_scatter(inp, 0)
        return super()._engine_fallback(collective, inp)

    def _engine_checks(self) -> None:
        if self.rank != 0:
            return
        try:
            import vllm.envs as envs

            if envs.VLLM_ALLREDUCE_USE_FLASHINFER and not envs.VLLM_BATCH_INVARIANT:
                logger.warning(
                    "tpar: %s=%s: vLLM asks FlashInfer's all-reduce first, tpar only for what FlashInfer declines; unset it to give tpar the calls",
                    FLASHINFER_ENV, os.environ.get(FLASHINFER_ENV),
                )
        except Exception as e:  # noqa: BLE001 - a warning must never stop the engine
            logger.debug("tpar: vLLM settings not checked: %s", e)


def register() -> None:
    """The entry point. Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    if not enabled():
        return
    prepare_environment()
    patch_engine("vLLM", TARGET_MODULE, TARGET_ATTR, VllmCustomAllreduce)
    fusion.install("vllm")  # its fused all-reduce + RMSNorm, to tpar (tpar/engines/fusion.py)
    vllm_pass.install()  # tpar's own all-reduce + RMSNorm (+ FP8) fusion pass (tpar/engines/vllm_pass.py)
