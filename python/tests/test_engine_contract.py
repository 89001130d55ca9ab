"""The drop-ins against the engines' real source, for every pinned version.

Downloads the pinned vLLM and SGLang wheels (no dependencies, into the git-ignored
.engine-wheels/ at the repository root) and reads their source with ``ast`` — nothing of the
engines is imported. Checks that what the plug-ins replace exists where they replace it, that
the engines import it lazily (so the replacement is seen), that the engines' calls bind to
``TparCustomAllreduce``'s signatures, and that every attribute the engines touch on their
custom all-reduce object is either provided or listed below with the reason it is not needed.
"""

import ast
import glob
import inspect
import os
import subprocess
import sys
import warnings
import zipfile

import pytest

from tpar.engines import SGLANG_VERSIONS, VLLM_VERSIONS, TparCustomAllreduce
from tpar.engines import sglang as tpar_sglang
from tpar.engines import vllm as tpar_vllm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WHEELS = os.path.join(ROOT, ".engine-wheels")

# The contract: what both engines call on the object (the engines' own classes define each).
CONTRACT = ["should_custom_ar", "custom_all_reduce", "all_reduce", "capture", "register_graph_buffers", "close"]
ATTRIBUTES = ["disabled", "original_disabled"]

# Attributes an engine touches on its custom all-reduce object that tpar does not provide,
# and why that is safe. A new attribute in a new engine version fails the test until it is
# either provided or listed here.
NOT_PROVIDED = {
    "vllm": {
        "effective_max_size": "compilation/passes/fusion/allreduce_rms_fusion.py: a `ca_comm` that is ROCm's aiter object, not the custom all-reduce",
        "supports_dynamic_hidden_dim": "the same ROCm aiter object",
        "supports_per_group_quant": "the same ROCm aiter object",
    },
    "sglang": {
        "all_gather_reg": "ROCm (aiter) all-gather; gated by is_hip() and hasattr",
        "all_gather_unreg": "ROCm (aiter) all-gather; gated by is_hip() and hasattr",
        "should_custom_ag": "ROCm (aiter) all-gather; gated by is_hip() and hasattr",
        "reduce_scatter": "ROCm (aiter) reduce-scatter; gated by is_hip() and hasattr",
        "fused_allreduce_rmsnorm": "ROCm fused all-reduce + RMSNorm ('ROCm/HIP Only'); gated by hasattr",
        "fused_ar_rms": "ROCm fused all-reduce + RMSNorm; gated by hasattr",
        "custom_fused_ar_rms": "ROCm fused all-reduce + RMSNorm ('ROCm/HIP Only' path)",
        "custom_fused_ar_rms_per_group_quant": "ROCm fused all-reduce + RMSNorm + quant ('ROCm/HIP Only' path)",
        "obj": "NVLink vocab gather: only for CustomAllReduceV2 with a multicast plane",
        "max_push_size": "NVLink vocab gather: only for CustomAllReduceV2 with a multicast plane",
    },
}


def wheel(name: str, version: str) -> str:
    os.makedirs(WHEELS, exist_ok=True)
    found = glob.glob(os.path.join(WHEELS, f"{name}-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", WHEELS, f"{name}=={version}"],
            check=True,
        )
        found = glob.glob(os.path.join(WHEELS, f"{name}-{version}-*.whl"))
    assert found, f"no wheel of {name}=={version} in {WHEELS}"
    return found[0]


class Source:
    """Python files of one wheel, parsed on demand."""

    def __init__(self, path: str):
        self.zip = zipfile.ZipFile(path)
        self.names = [n for n in self.zip.namelist() if n.endswith(".py")]
        self._trees = {}

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            assert name in self.names, f"{name} is not in the wheel"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the engines' own invalid escapes
                self._trees[name] = ast.parse(self.zip.read(name).decode(), name)
        return self._trees[name]

    def text(self, name: str) -> str:
        return self.zip.read(name).decode()


