"""The ``fusion`` stage of scripts/engine_harness.py (vLLM): a small layer (linear ->
all-reduce -> RMSNorm, with or without the residual add, plain or Gemma, with or without the
static FP8 quant or the NVFP4 quant) compiled by torch.compile's Inductor with vLLM's own post-grad pass manager
(``PostGradPassManager``, configured by vLLM's ``configure``, which tpar's plug-in wraps), in
every rank process, with the device capability vLLM sees faked (``--capability``, 120 or 90).

Per form it records how many of tpar's ``vllm_all_reduce_rmsnorm`` ops the pass left in the
graph (and vLLM all-reduces left unfused), how many fused calls tpar's kernels served
(``vllm_pass._stats``), and whether each output is right: bitwise tpar's reference
(``tpar.testing``) where tpar served the call, else within the rounding of the engine's
unfused ops. A compile range beyond tpar's plan (more tokens than its ``max_size`` holds) must
leave the graph alone. Nothing of vLLM is modified; its compiled ``_C`` ops that the modules
name at import are stubbed (scripts/engine_carry.py ``C_OP_STUBS``, the matched quant with
its torch reference), registered before the engine's set-up (``register_before_setup``), as a
real install's ``_C`` is registered before vLLM loads its plug-ins.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FORMS = ("residual", "norm", "gemma_residual", "gemma_norm", "fp8_residual", "fp8_norm", "nvfp4_residual", "nvfp4_norm")
EPS = 1e-6


def register_before_setup(engine: str, stages) -> list:
    """vLLM's ``_C`` ops as a real install has them when its plug-ins load, for a run whose
    ``stages`` include ``fusion``; returns the names defined.

    A real install registers ``torch.ops._C`` when ``vllm.platforms.cuda`` imports its
    ``_C_stable_libtorch`` extension, i.e. when ``current_platform`` resolves, before
    ``load_general_plugins``. tpar's plug-in (``tpar.engines.fusion.install``,
    ``vllm_pass.install``) then imports vLLM's pass manager and fusion modules, which name
    ``_C`` ops at import (on a CUDA platform without a hasattr guard). The carry stubs that
    extension, so the harness calls this before the engine's set-up: the platform resolved
    first (an op a real ``_C`` registered is kept), then scripts/engine_carry.py's
    ``C_OP_STUBS`` for what is missing. Idempotent (``fusion_stage`` calls it again)."""
    if engine != "vllm" or "fusion" not in stages:
        return []
    import engine_carry
    from vllm.platforms import current_platform

    current_platform.device_type  # noqa: B018 - resolves it: where a real _C registers
    return engine_carry.register_c_op_stubs()


def fake_platform(capability: int):
    """vLLM's current platform, as CUDA with ``capability`` (e.g. 120: sm_120), for the
    modules imported from here on (the pass's matchers and vLLM's quant layer read it)."""
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    major, minor = divmod(int(capability), 10)

    class FakedCapability(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(major=major, minor=minor)

    platforms._current_platform = FakedCapability()
    return platforms._current_platform


def _config(world, hidden, dtype, device_type="cpu"):
    """A VllmConfig at -O2's pass settings for TP ``world``; its model config is a stand-in
    with what the passes read (dtype, hidden size): there are no model weights here. On a GPU
    the executor is ``external_launcher``, as the engine set-up's (scripts/engine_adapters.py):
    vLLM's default ("mp") refuses a TP size above the GPUs it counts, and the ranks may share one."""
    from vllm.config import CompilationConfig, ParallelConfig, VllmConfig

    backend = "external_launcher" if device_type == "cuda" else None
    par = ParallelConfig(tensor_parallel_size=world, distributed_executor_backend=backend)
    cfg = VllmConfig(parallel_config=par, compilation_config=CompilationConfig())
    model = SimpleNamespace(dtype=dtype, get_hidden_size=lambda: hidden, using_transformers_backend=lambda: False)
    object.__setattr__(cfg, "model_config", model)
    return cfg


def _layer(form, tp_all_reduce, quant):
    import torch

    import vllm.ir.ops as ir

    gemma = form.startswith("gemma")
    residual = form.endswith("residual")
    fp8 = form.startswith("fp8")
    nvfp4 = form.startswith("nvfp4")

    def f(x, w_lin, w_norm, res, scale):
        s = tp_all_reduce(torch.nn.functional.linear(x, w_lin))
        w = w_norm.float() + 1.0 if gemma else w_norm
        if residual:
            y, other = ir.fused_add_rms_norm(s, res, w, EPS)
        else:
            y, other = ir.rms_norm(s, w, EPS), s
        if fp8:
            y, _ = quant(y, scale)
        if nvfp4:  # vLLM's NVFP4 quant (the .out op its pass matches); scales as its int32 tensor
            from vllm import _custom_ops as ops

            q, sf = ops.scaled_fp4_quant(y, scale)
            return (q, sf.view(torch.int32)), other
        return y, other

    return f


