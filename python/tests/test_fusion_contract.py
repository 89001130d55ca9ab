"""tpar's routing of the engines' fused all-reduce + residual add + RMSNorm
(python/tpar/engines/fusion.py) against the engines' real source, for every pinned version,
read with ``ast`` from the wheels test_engine_contract.py downloads (nothing of the engines is
imported); then the routing itself on CPU rank processes (tpar's side of the call, and the
hand-over to the engine's original where tpar does not take a call).

What must hold for the replacement to be seen and to keep the engines' contract:

- vLLM: the fusion pass's pattern replacements emit the op through the *module global*
  ``flashinfer_trtllm_fused_allreduce_norm`` (looked up when ``AllReduceFusionPass`` registers
  them, after the plug-ins), vLLM registered ``call_trtllm_fused_allreduce_norm`` as that op
  with the parameters and mutated arguments tpar's op has (so ``auto_functionalized``'s
  output indices keep their meaning), every call the replacements emit is a form tpar has
  decided (``VLLM_FORMS``: the add + RMSNorm, plain or Gemma, the static FP8 one and the
  NVFP4 one taken), and the TP group's custom all-reduce is
  ``get_tp_group().device_communicator.ca_comm``.
- SGLang: its one CUDA fused form is the residual add + RMSNorm (its FP8 one is ROCm's);
  ``flashinfer_allreduce_residual_rmsnorm`` has tpar's parameters, is imported
  inside ``_forward_with_allreduce_fusion`` (per call, so the patch is seen) and nowhere at
  module level, returns (norm_out, residual_out), the caller accepts (None, None) as a
  decline, and ``resolve_fusion_group`` gives the group's coordinator, whose ``ca_comm`` is
  the custom all-reduce.
"""

import ast
import inspect

import pytest

from test_engine_contract import Source, find, imported_at_module_level, lazy_import_inside, wheel
from tpar.engines import SGLANG_VERSIONS, VLLM_VERSIONS
from tpar.engines import fusion


