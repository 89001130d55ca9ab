"""Drop-in custom all-reduce for vLLM and SGLang, switched on by ``TPAR_ENABLE=1``.

Both engines build a "custom all-reduce" object per tensor-parallel group and ask it, per
call, ``should_custom_ar(x)`` before ``custom_all_reduce(x)``; everything else goes to their
own NCCL. Neither has a pluggable all-reduce backend, so the plug-ins (entry points
``vllm.general_plugins`` and ``sglang.srt.plugins``, run early in every engine process) swap
the class the engine instantiates for :class:`TparCustomAllreduce`:

| engine | what is replaced | pinned versions checked |
|---|---|---|
| vLLM | ``vllm.distributed.device_communicators.custom_all_reduce.CustomAllreduce`` (imported inside ``CudaCommunicator.__init__``) | ``VLLM_VERSIONS`` |
| SGLang | ``sglang.srt.distributed.device_communicators.custom_all_reduce.dispatch_custom_allreduce`` (imported inside ``GroupCoordinator.__init__``); ``GroupCoordinator._all_gather_into_tensor`` / ``_reduce_scatter_tensor`` wrapped (:mod:`tpar.engines.sglang`) | ``SGLANG_VERSIONS`` |

``python/tests/test_engine_contract.py`` downloads those versions' wheels and checks,
against their source, that every attribute replaced or called exists with the expected
signature.
"""

from tpar.engines.common import TparCustomAllreduce, enabled  # noqa: F401

#: Engine versions whose source the contract test checks (docs/engines.md).
VLLM_VERSIONS = ("0.33.0",)
SGLANG_VERSIONS = ("0.5.23",)
