"""The engines' fused all-reduce + residual add + RMSNorm routed to tpar's kernel, with
``TPAR_ENABLE=1`` (docs/engines.md "Fused all-reduce + RMSNorm"; docs/cuda.md "Fused").

Both engines fuse the all-reduce that ends a layer's attention or MLP with the residual add
and the next RMSNorm through FlashInfer (a dependency of both), and neither has a pluggable
backend for it. The plug-ins call :func:`install` from their ``register()``:

| engine | what is replaced | where the engine looks it up |
|---|---|---|
| vLLM | ``vllm.compilation.passes.fusion.allreduce_rms_fusion.flashinfer_trtllm_fused_allreduce_norm`` (the op its fusion pass emits) by ``torch.ops.tpar.vllm_fused_allreduce_norm`` (the same schema) | the pass's pattern replacements read the module global when ``AllReduceFusionPass`` registers them, at compile time, after the plug-ins |
| SGLang | ``sglang.srt.layers.flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm`` (what ``--enable-flashinfer-allreduce-fusion`` routes to) | ``layernorm._forward_with_allreduce_fusion`` imports it inside the function, per call |

Per call, tpar takes it where the engine's custom all-reduce of that group is tpar's
(:class:`~tpar.engines.common.TparCustomAllreduce`), tpar's plan has a kernel for the size
(``should_custom_ar``), the weight is in x's dtype and rows are whole 16-byte vectors, and the
call is a form of tpar's family (``Communicator.all_reduce_rmsnorm``):

- vLLM's op: every pattern its pass emits. ``kARResidualRMSNorm`` with
  ``weight_bias`` 0.0 (plain) or 1.0 (Gemma: ``float32(w) + 1``), with or without ``norm_out``
  (the no-residual patterns pass a zeroed ``residual`` and a ``norm_out``: tpar adds that
  residual, as FlashInfer does); ``kARResidualRMSNormFP8Quant`` with a ``float8_e4m3fn``
  ``quant_out``, no ``scale_out`` and a 1-element float32 ``scale_factor`` (the static
  per-tensor scale the pattern's ``static_scaled_fp8_quant`` divides by);
  ``kARResidualRMSNormFP4Quant`` (NVFP4, the SWIZZLED_128x4 scale layout vLLM's wrapper asks
  for) with a uint8 ``quant_out`` of ``[..., hidden / 2]``, a contiguous ``scale_out`` of the
  swizzled tensor's bytes (vLLM's int32 scales viewed as ``float8_e4m3fn``), a 1-element
  float32 ``scale_factor`` (the global scale of ``scaled_fp4_quant``) and rows of a multiple
  of 16 elements. The ``Out`` quant patterns (vLLM emits none) and any other ``weight_bias``
  go to FlashInfer.
- SGLang's function: its only CUDA form, all-reduce + residual add + RMSNorm; GemmaRMSNorm
  calls it with its precomputed ``gemma_weight`` (``w + 1`` in the weight's dtype), which is
  the plain form with that weight. SGLang has no CUDA call of an all-reduce fused with an FP8
  quantisation (its fused all-reduce + RMSNorm + FP8 path is AITER's, ROCm, per-group dynamic
  scales), so there is nothing FP8 to route there.

Everything else goes to the engine's original (FlashInfer). tpar's result is its own fixed
arithmetic (bit for bit ``tpar.testing.reference_rmsnorm``), not FlashInfer's.
``python/tests/test_fusion_contract.py`` checks these names and signatures against the pinned
engines' source.
"""

from __future__ import annotations

import inspect
import logging
from typing import Optional

from tpar.engines.common import TparCustomAllreduce, enabled

logger = logging.getLogger("tpar.engines")

#: vLLM: the module of its all-reduce + RMSNorm fusion pass, the op global its pattern
#: replacements emit, and the Python function vLLM registered as that op.
VLLM_MODULE = "vllm.compilation.passes.fusion.allreduce_rms_fusion"
VLLM_OP_ATTR = "flashinfer_trtllm_fused_allreduce_norm"
VLLM_FUNC_ATTR = "call_trtllm_fused_allreduce_norm"
#: vLLM's op's mutated arguments (its direct_register_custom_op call): tpar's op mutates the
#: same, so the pattern replacements' auto_functionalized outputs keep their indices.
VLLM_MUTATES = ["allreduce_in", "residual", "norm_out", "quant_out", "scale_out"]

#: SGLang: the module and function ``--enable-flashinfer-allreduce-fusion`` routes to.
SGLANG_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
SGLANG_ATTR = "flashinfer_allreduce_residual_rmsnorm"