def fusion_stage(eng, ca, rank, world, dev, capability: int, hidden: int = 1024, rows: int = 8):
    """Returns the stage's record (see the module)."""
    import torch
    import torch._dynamo

    import engine_carry
    import tpar.testing as tt
    from tpar.engines import vllm_pass

    engine_carry.register_c_op_stubs()  # done before the set-up (register_before_setup): a no-op then
    # vLLM's pass manager module as the engine process has it (the plug-in imported it when
    # it loaded, before the platform is faked here): its module-level choices are the real
    # platform's, with or without tpar's registration.
    from vllm.compilation.passes.pass_manager import PostGradPassManager

    fake_platform(capability)
    # The TP group reaches its all-reduce through vLLM's custom op on a CUDA platform
    # (CudaPlatform.use_custom_op_collectives); the group was built before the platform was
    # faked (on a CPU, the direct call, which traces into torch's functional collectives).
    eng.tp.use_custom_op_call = True
    from vllm.compilation.passes.inductor_pass import pass_context
    from vllm.config import set_current_vllm_config
    from vllm.config.utils import Range
    from vllm.distributed import tensor_model_parallel_all_reduce
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    # Inductor's caches would skip the post-grad passes on a hit (a previous run's graph).
    import torch._functorch.config as functorch_config

    functorch_config.enable_autograd_cache = False
    dtype = torch.bfloat16
    cfg = _config(world, hidden, dtype, dev.type)
    top = torch.ops.tpar.vllm_all_reduce_rmsnorm.default if hasattr(torch.ops.tpar, "vllm_all_reduce_rmsnorm") else None

    class Recording(PostGradPassManager):
        """vLLM's pass manager, counting what its passes left in the graph."""

        seen = {}

        def __call__(self, graph):
            super().__call__(graph)
            calls = [n for n in graph.nodes if n.op == "call_function"]
            targets = [n.target for n in calls]
            Recording.seen = {
                "tpar_ops": sum(1 for t in targets if "vllm_all_reduce_rmsnorm" in str(t)),
                "nvfp4_ops": sum(1 for t in targets if "vllm_all_reduce_rmsnorm_nvfp4" in str(t)),
                # vLLM's NVFP4 quant left unfused (auto_functionalized carries it as its first argument)
                "fp4_quants": sum(1 for n in calls if "scaled_fp4_quant" in str(n.target) or (n.args and "scaled_fp4_quant" in str(n.args[0]))),
                "all_reduces": sum(1 for t in targets if "vllm.all_reduce" in str(t)),
            }

    out = {"capability": capability, "forms": {}, "cases": 0, "tpar": 0, "fallback": 0, "served": 0, "wrong": 0}
    with set_current_vllm_config(cfg, check_compile=False):
        pm = Recording()
        pm.configure(cfg)
        names = [type(p).__name__ for p in pm.passes]
        out["passes"] = names
        if "TparAllReduceFusionPass" not in names:
            raise RuntimeError(f"tpar's pass is not in vLLM's pass list: {names}")
        ours = pm.passes[names.index("TparAllReduceFusionPass")]
        out["max_token_num"] = ours.max_token_num
        quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)
        g = torch.Generator().manual_seed(4242)
        lin_in = hidden // 2
        xs = [torch.randn(rows, lin_in, generator=g).to(dtype) for _ in range(world)]
        # The linear's weight selects: row i of rank r's takes one input column, times a random
        # sign and power of two, so every output element is one product (the rest are exact
        # zeros) and exact in any matmul: the GPU's cuBLAS inside the compiled graph gives the
        # bits the CPU's eager linear gives below (a dense random weight did not: the fused
        # outputs were compared against the CPU's matmul, not tpar's sum, and all differed). The
        # all-reduce's inputs stay random floats, so its summation order still shows.
        ws = []
        for _ in range(world):
            w = torch.zeros(hidden, lin_in)
            cols = torch.randint(0, lin_in, (hidden,), generator=g)
            sign = torch.randint(0, 2, (hidden,), generator=g) * 2 - 1
            exp2 = torch.randint(-1, 2, (hidden,), generator=g).float()
            w[torch.arange(hidden), cols] = sign.float() * torch.pow(2.0, exp2)
            ws.append(w.to(dtype))
        w_norm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
        res0 = torch.randn(rows, hidden, generator=g).to(dtype)
        scale = torch.tensor([0.05], dtype=torch.float32)
        gs4 = torch.tensor([[448.0 * 6.0 / 4.5]], dtype=torch.float32)  # the NVFP4 forms' global scale
        # the all-reduce's inputs, as every rank computes them (exact: see ws)
        hs = [torch.nn.functional.linear(xs[r], ws[r]) for r in range(world)]
        for form in FORMS + ("beyond_plan",):
            name = "residual" if form == "beyond_plan" else form
            end = ours.max_token_num + 1 if form == "beyond_plan" else max(rows, 1)
            torch._dynamo.reset()
            f = _layer(name, tensor_model_parallel_all_reduce, quant)
            # Inductor as vLLM configures it: auto-functionalization V1, which its fusion passes
            # (and tpar's, whose quant patterns are vLLM's) match (CompilationConfig.__post_init__)
            opts = {"post_grad_custom_post_pass": pm, "fx_graph_cache": False, "enable_auto_functionalized_v2": cfg.compilation_config.inductor_compile_config.get("enable_auto_functionalized_v2", False)}
            cf = torch.compile(f, backend="inductor", fullgraph=True, dynamic=False, options=opts)
            before = dict(vllm_pass._stats)
            served0 = ca.served_calls
            Recording.seen = {}
            try:
                with pass_context(Range(start=1, end=end)):
                    sc = gs4 if name.startswith("nvfp4") else scale
                    y, other = cf(xs[rank].to(dev), ws[rank].to(dev), w_norm.to(dev), res0.clone().to(dev), sc.to(dev))
            except Exception:
                import traceback

                traceback.print_exc()  # the rank's log has the whole story
                raise RuntimeError(f"form {form}: compile or run failed (the rank's log has the traceback)") from None
            fused = vllm_pass._stats["fused"] - before["fused"]
            rec = dict(Recording.seen, fused_calls=fused, served=ca.served_calls - served0)
            # tpar's reference: the rank-order sum rounded once, then the norm (+ quant)
            s = tt.reference([h.reshape(-1) for h in hs], dtype).reshape(rows, hidden)
            if name.endswith("residual"):
                ref_y, ref_other = tt.add_rmsnorm(s, res0, w_norm, EPS)  # ref_y: the plain form's only
            else:  # no residual: tpar's no-residual pattern (the norm of the sum itself)
                ref_y, _ = tt.rmsnorm(s, w_norm, EPS)
                ref_other = s
            ok = True
            if fused:  # tpar served it: bitwise its reference where tpar.testing has one for the form
                if name in ("residual", "norm"):
                    y_ok, other_ok = tt.bits(y.cpu()) == tt.bits(ref_y), tt.bits(other.cpu()) == tt.bits(ref_other)
                elif name.startswith("nvfp4"):
                    (rq, rsf), rr = tt.reference_rmsnorm(hs, w_norm, EPS, residual=res0 if name.endswith("residual") else None, nvfp4_scale=gs4)
                    y_ok = tt.bits(y[0].cpu()) == tt.bits(rq) and torch.equal(y[1].cpu(), rsf)
                    other_ok = tt.bits(other.cpu()) == tt.bits(rr if rr is not None else s)
                else:
                    ry, rr = tt.reference_rmsnorm(hs, w_norm, EPS, residual=res0 if name.endswith("residual") else None,
                                                  gemma=name.startswith("gemma"), fp8_scale=scale if name.startswith("fp8") else None)
                    y_ok, other_ok = tt.bits(y.cpu()) == tt.bits(ry), (rr is None or tt.bits(other.cpu()) == tt.bits(rr))
                # which output differed, for the record (the normalised one, the sum or residual)
                rec.update(y_bitwise=bool(y_ok), other_bitwise=bool(other_ok))
                ok = y_ok and other_ok
            else:  # the engine's unfused ops: within their rounding of tpar's sum
                if ref_other is not None:
                    ok = bool(torch.allclose(other.cpu().float(), ref_other.float(), rtol=2e-2, atol=2e-2))
            if form == "beyond_plan":
                # the pass must not apply: vLLM's all-reduce stays, no tpar op in the graph
                ok = ok and rec.get("tpar_ops", 0) == 0 and rec.get("all_reduces", 0) >= 1 and fused == 0
            else:
                # every form must be replaced by tpar's op, the all-reduce gone; the NVFP4 forms
                # by its NVFP4 op, vLLM's quant gone with it
                ok = ok and rec.get("tpar_ops", 0) == 1 and rec.get("all_reduces", 0) == 0
                if name.startswith("nvfp4"):
                    ok = ok and rec.get("nvfp4_ops", 0) == 1 and rec.get("fp4_quants", 0) == 0
            rec["ok"] = bool(ok)
            out["forms"][form] = rec
            out["cases"] += 1
            out["tpar" if fused else "fallback"] += 1
            out["served"] += rec["served"]
            out["wrong"] += not ok
    out["fusion_routed"] = sum(r["fused_calls"] for r in out["forms"].values())
    out["op"] = str(top)
    return out
