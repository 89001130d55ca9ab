"""tpar's own all-reduce + RMSNorm (+ static FP8 or NVFP4 quant) fusion pass for vLLM, with
``TPAR_ENABLE=1`` (docs/engines.md "Fused all-reduce + RMSNorm").

vLLM's pass (``AllReduceFusionPass``) is tied to FlashInfer: it does nothing unless
``flashinfer.comm`` imports, it allocates FlashInfer's IPC workspace in ``__init__``, and its
size table (``FI_ALLREDUCE_FUSION_MAX_SIZE_MB``) has rows for sm_90/100/103/107 only, so on
sm_120 it never runs and, where it runs, it sizes by FlashInfer's limits rather than tpar's
plan. So tpar adds a pass of its own, in vLLM's pass manager at the place of vLLM's (after the
no-op elimination, before the RMSNorm + quant fusion that would otherwise take the norm):

- the patterns are vLLM's (the facts, not its code): all-reduce then ``vllm_ir.rms_norm`` or
  ``vllm_ir.fused_add_rms_norm``, plain or Gemma (``weight.float() + 1``), optionally followed
  by the static per-tensor FP8 quant, or (plain weight, where vLLM has
  ``_C.scaled_fp4_quant``) by its NVFP4 quant with the swizzled scale layout;
- each match becomes one call of ``torch.ops.tpar.vllm_all_reduce_rmsnorm`` (functional:
  returns ``(out, residual_out)``; the NVFP4 forms ``torch.ops.tpar.vllm_all_reduce_rmsnorm_nvfp4``,
  ``(codes, residual_out, scales)``), which runs tpar's fused kernel where the group's custom
  all-reduce is tpar's and its plan takes the size, else the engine's own all-reduce followed
  by vLLM's own norm (+ quant) ops: the graph computes what it computed before;
- the pass applies to the compile ranges whose largest token count fits tpar's plan
  (``should_custom_ar``'s byte limit for the model's hidden size).

When vLLM's own pass is configured (Hopper/Blackwell with FlashInfer, -O2), tpar's runs just
before it: in the ranges tpar's plan takes, tpar's matches first and vLLM's finds nothing left;
in larger ranges vLLM's fuses as before (its calls routed to tpar by
:mod:`tpar.engines.fusion` where tpar's plan takes the size).
``TPAR_FUSION=0`` leaves vLLM's pass manager untouched.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

logger = logging.getLogger("tpar.engines")

PASS_MANAGER_MODULE = "vllm.compilation.passes.pass_manager"
EPSILONS = (1e-5, 1e-6)
#: Passes tpar's is inserted after when vLLM's own is not configured (pass_manager.configure's
#: order: no-op elimination and the transformers-backend add-RMSNorm canonicalisation come
#: before the all-reduce fusion).
BEFORE_US = ("NoOpEliminationPass", "AddRMSNormFusionPass", "RocmAiterTritonAddRMSNormPadFusionPass")
VLLM_PASS = "AllReduceFusionPass"

_state = {"installed": False}


def fusion_on(environ=os.environ) -> bool:
    """``TPAR_FUSION=0`` switches tpar's pass off; so does ``VLLM_BATCH_INVARIANT=1``, where
    vLLM switches its own fusion off so that a row's bits do not depend on the batch (tpar's
    op hands sizes its plan does not take to vLLM's unfused ops, whose bits differ)."""
    return environ.get("TPAR_FUSION", "1") != "0" and environ.get("VLLM_BATCH_INVARIANT", "0") in ("", "0")


# -- the op the pass emits ----------------------------------------------------------------


def _group_ca():
    from tpar.engines.fusion import _vllm_group_ca

    return _vllm_group_ca()


def _fp8_reference(y, scale):
    """vLLM's ``static_scaled_fp8_quant`` semantics: y * (1 / scale) in float32, clamped to
    e4m3's range, rounded to e4m3."""
    import torch

    finfo = torch.finfo(torch.float8_e4m3fn)
    inv = 1.0 / scale.float()
    return (y.float() * inv).clamp(finfo.min, finfo.max).to(torch.float8_e4m3fn)


