"""vLLM's compile passes as a GPU rank imports them, with tpar's plug-in, on a CPU: the
platform vLLM sees faked to CUDA (sm_120 and sm_90) before anything of vLLM's compile stack
is imported.

On a CUDA platform, vLLM's pass manager (``vllm/compilation/passes/pass_manager.py``) imports
its CUDA-only fusion modules at module level (activation + quant, RMSNorm + quant, QK-norm +
RoPE, attention + quant, the all-reduce fusion, ...), and these name vLLM's compiled
``torch.ops._C`` ops at import, several without a hasattr guard. tpar's plug-in imports that
pass manager and the all-reduce fusion module when vLLM loads its plug-ins
(``tpar.engines.fusion.install``, ``vllm_pass.install``), before the harness's stages run. The
GPU carry stubs vLLM's ``_C`` extension (scripts/engine_carry.py ``STUBS``), so the harness
registers ``C_OP_STUBS`` before the engine's set-up (``engine_harness.engine_setup``), as a
real install has ``_C`` before its plug-ins load. A CPU run never takes those branches (its
platform is not CUDA when the modules are imported), so this test takes them: in a
subprocess per capability it fakes the platform (``engine_fusion.fake_platform``), runs the
harness's own set-up (one rank, gloo; vLLM's plug-in loader with ``TPAR_ENABLE=1``), then
configures vLLM's pass manager with the fusion stage's config (``engine_fusion._config``, a
GPU's executor) and fails if:

- tpar logged a warning (the plug-in's fusion routing or pass not installed: an op missing
  at import, say ``_C.rotary_embedding``);
- a module that the pass manager's CUDA branches import (read from its source) is not
  loaded, or a name they import is missing from the pass manager;
- the all-reduce fusion module (what ``tpar.engines.fusion`` routes) is not loaded, or vLLM's
  ``flashinfer_trtllm_fused_allreduce_norm`` is not routed to tpar where that module has
  FlashInfer (FlashInfer is in neither the CPU test's site nor the GPU carry: there vLLM
  defines no such op, and the check is that the import succeeded);
- tpar's pass (``TparAllReduceFusionPass``) is not in the configured pass list after the
  no-op elimination.

The vLLM tree is the unpacked wheel (``engine_carry.prepare``, what the CPU engine tests use)
and, where one was built here, the GPU carry's vLLM files (``.gpu/engines``, with this
machine's site for the dependencies: the carry's are built for the GPU's Python).
Imports and one configure only: no compile (test_vllm_fusion_pass.py compiles on CPU).
"""

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.insert(0, SCRIPTS)

import engine_carry  # noqa: E402

DEADLINE_S = 300
PASS_MANAGER = "vllm.compilation.passes.pass_manager"


