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
  output indices keep their meaning), the plain pattern is
  ``AllReduceFusionPattern.kARResidualRMSNorm`` (the quantised and Gemma ones, which tpar
  hands back, differ by their pattern code or a ``weight_bias``), and the TP group's custom
  all-reduce is ``get_tp_group().device_communicator.ca_comm``.
- SGLang: ``flashinfer_allreduce_residual_rmsnorm`` has tpar's parameters, is imported
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
    assert any(w == "1.0" for _, w, _ in codes), "the Gemma patterns' weight_bias (which tpar hands back) changed"

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


def test_fused_routing_on_cpu_ranks():
    """tpar's side of both engines' calls, in real rank processes on CPU tensors: taken
    calls bit for bit the reference in each form the engines ask for; calls tpar must hand
    back (a Gemma weight offset, a quantised output, a weight of another dtype) reach the
    engine's original, which here records the call (the engines' FlashInfer kernels need
    their GPUs)."""
    from ranks import run_ranks

    recs = run_ranks(2, "fusion_routing")
    for r in recs:
        assert not r.get("hung"), r["output"]
        assert r.get("ok"), f"rank {r['rank']}: {r.get('error_type')}: {r.get('message')}\n{r['output']}"
        res = r["result"]
        assert res["vllm_inplace"] and res["vllm_norm_out"] and res["sglang"], res
        assert res["handed_back"] == ["gemma", "quant", "dtype"], res
        assert res["vllm_pass_family"] and res["family_out_args"], res