def func_params(fn: ast.FunctionDef):
    """Names and defaults (unparsed) of a function's parameters, in order."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    defaults = [None] * (len(a.posonlyargs + a.args) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    defaults += [ast.unparse(d) if d is not None else None for d in a.kw_defaults]
    return names, dict(zip(names, defaults))


def ours(fn):
    """tpar's parameters, without its private test hooks (leading underscore)."""
    sig = inspect.signature(fn)
    ps = [p for p in sig.parameters.values() if not p.name.startswith("_")]
    return [p.name for p in ps], {p.name: (None if p.default is p.empty else repr(p.default)) for p in ps}


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_vllm_fusion_contract(version):
    src = Source(wheel("vllm", version))
    path = fusion.VLLM_MODULE.replace(".", "/") + ".py"
    tree = src.tree(path)
    fn = find(tree, ast.FunctionDef, fusion.VLLM_FUNC_ATTR)
    assert fn is not None, f"vLLM {version}: {fusion.VLLM_FUNC_ATTR} is gone"
    names, defaults = func_params(fn)
    mine, my_defaults = ours(fusion.vllm_fused_allreduce_norm)
    assert names == mine, f"vLLM {version}: {fusion.VLLM_FUNC_ATTR}{names} vs tpar's {mine}"
    for n in names:
        assert (defaults[n] is None) == (my_defaults[n] is None), f"{n}: vLLM's default {defaults[n]}, tpar's {my_defaults[n]}"
        if defaults[n] is not None:
            assert ast.literal_eval(defaults[n]) == ast.literal_eval(my_defaults[n]), f"{n}: {defaults[n]} vs {my_defaults[n]}"

    # Registered as the op the pattern replacements emit, with the same mutated arguments.
    regs = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "direct_register_custom_op"]
    reg = [c for c in regs if any(k.arg == "op_func" and isinstance(k.value, ast.Name) and k.value.id == fusion.VLLM_FUNC_ATTR for k in c.keywords)]
    assert len(reg) == 1, f"vLLM {version}: {fusion.VLLM_FUNC_ATTR} is not registered as one custom op"
    kw = {k.arg: k.value for k in reg[0].keywords}
    assert ast.literal_eval(kw["op_name"]) == fusion.VLLM_OP_ATTR
    assert ast.literal_eval(kw["mutates_args"]) == fusion.VLLM_MUTATES, "the mutated arguments changed: auto_functionalized's outputs would move"

    # The global is assigned at module level (inside `if flashinfer_comm is not None:`), and
    # every auto_functionalized call in the pattern replacements takes it by that global name.
    assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == fusion.VLLM_OP_ATTR for t in n.targets)]
    assert assigned, f"vLLM {version}: no module global {fusion.VLLM_OP_ATTR}"
    af = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "auto_functionalized"]
    assert af, "no auto_functionalized replacement left"
    fi = [c for c in af if isinstance(c.args[0], ast.Name) and c.args[0].id == fusion.VLLM_OP_ATTR]
    assert fi, f"vLLM {version}: no pattern emits {fusion.VLLM_OP_ATTR}"
    # No replacement reaches the op another way (an attribute, torch.ops.vllm...): the patch
    # of the module global would not be seen there.
    assert f"torch.ops.vllm.{fusion.VLLM_OP_ATTR}.default" in src.text(path)
    assert src.text(path).count(f"ops.vllm.{fusion.VLLM_OP_ATTR}") == 1, "the op is reached through torch.ops somewhere else too"
    codes = set()
    for c in fi:
        k = {x.arg: ast.unparse(x.value) for x in c.keywords}
        codes.add((k.get("pattern_code"), k.get("weight_bias", "0.0"), k.get("quant_out", "None")))
    plain = "flashinfer_comm.AllReduceFusionPattern.kARResidualRMSNorm"
    assert (plain, "0.0", "None") in codes, f"vLLM {version}: the plain fused add-RMSNorm pattern is gone: {codes}"
    assert any(w == "1.0" for _, w, _ in codes), "the Gemma patterns' weight_bias changed"

    # The replacements are traced when the pass registers them: in AllReduceFusionPass.__init__.
    cls = find(tree, ast.ClassDef, "AllReduceFusionPass")
    init = find(cls, ast.FunctionDef, "__init__")
    assert "self.register_patterns()" in ast.unparse(init)

    # The group's custom all-reduce: get_tp_group().device_communicator.ca_comm.
    ps = src.tree("vllm/distributed/parallel_state.py")
    assert find(ps, ast.FunctionDef, "get_tp_group") is not None
    assert "device_communicator" in src.text("vllm/distributed/parallel_state.py")
    cc = find(src.tree("vllm/distributed/device_communicators/cuda_communicator.py"), ast.ClassDef, "CudaCommunicator")
    assert "self.ca_comm" in ast.unparse(find(cc, ast.FunctionDef, "__init__"))


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_fusion_contract(version):
    src = Source(wheel("sglang", version))
    path = fusion.SGLANG_MODULE.replace(".", "/") + ".py"
    tree = src.tree(path)
    fn = find(tree, ast.FunctionDef, fusion.SGLANG_ATTR)
    assert fn is not None, f"SGLang {version}: {fusion.SGLANG_MODULE}.{fusion.SGLANG_ATTR} is gone"
    names, defaults = func_params(fn)
    mine, my_defaults = ours(fusion.sglang_allreduce_residual_rmsnorm)
    assert names == mine, f"SGLang {version}: {names} vs tpar's {mine}"
    for n in names:
        if defaults[n] is not None:
            assert ast.literal_eval(defaults[n]) == ast.literal_eval(my_defaults[n]), f"{n}: {defaults[n]} vs {my_defaults[n]}"
    assert "return (norm_out, residual_out)" in ast.unparse(fn) or "return norm_out, residual_out" in ast.unparse(fn)
    assert "return (None, None)" in ast.unparse(fn), "the original no longer declines with (None, None)"

    # Imported per call where the fused path runs, never at module level anywhere.
    ln = src.tree("sglang/srt/layers/layernorm.py")
    fwd = find(ln, ast.FunctionDef, "_forward_with_allreduce_fusion")
    assert fwd is not None and lazy_import_inside(fwd, fusion.SGLANG_MODULE, fusion.SGLANG_ATTR)
    body = ast.unparse(fwd)
    assert "fused_result[0] is not None" in body, "the caller no longer treats a None result as a decline"
    for name in src.names:
        if name.startswith("sglang/"):
            assert not imported_at_module_level(src.tree(name), fusion.SGLANG_MODULE, fusion.SGLANG_ATTR), f"{name} binds the original at import"
    # Every call of it binds to tpar's parameters.
    for name in src.names:
        if not name.startswith("sglang/") or fusion.SGLANG_ATTR not in src.text(name):
            continue
        for c in ast.walk(src.tree(name)):
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == fusion.SGLANG_ATTR:
                inspect.signature(fusion.sglang_allreduce_residual_rmsnorm).bind(*[None] * len(c.args), **{k.arg: None for k in c.keywords})

    # The group the fused kernel reduces over, and its custom all-reduce.
    rfg = find(tree, ast.FunctionDef, "resolve_fusion_group")
    assert rfg is not None and [a.arg for a in rfg.args.kwonlyargs] == ["use_attn_tp_group"]
    assert "ca_comm" in src.text("sglang/srt/distributed/parallel_state.py")