#: vLLM's op's pattern codes (FlashInfer's ``AllReduceFusionPattern``), read at install:
#: ``code`` the add + RMSNorm, ``fp8_code`` the add + RMSNorm + static FP8 quant,
#: ``fp4_code`` the add + RMSNorm + NVFP4 quant.
_vllm = {"original": None, "code": None, "fp8_code": None, "fp4_code": None}
_sglang = {"original": None}


def _tpar_of(ca) -> Optional[TparCustomAllreduce]:
    """The engine group's custom all-reduce when it is tpar's and running."""
    if isinstance(ca, TparCustomAllreduce) and not ca.disabled and ca._comm is not None:
        return ca
    return None


def takes(ca: Optional[TparCustomAllreduce], x, residual, weight) -> bool:
    """Whether tpar runs this fused call (any pattern of the family: ``residual`` None is the
    no-residual form): tpar's communicator, a kernel in its plan for x's size
    (``should_custom_ar``), the weight (and residual) in x's dtype (and shape), rows of whole
    16-byte vectors, contiguous tensors."""
    if ca is None or not ca.should_custom_ar(x):
        return False
    if x.dim() < 1 or weight.dim() != 1 or weight.numel() != x.shape[-1] or weight.dtype != x.dtype or not weight.is_contiguous():
        return False
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()):
        return False
    return (x.shape[-1] * x.element_size()) % 16 == 0


# -- vLLM ----------------------------------------------------------------------------------


def _vllm_group_ca():
    """vLLM's tensor-parallel group's custom all-reduce object, when it is tpar's."""
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return _tpar_of(getattr(get_tp_group().device_communicator, "ca_comm", None))
    except Exception:  # noqa: BLE001 - no group yet, another engine version: not tpar's
        return None