def find(tree, kind, name):
    for node in ast.walk(tree):
        if isinstance(node, kind) and node.name == name:
            return node
    return None


def lazy_import_inside(fn: ast.FunctionDef, module: str, attr: str) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == attr for a in n.names) for n in ast.walk(fn))


def imported_at_module_level(tree: ast.Module, module: str, attr: str) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == attr for a in n.names) for n in tree.body)


def call_keywords(fn: ast.FunctionDef, callee: str):
    """Keyword names of every call of `callee` (a plain name) inside fn."""
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == callee]
    return [[k.arg for k in c.keywords] for c in calls], calls


def accessed_attributes(src: Source, prefix: str):
    """Attribute names read on `ca_comm` / `self.ca_comm` anywhere under prefix."""
    out = set()
    for name in src.names:
        if not name.startswith(prefix):
            continue
        for n in ast.walk(src.tree(name)):
            if isinstance(n, ast.Attribute):
                v = n.value
                if (isinstance(v, ast.Name) and v.id == "ca_comm") or (isinstance(v, ast.Attribute) and v.attr == "ca_comm"):
                    out.add(n.attr)
    return out


def params(fn: ast.FunctionDef):
    a = fn.args
    pos = [p.arg for p in a.posonlyargs + a.args][1:]  # without self
    return pos, [p.arg for p in a.kwonlyargs], a.vararg is not None, a.kwarg is not None