#: What tpar does with each call vLLM's pass emits, by (pattern, weight_bias, quant_out,
#: scale_out, scale_factor) as the replacement writes them: taken by tpar's family kernel,
#: or handed to FlashInfer.
VLLM_FORMS = {
    ("kARResidualRMSNorm", "0.0", "None", "None", None): "taken",  # add + RMSNorm, with or without norm_out
    ("kARResidualRMSNorm", "1.0", "None", "None", None): "taken",  # Gemma
    ("kARResidualRMSNormFP8Quant", "0.0", "result_quant", "None", "scale"): "taken",  # + static FP8
    ("kARResidualRMSNormFP4Quant", "0.0", "quant_result", "output_scale_fp8", "input_global_scale"): "taken",  # + NVFP4 (swizzled scales)
}


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_vllm_fusion_forms(version):
    """Every call vLLM's pass emits is one tpar knows (VLLM_FORMS): a new pattern, a new
    weight offset or quant output fails here, so that the routing is decided for it. The
    no-residual patterns pass a zeroed residual (tpar adds it, as FlashInfer does), and the
    FP8 patterns' quant is vLLM's static per-tensor FP8 e4m3fn (``kFp8StaticTensorSym``:
    ``static_scaled_fp8_quant``, tpar's ``fp8_scale`` semantics)."""
    src = Source(wheel("vllm", version))
    tree = src.tree(fusion.VLLM_MODULE.replace(".", "/") + ".py")
    seen = set()
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        for fn in [n for n in ast.walk(cls) if isinstance(n, ast.FunctionDef) and n.name == "replacement"]:
            for c in ast.walk(fn):
                if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "auto_functionalized"):
                    continue
                if not (isinstance(c.args[0], ast.Name) and c.args[0].id == fusion.VLLM_OP_ATTR):
                    continue
                k = {x.arg: ast.unparse(x.value) for x in c.keywords if x.arg}
                form = (k["pattern_code"].split(".")[-1], k.get("weight_bias", "0.0"), k["quant_out"], k["scale_out"], k.get("scale_factor"))
                assert form in VLLM_FORMS, f"vLLM {version}: {cls.name} emits {form}, which tpar has not decided"
                seen.add(form)
                if k["norm_out"] != "None":
                    # No residual in the pattern: the replacement passes a zeroed one.
                    assert f"{k['residual']} = torch.zeros_like({k['allreduce_in']})" in ast.unparse(fn), f"{cls.name}: the residual is not zeros"
                if form[0] == "kARResidualRMSNormFP8Quant":
                    init = ast.unparse(find(cls, ast.FunctionDef, "__init__"))
                    assert "self.quant_dtype = torch.float8_e4m3fn" in init and "MatcherQuantFP8(kFp8StaticTensorSym)" in init, f"{cls.name}: not static per-tensor e4m3fn"
    assert seen == set(VLLM_FORMS), f"vLLM {version}: forms no longer emitted: {set(VLLM_FORMS) - seen}"
    # The FP8 quant tpar's fp8_scale reproduces divides by the scale (static_scaled_fp8_quant).
    assert "kFp8StaticTensorSym" in src.text("vllm/model_executor/layers/quantization/utils/quant_utils.py")


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_fusion_forms(version):
    """SGLang's fused all-reduce + RMSNorm on CUDA is one form: with a residual, FlashInfer's
    ``kARResidualRMSNorm``, no quant output, no weight offset (GemmaRMSNorm passes its
    ``gemma_weight``, ``w + 1`` in the weight's dtype). The fused all-reduce + RMSNorm + FP8
    path is AITER's only (ROCm: ``_use_aiter``, per-group dynamic scales), so tpar has no FP8
    call to route there; a version that adds one on CUDA fails here."""
    src = Source(wheel("sglang", version))
    fn = find(src.tree(fusion.SGLANG_MODULE.replace(".", "/") + ".py"), ast.FunctionDef, fusion.SGLANG_ATTR)
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "dict"]
    assert len(calls) == 1, "the kwargs of allreduce_fusion moved"
    kw = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert kw["pattern"].endswith("AllReduceFusionPattern.kARResidualRMSNorm")
    assert not {"quant_out", "scale_out", "scale_factor", "weight_bias"} & set(kw), kw
    assert "kwargs[" not in ast.unparse(fn).replace("kwargs['fp32_acc']", "").replace("kwargs['trigger_completion_at_end']", ""), "another keyword is added"

    ln = src.tree("sglang/srt/layers/layernorm.py")
    fwd = ast.unparse(find(ln, ast.FunctionDef, "_forward_with_allreduce_fusion"))
    assert fwd.count("flashinfer_allreduce_residual_rmsnorm(") == 1 and "if residual is not None:" in fwd, "a fused call without a residual"
    quant = find(ln, ast.FunctionDef, "_forward_with_allreduce_fusion_quant_per_group")
    assert "    if residual is None or not _use_aiter:\n        return None" in ast.unparse(quant), "the fused AR + RMSNorm + FP8 path is no longer ROCm only"
    gemma = find(ln, ast.ClassDef, "GemmaRMSNorm")
    fwf = ast.unparse(find(gemma, ast.FunctionDef, "forward_with_allreduce_fusion"))
    assert "self.gemma_weight" in fwf
    assert "self.gemma_weight.copy_(self.weight.data).add_(1.0)" in ast.unparse(find(gemma, ast.FunctionDef, "refresh_gemma_weight"))
    aif = find(src.tree("sglang/srt/layers/layer_boundary/fusions/allreduce.py"), ast.FunctionDef, "attn_input_fusions")
    assert "and _use_aiter" in ast.unparse(aif), "fuses_quant is no longer AITER only"
    # No CUDA call of FlashInfer's quantising patterns anywhere.
    for name in src.names:
        if name.startswith("sglang/"):
            assert "FP8Quant" not in src.text(name) or "NPUSituMXFP8Quant" in src.text(name), f"{name} uses a quantising fusion pattern"