def _vllm_form(x, pattern_code, quant_out, scale_out, scale_factor, weight_bias):
    """Which form of tpar's family vLLM's op call is, as ``all_reduce_rmsnorm``'s quantization
    arguments: {} for the add + RMSNorm (plain or Gemma), ``{"fp8_scale": s}`` for the add +
    RMSNorm + static FP8 quant, ``{"nvfp4_scale": s, "scale_out": int32 view}`` for the add +
    RMSNorm + NVFP4 quant; False for a call tpar hands back (another pattern, another weight
    offset, a quantized output tpar's kernel does not write: another dtype or shape,
    non-contiguous, a dynamic or non-float32 scale, NVFP4 rows not of whole 16-element
    blocks)."""
    if weight_bias not in (0.0, 1.0):
        return False
    if pattern_code == _vllm["code"] and _vllm["code"] is not None:
        return {} if quant_out is None and scale_out is None else False
    if quant_out is None or scale_factor is None:
        return False
    import torch

    if scale_factor.dtype != torch.float32 or scale_factor.numel() != 1 or scale_factor.device != x.device:
        return False
    if pattern_code == _vllm["fp8_code"] and _vllm["fp8_code"] is not None:
        if scale_out is not None:
            return False
        if quant_out.dtype != torch.float8_e4m3fn or quant_out.shape != x.shape or quant_out.device != x.device or not quant_out.is_contiguous():
            return False
        return {"fp8_scale": scale_factor}
    if pattern_code != _vllm["fp4_code"] or _vllm["fp4_code"] is None or scale_out is None or x.dim() < 1:
        return False
    from tpar.testing import nvfp4_scale_shape

    hidden = x.shape[-1]
    if hidden % 16 != 0 or quant_out.dtype != torch.uint8 or tuple(quant_out.shape) != (*x.shape[:-1], hidden // 2):
        return False
    if quant_out.device != x.device or not quant_out.is_contiguous():
        return False
    shape = nvfp4_scale_shape(x.numel() // hidden, hidden)
    if scale_out.device != x.device or not scale_out.is_contiguous() or scale_out.element_size() != 1 or scale_out.numel() != shape[0] * shape[1] * 4:
        return False
    return {"nvfp4_scale": scale_factor, "scale_out": scale_out.view(torch.uint8).view(torch.int32).reshape(shape)}


def vllm_fused_allreduce_norm(
    allreduce_in,
    residual,
    rms_gamma,
    rms_eps: float,
    world_size: int,
    launch_with_pdl: bool,
    fp32_acc: bool,
    max_token_num: int,
    pattern_code: int,
    norm_out=None,
    quant_out=None,
    scale_out=None,
    scale_factor=None,
    weight_bias: float = 0.0,
    _group_ca=_vllm_group_ca,
) -> None:
    """vLLM's ``flashinfer_trtllm_fused_allreduce_norm`` contract, tpar's family kernel where
    it takes the call (the module says which forms). Without ``norm_out``: ``allreduce_in``
    becomes the normalised output and ``residual`` the updated residual (vLLM's
    fused_add_rms_norm form); with ``norm_out``: the normalised output goes there and the
    updated residual into ``allreduce_in`` (``residual`` untouched), as vLLM's own wrapper asks
    FlashInfer. The FP8 pattern writes ``quant_out`` instead of the normalised output; the
    NVFP4 pattern ``quant_out`` and the swizzled block scales into ``scale_out`` (the whole
    tensor, the padding 0, as vLLM's kernel)."""
    ca = _group_ca()
    quant = _vllm_form(allreduce_in, pattern_code, quant_out, scale_out, scale_factor, weight_bias)
    if quant is not False and takes(ca, allreduce_in, residual, rms_gamma):
        x, gemma = allreduce_in, weight_bias == 1.0
        # FlashInfer's outputs: without norm_out the norm into allreduce_in (FP8: quant_out) and
        # the updated residual into residual; with norm_out the norm there (FP8: quant_out,
        # norm_out left as the FP8 pattern leaves it) and the updated residual into allreduce_in.
        res_out = residual if norm_out is None else x
        if not quant:
            out = x if norm_out is None else norm_out
        else:
            out = quant_out
        ca._comm.all_reduce_rmsnorm(x, rms_gamma, rms_eps, residual=residual, gemma=gemma, out=out, residual_out=res_out, **quant)
        return
    original = _vllm["original"]
    if original is None:
        raise RuntimeError("tpar: vLLM's fused all-reduce + RMSNorm was replaced but its original is unknown")
    original(
        allreduce_in, residual, rms_gamma, rms_eps, world_size, launch_with_pdl, fp32_acc, max_token_num, pattern_code,
        norm_out=norm_out, quant_out=quant_out, scale_out=scale_out, scale_factor=scale_factor, weight_bias=weight_bias,
    )


def _register_vllm_op():
    """``torch.ops.tpar.vllm_fused_allreduce_norm``: :func:`vllm_fused_allreduce_norm` as a
    custom op with vLLM's schema and mutated arguments, and a fake implementation (it mutates
    only), for Inductor's graphs."""
    import torch

    if hasattr(torch.ops.tpar, "vllm_fused_allreduce_norm"):
        return torch.ops.tpar.vllm_fused_allreduce_norm.default

    def op(
        allreduce_in: torch.Tensor,
        residual: torch.Tensor,
        rms_gamma: torch.Tensor,
        rms_eps: float,
        world_size: int,
        launch_with_pdl: bool,
        fp32_acc: bool,
        max_token_num: int,
        pattern_code: int,
        norm_out: Optional[torch.Tensor] = None,
        quant_out: Optional[torch.Tensor] = None,
        scale_out: Optional[torch.Tensor] = None,
        scale_factor: Optional[torch.Tensor] = None,
        weight_bias: float = 0.0,
    ) -> None:
        vllm_fused_allreduce_norm(
            allreduce_in, residual, rms_gamma, rms_eps, world_size, launch_with_pdl, fp32_acc, max_token_num, pattern_code,
            norm_out, quant_out, scale_out, scale_factor, weight_bias,
        )

    op.__name__ = "vllm_fused_allreduce_norm"
    registered = torch.library.custom_op("tpar::vllm_fused_allreduce_norm", mutates_args=VLLM_MUTATES)(op)

    @registered.register_fake
    def _fake(allreduce_in, residual, rms_gamma, rms_eps, world_size, launch_with_pdl, fp32_acc, max_token_num, pattern_code,
              norm_out=None, quant_out=None, scale_out=None, scale_factor=None, weight_bias=0.0) -> None:
        return None

    return torch.ops.tpar.vllm_fused_allreduce_norm.default


def _engine_module(module: str, attr: str, what: str):
    """The engine's module to patch, or None: tpar is off, the import failed (logged: the
    engine must start without tpar's fusion), or ``attr`` is already routed (idempotent)."""
    if not enabled():
        return None
    import importlib

    try:
        m = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the engine must start without tpar's fusion
        logger.warning("tpar: %s not routed to tpar (%s): %s", what, module, e)
        return None
    if getattr(m, "_tpar_original_" + attr, None) is not None:
        return None
    return m


def install_vllm() -> None:
    """Routes vLLM's all-reduce + RMSNorm fusion to tpar (see the module). Idempotent; does
    nothing unless ``TPAR_ENABLE=1``; a vLLM without the pass (no FlashInfer comm module) is
    logged and left alone."""
    m = _engine_module(VLLM_MODULE, VLLM_OP_ATTR, "vLLM's all-reduce + RMSNorm fusion")
    if m is None:
        return
    func = getattr(m, VLLM_FUNC_ATTR, None)
    op = getattr(m, VLLM_OP_ATTR, None)
    if func is None or op is None:
        logger.info("tpar: vLLM's all-reduce + RMSNorm fusion is off here (no FlashInfer comm module): nothing to route")
        return
    ours = inspect.signature(vllm_fused_allreduce_norm).parameters
    theirs = inspect.signature(func).parameters
    if [p for p in ours if not p.startswith("_")] != list(theirs):
        logger.warning("tpar: vLLM's %s takes %s, not %s: fusion not routed to tpar", VLLM_FUNC_ATTR, list(theirs), list(ours))
        return
    _vllm["original"] = func
    patterns = m.flashinfer_comm.AllReduceFusionPattern
    _vllm["code"] = int(patterns.kARResidualRMSNorm)
    _vllm["fp8_code"] = int(patterns.kARResidualRMSNormFP8Quant)
    _vllm["fp4_code"] = int(patterns.kARResidualRMSNormFP4Quant)
    setattr(m, "_tpar_original_" + VLLM_OP_ATTR, op)
    setattr(m, VLLM_OP_ATTR, _register_vllm_op())
    logger.info("tpar: vLLM's all-reduce + RMSNorm fusion routed to tpar where its plan has a kernel (TPAR_ENABLE=1)")


# -- SGLang --------------------------------------------------------------------------------


def _sglang_group_ca(use_attn_tp_group: bool):
    """The custom all-reduce object of the group SGLang's fused kernel reduces over."""
    try:
        from sglang.srt.layers.flashinfer_comm_fusion import resolve_fusion_group

        _, _, coordinator = resolve_fusion_group(use_attn_tp_group=use_attn_tp_group)
        return _tpar_of(getattr(coordinator, "ca_comm", None))
    except Exception:  # noqa: BLE001 - no group yet, another engine version: not tpar's
        return None


def _sglang_decide(input_tensor, residual, weight, use_attn_tp_group):
    ca = _sglang_group_ca(use_attn_tp_group)
    return ca if takes(ca, input_tensor, residual, weight) else None


def sglang_allreduce_residual_rmsnorm(
    input_tensor,
    residual,
    weight,
    eps: float = 1e-6,
    max_token_num: int = 2048,
    use_oneshot=None,
    trigger_completion_at_end: bool = False,
    fp32_acc: bool = True,
    use_attn_tp_group: bool = True,
    _decide=_sglang_decide,
):
    """SGLang's ``flashinfer_allreduce_residual_rmsnorm`` contract: returns (norm_out,
    residual_out) as new tensors, tpar's kernel where it takes the call, else the original
    (which returns (None, None) when FlashInfer declines: SGLang then all-reduces and norms
    itself)."""
    ca = _decide(input_tensor, residual, weight, use_attn_tp_group)
    if ca is not None:
        import torch

        return torch.ops.tpar.all_reduce_add_rmsnorm(input_tensor, residual, weight, float(eps), ca._comm.handle)
    return _sglang["original"](
        input_tensor, residual, weight, eps, max_token_num, use_oneshot, trigger_completion_at_end, fp32_acc, use_attn_tp_group
    )


def install_sglang() -> None:
    """Routes SGLang's fused all-reduce + residual RMSNorm to tpar (see the module).
    Idempotent; does nothing unless ``TPAR_ENABLE=1``."""
    m = _engine_module(SGLANG_MODULE, SGLANG_ATTR, "SGLang's fused all-reduce + RMSNorm")
    if m is None:
        return
    original = getattr(m, SGLANG_ATTR, None)
    if original is None:
        logger.warning("tpar: SGLang has no %s.%s: fusion not routed to tpar", SGLANG_MODULE, SGLANG_ATTR)
        return
    import torch

    # The decision is Python (the plan, the group): under torch.compile it runs eagerly, as a
    # graph break, and the kernel is tpar's custom op either way.
    wrapper = torch.compiler.disable(sglang_allreduce_residual_rmsnorm) if hasattr(torch, "compiler") else sglang_allreduce_residual_rmsnorm
    _sglang["original"] = original
    setattr(m, "_tpar_original_" + SGLANG_ATTR, original)
    setattr(m, SGLANG_ATTR, wrapper)
    logger.info("tpar: SGLang's fused all-reduce + RMSNorm routed to tpar where its plan has a kernel (TPAR_ENABLE=1)")


def install(engine: str) -> None:
    """The plug-ins' hook: ``install("vllm")`` or ``install("sglang")``. Never raises: an
    engine must start without tpar's fusion."""
    try:
        {"vllm": install_vllm, "sglang": install_sglang}[engine]()
    except Exception as e:  # noqa: BLE001
        logger.warning("tpar: fused all-reduce + RMSNorm not routed to tpar in %s: %s", engine, e)