def _engine_fallback(x, residual, weight, eps, gemma, scale):
    """What the graph computed before the pass: vLLM's all-reduce, then its norm ops."""
    import torch
    from vllm.distributed import tensor_model_parallel_all_reduce

    s = tensor_model_parallel_all_reduce(x)
    w = weight.float() + 1.0 if gemma else weight
    if residual is None:
        out, res = torch.ops.vllm_ir.rms_norm(s, w, eps), s
    else:
        out, res = torch.ops.vllm_ir.fused_add_rms_norm(s, residual, w, eps)
    if scale is not None:
        if hasattr(torch.ops._C, "static_scaled_fp8_quant"):
            q = torch.empty_like(out, dtype=torch.float8_e4m3fn)
            torch.ops._C.static_scaled_fp8_quant(q, out, scale, None)
            out = q
        else:
            out = _fp8_reference(out, scale)
    return out, res


def vllm_all_reduce_rmsnorm(x, residual, weight, eps: float, gemma: bool, scale, _group_ca=_group_ca):
    """One fused match: returns ``(out, residual_out)``. ``residual`` None: the no-residual
    form, ``residual_out`` is the all-reduced sum. ``scale`` given: ``out`` is float8_e4m3fn.
    Every pattern runs in tpar's fused kernels (``Communicator.all_reduce_rmsnorm``) where
    :func:`tpar.engines.fusion.takes` the call."""
    import torch

    from tpar.engines.fusion import takes

    ca = _group_ca()
    if takes(ca, x, residual, weight):
        _stats["fused"] += 1
        # Without a residual the op returns the sum too: the kernel writes it there.
        sum_out = torch.empty_like(x) if residual is None else None
        return ca._comm.all_reduce_rmsnorm(x, weight, eps, residual=residual, gemma=gemma, fp8_scale=scale, residual_out=sum_out)
    _stats["fallback"] += 1
    return _engine_fallback(x, residual, weight, eps, gemma, scale)