def test_fused_routing_on_cpu_ranks():
    """tpar's side of both engines' calls, in real rank processes on CPU tensors: taken
    calls bit for bit the reference in each form the engines ask for (vLLM's op: with and
    without a residual, plain and Gemma, bf16 and static FP8 output; SGLang's: plain and with
    GemmaRMSNorm's weight); calls tpar must hand back reach the engine's original, which here
    records the call (the engines' FlashInfer kernels need their GPUs)."""
    from ranks import run_ranks

    recs = run_ranks(2, "fusion_routing")
    for r in recs:
        assert not r.get("hung"), r["output"]
        assert r.get("ok"), f"rank {r['rank']}: {r.get('error_type')}: {r.get('message')}\n{r['output']}"
        res = r["result"]
        assert res["vllm_inplace"] and res["vllm_norm_out"] and res["sglang"] and res["sglang_gemma"], res
        assert len(res["vllm_forms"]) == 12 and all(res["vllm_forms"].values()), res["vllm_forms"]
        assert res["handed_back"] == [
            "code3-wb0.0-qtorch.uint8-sTrue-soTrue-wtorch.bfloat16",  # NVFP4 with scales not of the swizzled tensor's size
            "code3-wb0.0-qtorch.uint8-sFalse-soTrue-wtorch.bfloat16",  # NVFP4 without a global scale
            "code3-wb0.0-qtorch.uint8-sTrue-soTrue-wtorch.bfloat16",  # NVFP4 codes of the wrong shape
            "code4-wb0.0-qtorch.float8_e4m3fn-sTrue-soFalse-wtorch.bfloat16",  # the Out-FP8 pattern
            "code1-wb0.5-qNone-sFalse-soFalse-wtorch.bfloat16",  # another weight offset
            "code1-wb0.0-qNone-sFalse-soFalse-wtorch.float32",  # a float32 weight
            "code2-wb0.0-qtorch.float8_e4m3fn-sFalse-soFalse-wtorch.bfloat16",  # FP8 without a static scale
            "code2-wb0.0-qtorch.bfloat16-sTrue-soFalse-wtorch.bfloat16",  # a quant_out tpar does not write
            "code2-wb0.0-qtorch.float8_e4m3fn-sTrue-soFalse-wtorch.bfloat16",  # a float64 scale
            "code1-wb0.0-qtorch.float8_e4m3fn-sTrue-soFalse-wtorch.bfloat16",  # the plain pattern with a quant_out
        ], res["handed_back"]
        assert res["vllm_pass_family"] and res["family_out_args"], res