def cuda_branch_imports(path, package):
    """(module, names) of every import in a module-level ``if`` of ``path`` whose condition
    asks the platform whether it is CUDA (``is_cuda()``, ``is_cuda_alike()``)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        calls = {n.func.attr for n in ast.walk(node.test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        if not calls & {"is_cuda", "is_cuda_alike"}:
            continue
        for imp in node.body:
            if isinstance(imp, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - (imp.level - 1)] if imp.level else []
                mod = ".".join(base + ([imp.module] if imp.module else [])) if imp.level else imp.module
                out.append((mod, [a.asname or a.name for a in imp.names]))
    return out


def child(capability):
    """The subprocess: prints one JSON line (see the module)."""
    import importlib
    import importlib.util
    import logging
    import tempfile

    import torch

    warned = []

    class Keep(logging.Handler):
        def emit(self, record):
            warned.append(record.getMessage())

    logging.getLogger("tpar").addHandler(Keep(level=logging.WARNING))
    import engine_fusion

    engine_fusion.fake_platform(capability)  # before anything of vLLM's compile stack
    import engine_harness

    with tempfile.TemporaryDirectory() as tmp:
        eng = engine_harness.engine_setup("vllm", 0, 1, os.path.join(tmp, "init"), torch.device("cpu"), ["settings", "fusion"])
    import vllm

    rec = {"warnings": warned[:], "capability": capability, "vllm": vllm.__file__}
    pm_mod = sys.modules.get(PASS_MANAGER)
    rec["pass_manager_loaded"] = pm_mod is not None
    pm_file = importlib.util.find_spec(PASS_MANAGER).origin
    wanted = cuda_branch_imports(pm_file, PASS_MANAGER.rsplit(".", 1)[0])
    rec["cuda_modules"] = [m for m, _ in wanted]
    rec["not_loaded"] = [m for m, _ in wanted if m not in sys.modules]
    rec["names_missing"] = [n for _, names in wanted for n in names if pm_mod is None or not hasattr(pm_mod, n)]
    for m, _ in wanted:  # loaded already; a module not loaded raises here, with its reason
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - reported
            rec.setdefault("import_errors", {})[m] = f"{type(e).__name__}: {e}"
    from tpar.engines import fusion

    arf = sys.modules.get(fusion.VLLM_MODULE)
    rec["allreduce_fusion_loaded"] = arf is not None
    rec["flashinfer"] = arf is not None and getattr(arf, "flashinfer_comm", None) is not None
    rec["routed"] = arf is not None and getattr(arf, "_tpar_original_" + fusion.VLLM_OP_ATTR, None) is not None
    missing = []
    for schema in engine_carry.C_OP_STUBS:  # every stub registered (before the set-up, by the harness)
        base, _, overload = schema.split("(", 1)[0].partition(".")
        if not hasattr(torch.ops._C, base) or not hasattr(getattr(torch.ops._C, base), overload or "default"):
            missing.append(f"{base}.{overload or 'default'}")
    rec["c_ops_missing"] = missing
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.config import set_current_vllm_config

    cfg = engine_fusion._config(2, 1024, torch.bfloat16, "cuda")  # the fusion stage's, on a GPU
    with set_current_vllm_config(cfg, check_compile=False):
        pm = PostGradPassManager()
        pm.configure(cfg)
    rec["passes"] = [type(p).__name__ for p in pm.passes]
    rec["warnings"] = warned
    rec["tp_world"] = eng.tp.world_size
    print("RESULT " + json.dumps(rec), flush=True)


@pytest.mark.parametrize("capability", [120, 90])
@pytest.mark.parametrize("tree", ["wheel", "carry"])
@pytest.mark.parametrize("version", engine_carry.versions("vllm"))
def test_cuda_imports_with_the_plugin(version, tree, capability):
    if tree == "carry":
        src = os.path.join(engine_carry.CARRY, f"vllm-{version}")
        if not os.path.isdir(src):
            pytest.skip(f"no GPU carry of vLLM {version} here ({src}: built by scripts/engine_carry.py); the wheel's tree is tested")
        paths = [src, engine_carry.build_site(None)]
    else:
        paths = engine_carry.prepare("vllm", version)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [SCRIPTS] + inherited), TPAR_ENABLE="1")
    # as scripts/engine_harness.py's launcher sets them for vLLM's ranks
    env.update({"VLLM_DISABLE_PYNCCL": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "OMP_NUM_THREADS": "1"})
    for k in ("VLLM_TARGET_DEVICE", "VLLM_ALLREDUCE_USE_FLASHINFER"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), str(capability)], env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"the child failed (rc {r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    rec = json.loads(lines[-1][len("RESULT "):])
    said = r.stderr[-3000:]
    assert not rec["warnings"], f"tpar warned at plug-in load on a CUDA platform: {rec['warnings']}\n{said}"
    assert rec["vllm"].startswith(paths[0] + os.sep), f"vLLM imported from {rec['vllm']}, not {paths[0]}"
    assert not rec["c_ops_missing"], rec
    assert rec["pass_manager_loaded"] and rec["cuda_modules"], rec
    assert not rec["not_loaded"] and not rec["names_missing"] and not rec.get("import_errors"), rec
    assert rec["allreduce_fusion_loaded"], rec
    assert rec["routed"] == rec["flashinfer"], f"vLLM's fused op routed to tpar: {rec['routed']}, FlashInfer here: {rec['flashinfer']}"
    names = rec["passes"]
    assert "TparAllReduceFusionPass" in names, f"tpar's pass is not in vLLM's pass list: {names}"
    assert "NoOpEliminationPass" in names[: names.index("TparAllReduceFusionPass")], names


if __name__ == "__main__":
    child(int(sys.argv[1]))