def assert_compatible(engine_fn: ast.FunctionDef, ours, where: str):
    """Every call that fits the engine's method fits ours: same positional names in order,
    its keyword-only names accepted, our extra parameters defaulted."""
    pos, kwonly, _, _ = params(engine_fn)
    sig = inspect.signature(ours)
    mine = [p for p in sig.parameters.values() if p.name != "self"]
    mine_pos = [p.name for p in mine if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_kwargs = any(p.kind == p.VAR_KEYWORD for p in mine)
    assert mine_pos[: len(pos)] == pos or has_kwargs and mine_pos[: len(pos)] == pos[: len(mine_pos)], f"{where}: engine {pos}, tpar {mine_pos}"
    names = {p.name for p in mine}
    for k in kwonly:
        assert k in names or has_kwargs, f"{where}: keyword `{k}` of the engine's method is not accepted"
    for p in mine:
        if p.name not in pos and p.name not in kwonly and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            assert p.default is not p.empty, f"{where}: tpar's extra parameter `{p.name}` needs a default"


def provided(attr: str) -> bool:
    return attr in ATTRIBUTES or attr == "_IS_CAPTURING" or hasattr(TparCustomAllreduce, attr)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_vllm(version):
    src = Source(wheel("vllm", version))
    mod_file = tpar_vllm.TARGET_MODULE.replace(".", "/") + ".py"
    engine_cls = find(src.tree(mod_file), ast.ClassDef, tpar_vllm.TARGET_ATTR)
    assert engine_cls is not None, f"vLLM {version}: {tpar_vllm.TARGET_MODULE}.{tpar_vllm.TARGET_ATTR} is gone"

    cc = "vllm/distributed/device_communicators/cuda_communicator.py"
    cls = find(src.tree(cc), ast.ClassDef, "CudaCommunicator")
    init = find(cls, ast.FunctionDef, "__init__")
    assert lazy_import_inside(init, tpar_vllm.TARGET_MODULE, tpar_vllm.TARGET_ATTR), "the class is no longer imported inside CudaCommunicator.__init__"
    assert not imported_at_module_level(src.tree(cc), tpar_vllm.TARGET_MODULE, tpar_vllm.TARGET_ATTR), "imported at module level: a later patch is not seen"
    kws, calls = call_keywords(init, tpar_vllm.TARGET_ATTR)
    assert calls, "CudaCommunicator.__init__ no longer instantiates CustomAllreduce"
    for k in kws:
        inspect.signature(TparCustomAllreduce.__init__).bind(None, **{n: None for n in k})

    for m in CONTRACT:
        fn = find(engine_cls, ast.FunctionDef, m)
        assert fn is not None, f"vLLM {version}: CustomAllreduce.{m} is gone: the contract changed"
        assert_compatible(fn, getattr(TparCustomAllreduce, m), f"vLLM {version} {m}")
    assert "self.disabled" in ast.unparse(engine_cls)

    used = accessed_attributes(src, "vllm/")
    assert {"should_custom_ar", "custom_all_reduce", "disabled", "capture"} <= used, used
    missing = {a for a in used if not provided(a)} - set(NOT_PROVIDED["vllm"])
    assert not missing, f"vLLM {version} uses attributes tpar does not provide: {sorted(missing)}"

    plugins = src.text("vllm/plugins/__init__.py")
    assert '"vllm.general_plugins"' in plugins and "VLLM_PLUGINS" in plugins


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang(version):
    src = Source(wheel("sglang", version))
    mod_file = tpar_sglang.TARGET_MODULE.replace(".", "/") + ".py"
    tree = src.tree(mod_file)
    dispatch = find(tree, ast.FunctionDef, tpar_sglang.TARGET_ATTR)
    assert dispatch is not None, f"SGLang {version}: {tpar_sglang.TARGET_ATTR} is gone"
    engine_cls = find(tree, ast.ClassDef, "CustomAllreduce")
    assert engine_cls is not None

    ps = "sglang/srt/distributed/parallel_state.py"
    init = find(find(src.tree(ps), ast.ClassDef, "GroupCoordinator"), ast.FunctionDef, "__init__")
    assert lazy_import_inside(init, tpar_sglang.TARGET_MODULE, tpar_sglang.TARGET_ATTR), "dispatch_custom_allreduce is no longer imported inside GroupCoordinator.__init__"
    assert not imported_at_module_level(src.tree(ps), tpar_sglang.TARGET_MODULE, tpar_sglang.TARGET_ATTR)
    kws, calls = call_keywords(init, tpar_sglang.TARGET_ATTR)
    assert calls, "GroupCoordinator.__init__ no longer calls dispatch_custom_allreduce"
    for k in kws:
        assert tpar_sglang.dispatch_custom_allreduce(**{n: None for n in k}) is TparCustomAllreduce
    kws, calls = call_keywords(init, "CAClass")
    assert calls, "GroupCoordinator.__init__ no longer instantiates CAClass"
    for k in kws:
        inspect.signature(TparCustomAllreduce.__init__).bind(None, **{n: None for n in k})

    for m in CONTRACT:
        fn = find(engine_cls, ast.FunctionDef, m)
        if fn is None:
            assert m == "all_reduce", f"SGLang {version}: CustomAllreduce.{m} is gone: the contract changed"
            continue  # SGLang's class reduces through a private method; vLLM's name is kept
        assert_compatible(fn, getattr(TparCustomAllreduce, m), f"SGLang {version} {m}")
    assert "self.original_disabled" in ast.unparse(engine_cls)

    used = accessed_attributes(src, "sglang/srt/")
    assert {"should_custom_ar", "custom_all_reduce", "disabled", "capture"} <= used, used
    missing = {a for a in used if not provided(a)} - set(NOT_PROVIDED["sglang"])
    assert not missing, f"SGLang {version} uses attributes tpar does not provide: {sorted(missing)}"

    plugins = src.text("sglang/srt/plugins/__init__.py")
    assert '"sglang.srt.plugins"' in plugins and "SGLANG_PLUGINS" in plugins


def test_entry_points_name_the_plugins():
    """pyproject.toml registers both plug-ins under the engines' group names."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11+")

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]
    assert eps["vllm.general_plugins"]["tpar"] == "tpar.engines.vllm:register"
    assert eps["sglang.srt.plugins"]["tpar"] == "tpar.engines.sglang:register"
    assert callable(tpar_vllm.register) and callable(tpar_sglang.register)