def _nvfp4_fits(x, residual, weight, quant_result, output_scale) -> bool:
    """Whether the NVFP4 call's buffers are the ones tpar's kernel writes: rows of a multiple
    of 16, codes ``[..., hidden / 2]`` uint8, the swizzled int32 scales of the rows."""
    import torch

    from tpar.testing import nvfp4_scale_shape

    hidden = x.shape[-1] if x.dim() else 0
    if hidden == 0 or hidden % 16 != 0 or weight.numel() != hidden:
        return False
    if quant_result.dtype != torch.uint8 or tuple(quant_result.shape) != (*x.shape[:-1], hidden // 2):
        return False
    return output_scale.dtype == torch.int32 and tuple(output_scale.shape) == nvfp4_scale_shape(x.numel() // hidden, hidden)


def vllm_all_reduce_rmsnorm_nvfp4(x, residual, weight, eps: float, global_scale, quant_result, output_scale, _group_ca=_group_ca):
    """One fused NVFP4 match: returns ``(codes, residual_out, scales)``, new tensors shaped
    as ``quant_result`` and ``output_scale`` (vLLM's int32 swizzled scales). ``residual``
    None: the no-residual form, ``residual_out`` is the all-reduced sum. tpar's fused kernels
    (``Communicator.all_reduce_rmsnorm(nvfp4_scale=)``) where :func:`tpar.engines.fusion.takes`
    the call, else vLLM's all-reduce, norm and ``_C.scaled_fp4_quant``."""
    import torch

    from tpar.engines.fusion import takes

    q = torch.empty_like(quant_result)
    sf = torch.empty_like(output_scale)
    ca = _group_ca()
    if takes(ca, x, residual, weight) and _nvfp4_fits(x, residual, weight, quant_result, output_scale):
        _stats["fused"] += 1
        sum_out = torch.empty_like(x) if residual is None else None
        _, _, res = ca._comm.all_reduce_rmsnorm(x, weight, eps, residual=residual, nvfp4_scale=global_scale, out=q, scale_out=sf, residual_out=sum_out)
        return q, res, sf
    _stats["fallback"] += 1
    out, res = _engine_fallback(x, residual, weight, eps, False, None)
    torch.ops._C.scaled_fp4_quant.out(out, global_scale, True, output=q, output_scale=sf)
    return q, res, sf


#: Calls taken by tpar's kernels / handed to the engine's ops, in this process.
_stats = {"fused": 0, "fallback": 0}


def _register_op():
    import torch

    if hasattr(torch.ops.tpar, "vllm_all_reduce_rmsnorm"):
        return torch.ops.tpar.vllm_all_reduce_rmsnorm.default

    @torch.library.custom_op(
        "tpar::vllm_all_reduce_rmsnorm",
        mutates_args=(),
        schema="(Tensor x, Tensor? residual, Tensor weight, float eps, bool gemma, Tensor? scale) -> (Tensor, Tensor)",
    )
    def op(
        x: torch.Tensor,
        residual: Optional[torch.Tensor],
        weight: torch.Tensor,
        eps: float,
        gemma: bool,
        scale: Optional[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, res = vllm_all_reduce_rmsnorm(x, residual, weight, eps, gemma, scale)
        # custom ops may not return their inputs (aliases)
        return (out.clone() if out is x or out is residual else out), (res.clone() if res is x or res is residual else res)

    @op.register_fake
    def _fake(x, residual, weight, eps, gemma, scale):
        dtype = torch.float8_e4m3fn if scale is not None else x.dtype
        return torch.empty_like(x, dtype=dtype), torch.empty_like(x)

    return torch.ops.tpar.vllm_all_reduce_rmsnorm.default


def _register_nvfp4_op():
    import torch

    if hasattr(torch.ops.tpar, "vllm_all_reduce_rmsnorm_nvfp4"):
        return torch.ops.tpar.vllm_all_reduce_rmsnorm_nvfp4.default

    @torch.library.custom_op(
        "tpar::vllm_all_reduce_rmsnorm_nvfp4",
        mutates_args=(),
        schema="(Tensor x, Tensor? residual, Tensor weight, float eps, Tensor global_scale, Tensor quant_result, Tensor output_scale) -> (Tensor, Tensor, Tensor)",
    )
    def op(x, residual, weight, eps, global_scale, quant_result, output_scale):
        q, res, sf = vllm_all_reduce_rmsnorm_nvfp4(x, residual, weight, eps, global_scale, quant_result, output_scale)
        return q, (res.clone() if res is x or res is residual else res), sf

    @op.register_fake
    def _fake(x, residual, weight, eps, global_scale, quant_result, output_scale):
        return torch.empty_like(quant_result), torch.empty_like(x), torch.empty_like(output_scale)

    return torch.ops.tpar.vllm_all_reduce_rmsnorm_nvfp4.default


# -- the pass -----------------------------------------------------------------------------


def _plan_max_tokens(hidden: int, dtype) -> int:
    """Largest token count whose rows tpar's plan takes (0: tpar is not the group's custom
    all-reduce, or its plan takes nothing)."""
    import torch

    ca = _group_ca()
    if ca is None or not hidden:
        return 0
    elem = torch.tensor([], dtype=dtype).element_size()
    return int(getattr(ca, "max_size", 0)) // (hidden * elem)


def _make_pass_class():
    import torch
    import torch._inductor.pattern_matcher as pm
    from torch._inductor.pattern_matcher import PatternMatcherPass

    import vllm.ir.ops
    from vllm.compilation.passes.fusion.matcher_utils import MatcherQuantFP8
    from vllm.compilation.passes.inductor_pass import enable_fake_mode
    from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass, VllmPatternMatcherPass
    from vllm.distributed import tensor_model_parallel_all_reduce
    from vllm.distributed.parallel_state import get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym

    top = _register_op()
    # vLLM's NVFP4 quant op, where this vLLM has it (its own pass's condition)
    fp4_op = torch.ops._C.scaled_fp4_quant.out if hasattr(torch.ops._C, "scaled_fp4_quant") else None
    top4 = _register_nvfp4_op() if fp4_op is not None else None

    def same_dtype(match) -> bool:
        """Plain forms: the weight in the norm input's dtype (a Gemma float32 weight + 1 is
        another pattern)."""
        for node in match.nodes:
            if node.target == torch.ops.vllm_ir.rms_norm.default:
                x, w = node.args[0], node.args[1]
            elif node.target == torch.ops.vllm_ir.fused_add_rms_norm.default:
                x, w = node.args[0], node.args[2]
            else:
                continue
            return x.meta["val"].dtype == w.meta["val"].dtype
        return True

    def _forms(top, eps, gemma, qm, empty, scale):
        """(pattern, replacement, example inputs) of each form for one epsilon, plain or Gemma.
        The pattern matcher takes every parameter of a pattern as a graph input, so the
        constants are closed over, not defaulted."""

        def w_of(w):
            return w.float() + 1.0 if gemma else w

        def p_norm(x, w):  # all-reduce + rms_norm, no residual: (norm, sum)
            s = tensor_model_parallel_all_reduce(x)
            return vllm.ir.ops.rms_norm(s, w_of(w), eps), s

        def r_norm(x, w):
            out, s = top(x, None, w, eps, gemma, None)
            return out, s

        def p_add(r, x, w):  # all-reduce + fused_add_rms_norm: (norm, residual)
            s = tensor_model_parallel_all_reduce(x)
            return vllm.ir.ops.fused_add_rms_norm(s, r, w_of(w), eps)

        def r_add(r, x, w):
            out, res = top(x, r, w, eps, gemma, None)
            return out, res

        def p_add_first(r, x, w):  # the same with the residual unused (a graph's last norm)
            return p_add(r, x, w)[0]

        def r_add_first(r, x, w):
            return r_add(r, x, w)[0]

        out = [
            (p_norm, r_norm, [empty(5, 16), empty(16)]),
            (p_add, r_add, [empty(5, 16), empty(5, 16), empty(16)]),
            (p_add_first, r_add_first, [empty(5, 16), empty(5, 16), empty(16)]),
        ]
        if gemma:
            return out

        def p_norm_q(x, w, sc):  # + static FP8 quant of the norm
            s = tensor_model_parallel_all_reduce(x)
            q, _ = qm(vllm.ir.ops.rms_norm(s, w, eps), sc)
            return q, s

        def r_norm_q(x, w, sc):
            out, s = top(x, None, w, eps, False, sc)
            return out, s

        def p_add_q(r, x, w, sc):
            s = tensor_model_parallel_all_reduce(x)
            y, res = vllm.ir.ops.fused_add_rms_norm(s, r, w, eps)
            q, _ = qm(y, sc)
            return q, res

        def r_add_q(r, x, w, sc):
            out, res = top(x, r, w, eps, False, sc)
            return out, res

        # the quantised forms first: they are supersets of the plain ones
        quantised = [
            (p_norm_q, r_norm_q, [empty(5, 16), empty(16), scale]),
            (p_add_q, r_add_q, [empty(5, 16), empty(5, 16), empty(16), scale]),
        ]
        if fp4_op is None:
            return quantised + out
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        def fp4(y, gs, q, sf):  # vLLM's scaled_fp4_quant as its pass matches it
            t = auto_functionalized(fp4_op, input=y, input_scale=gs, is_sf_swizzled_layout=True, output=q, output_scale=sf)
            return t[1], t[2]

        def p_norm_4(x, w, q, gs, sf):  # + NVFP4 quant of the norm: (codes, sum, scales)
            s = tensor_model_parallel_all_reduce(x)
            qo, so = fp4(vllm.ir.ops.rms_norm(s, w, eps), gs, q, sf)
            return qo, s, so

        def r_norm_4(x, w, q, gs, sf):
            qo, s, so = top4(x, None, w, eps, gs, q, sf)
            return qo, s, so

        def p_add_4(r, x, w, q, gs, sf):  # (codes, residual, scales)
            s = tensor_model_parallel_all_reduce(x)
            y, res = vllm.ir.ops.fused_add_rms_norm(s, r, w, eps)
            qo, so = fp4(y, gs, q, sf)
            return qo, res, so

        def r_add_4(r, x, w, q, gs, sf):
            qo, res, so = top4(x, r, w, eps, gs, q, sf)
            return qo, res, so

        def fp4_inputs():
            return [torch.empty(5, 8, dtype=torch.uint8, device=scale.device), torch.empty(1, 1, dtype=torch.float32, device=scale.device), torch.empty(128, 1, dtype=torch.int32, device=scale.device)]

        return [
            (p_norm_4, r_norm_4, [empty(5, 16), empty(16)] + fp4_inputs()),
            (p_add_4, r_add_4, [empty(5, 16), empty(5, 16), empty(16)] + fp4_inputs()),
        ] + quantised + out

    class TparAllReduceFusionPass(VllmPatternMatcherPass):
        def __init__(self, config) -> None:
            super().__init__(config)
            self.disabled = True
            self.max_token_num = 0
            if get_tensor_model_parallel_world_size() <= 1 or config.model_config is None:
                return
            self.max_token_num = _plan_max_tokens(config.model_config.get_hidden_size(), self.model_dtype)
            if config.scheduler_config is not None:
                self.max_token_num = min(self.max_token_num, config.scheduler_config.max_num_batched_tokens)
            if self.max_token_num <= 0:
                logger.info("tpar: the TP group's custom all-reduce is not tpar's: no all-reduce + RMSNorm fusion")
                return
            self.patterns = PatternMatcherPass(pass_name="tpar_all_reduce_fusion_pass")
            self.register_patterns()
            self.disabled = False

        @enable_fake_mode
        def register_patterns(self) -> None:
            dt, dev = self.model_dtype, self.device

            def empty(*s):
                return torch.empty(*s, dtype=dt, device=dev)

            for eps in EPSILONS:
                qm = MatcherQuantFP8(kFp8StaticTensorSym)
                _, scale = qm.inputs()
                for gemma in (False, True):
                    check = (lambda match: True) if gemma else same_dtype
                    for pattern, replacement, inputs in _forms(top, eps, gemma, qm, empty, scale):
                        pm.register_replacement(pattern, replacement, inputs, pm.fwd_only, self.patterns, extra_check=check)
                # vLLM's hack, for the same reason: the matcher's cache would refuse the second epsilon
                torch._inductor.pattern_matcher._seen_patterns.clear()

        def is_applicable_for_range(self, compile_range) -> bool:
            return not self.disabled and bool(compile_range.end <= self.max_token_num)

        @VllmInductorPass.time_and_log
        def __call__(self, graph) -> None:
            if self.disabled:
                return
            self.matched_count = self.patterns.apply(graph)
            logger.debug("tpar: %s all-reduce + RMSNorm patterns replaced", self.matched_count)

    return TparAllReduceFusionPass


_cls = {"pass": None}


def pass_class():
    if _cls["pass"] is None:
        _cls["pass"] = _make_pass_class()
    return _cls["pass"]


def place(passes: list, ours) -> list:
    """vLLM's pass list with tpar's pass just before vLLM's own all-reduce fusion where that
    one is configured (tpar's matches first, for the ranges tpar's plan takes; vLLM's keeps
    the larger ranges), else after the passes that precede that place."""
    names = [type(p).__name__ for p in passes]
    if VLLM_PASS in names:
        i = names.index(VLLM_PASS)
        return passes[:i] + [ours] + passes[i:]
    i = 0
    for j, n in enumerate(names):
        if n in BEFORE_US:
            i = j + 1
    return passes[:i] + [ours] + passes[i:]


def install() -> None:
    """Wraps vLLM's ``PostGradPassManager.configure`` so that every compile's pass list has
    tpar's pass. Idempotent; never raises (an engine must start without tpar's fusion)."""
    if _state["installed"] or not fusion_on():
        return
    try:
        import importlib

        m = importlib.import_module(PASS_MANAGER_MODULE)
        cls = m.PostGradPassManager
        original = cls.configure
        if getattr(original, "_tpar", False):
            _state["installed"] = True
            return

        def configure(self, config, _original=original):
            _original(self, config)
            try:
                from vllm.config import set_current_vllm_config

                with set_current_vllm_config(config, check_compile=False):
                    self.passes = place(self.passes, pass_class()(config))
            except Exception as e:  # noqa: BLE001 - compile without tpar's fusion
                logger.warning("tpar: all-reduce + RMSNorm fusion pass not added: %s", e)
                logger.debug("tpar: the pass's failure", exc_info=True)

        configure._tpar = True
        cls.configure = configure
        _state["installed"] = True
        logger.info("tpar: vLLM's compile passes fuse all-reduce + RMSNorm (+ FP8, NVFP4) into tpar's kernels where its plan takes the size")
    except Exception as e:  # noqa: BLE001
        logger.warning("tpar: vLLM's all-reduce + RMSNorm fusion pass not installed: %s", e)
