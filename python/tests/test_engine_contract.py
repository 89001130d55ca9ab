"""The drop-ins against the engines' real source, for every pinned version.

Downloads the pinned vLLM and SGLang wheels (no dependencies, sha256 checked against
scripts/engine_carry.py's pins, into the git-ignored .engine-wheels/) and reads their source
with ``ast`` — nothing of the engines is imported here (test_engine_real.py runs them). Checks
that what the plug-ins replace exists where they replace it, that the engines import it
lazily (no import at module level, inside ``try``/``if`` included, where a later patch would
not be seen), that the engines' calls bind to the drop-in's and the original's signatures,
and that every attribute the engines read on their custom all-reduce object — through
``ca_comm`` or any alias of it, ``getattr``/``hasattr`` with a constant name included — is a
real attribute of a constructed drop-in or listed below with the reason it is not needed.
"""

import ast
import inspect
import os
import sys
import tempfile
import warnings
import zipfile

import pytest

from tpar.engines import SGLANG_VERSIONS, VLLM_VERSIONS, TparCustomAllreduce
from tpar.engines import sglang as tpar_sglang
from tpar.engines import vllm as tpar_vllm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import engine_carry  # noqa: E402

# The contract: what both engines call on the object (the engines' own classes define each).
CONTRACT = ["should_custom_ar", "custom_all_reduce", "all_reduce", "capture", "register_graph_buffers", "close"]

# Attributes an engine reads on its custom all-reduce object that tpar does not provide,
# and why that is safe. A new attribute in a new engine version fails the test until it is
# either provided or listed here.
V2_ONLY = "read only after isinstance(comm, CustomAllReduceV2): SGLang's v2 class with its push/multicast planes, never tpar's"
ROCM = "ROCm (aiter) path, gated by hasattr: tpar's class lacks it, so SGLang takes its NCCL path"
NOT_PROVIDED = {
    "vllm": {
        "effective_max_size": "compilation/passes/fusion/allreduce_rms_fusion.py: a `ca_comm` that is ROCm's aiter object, not the custom all-reduce",
        "supports_dynamic_hidden_dim": "the same ROCm aiter object",
        "supports_per_group_quant": "the same ROCm aiter object",
    },
    "sglang": {
        "all_gather_reg": ROCM,
        "all_gather_unreg": ROCM,
        "should_custom_ag": ROCM,
        "reduce_scatter": ROCM,
        "fused_allreduce_rmsnorm": ROCM,
        "fused_ar_rms": ROCM,
        "custom_fused_ar_rms": ROCM + " ('ROCm/HIP Only')",
        "custom_fused_ar_rms_per_group_quant": ROCM + " (gfx95 only)",
        "obj": "NVLink vocab gather (after getattr(ca_comm, 'has_multicast', False), False for tpar) and " + V2_ONLY,
        "max_push_size": V2_ONLY,
        "_push_counter": V2_ONLY,
        "supports_push": V2_ONLY,
    },
}


def wheel(name: str, version: str) -> str:
    """The pinned wheel: downloaded once, its sha256 checked against engine_carry.ENGINES."""
    return engine_carry.engine_wheel(name, version)


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


def module_level_statements(body):
    """Every statement that runs when the module is imported: nested in ``if``/``try``/
    ``with``/``for`` too (class bodies run as well); not inside functions, nor under
    ``if TYPE_CHECKING:`` (never run; its ``else`` is)."""
    for n in body:
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(n, ast.If) and engine_carry._is_type_checking(n.test):
            yield from module_level_statements(n.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            sub = getattr(n, field, None)
            if isinstance(sub, list):
                yield from module_level_statements(sub)


def imported_at_module_level(tree: ast.Module, module: str, attr: str) -> bool:
    return any(
        isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == attr for a in n.names)
        for n in module_level_statements(tree.body)
    )


def call_keywords(fn: ast.FunctionDef, callee: str):
    """Keyword names of every call of `callee` (a plain name) inside fn."""
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == callee]
    return [[k.arg for k in c.keywords] for c in calls], calls


def _own_nodes(scope):
    """The nodes of one scope: nested functions and classes are scopes of their own
    (their decorators belong to this one)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(getattr(n, "decorator_list", []))
            continue
        stack.extend(ast.iter_child_nodes(n))


def _is_ca(e, aliases, self_aliases) -> bool:
    """Whether expression `e` evaluates to the custom all-reduce object: `ca_comm`,
    `<x>.ca_comm`, `getattr(<x>, "ca_comm", ...)`, a local alias of one, `self.<alias>`,
    `cast(T, <one>)`, or a conditional/boolean of them."""
    if isinstance(e, ast.Name):
        return e.id == "ca_comm" or e.id in aliases
    if isinstance(e, ast.Attribute):
        return e.attr == "ca_comm" or (isinstance(e.value, ast.Name) and e.value.id == "self" and e.attr in self_aliases)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name):
        if e.func.id == "getattr" and len(e.args) >= 2 and isinstance(e.args[1], ast.Constant) and e.args[1].value == "ca_comm":
            return True
        if e.func.id == "cast" and len(e.args) == 2:
            return _is_ca(e.args[1], aliases, self_aliases)
    if isinstance(e, ast.NamedExpr):
        return _is_ca(e.value, aliases, self_aliases)
    if isinstance(e, ast.IfExp):
        return _is_ca(e.body, aliases, self_aliases) or _is_ca(e.orelse, aliases, self_aliases)
    if isinstance(e, ast.BoolOp):
        return any(_is_ca(v, aliases, self_aliases) for v in e.values)
    return False


def _assigned(n):
    """(value, targets) of an assignment-like node, else (None, [])."""
    if isinstance(n, ast.Assign):
        return n.value, n.targets
    if isinstance(n, (ast.AnnAssign, ast.NamedExpr)):
        return n.value, [n.target]
    if isinstance(n, ast.withitem) and n.optional_vars is not None:
        return n.context_expr, [n.optional_vars]
    return None, []


def ca_reads(tree: ast.Module):
    """{attribute: [line, ...]} read on the custom all-reduce object in one module, through
    any alias: `X.attr`, `getattr(X, "attr", ...)`, `hasattr(X, "attr")` where X is
    `ca_comm`, `<expr>.ca_comm`, a variable assigned from one (in the same function), or a
    `self.<field>` a method of the class assigned from one."""
    out = {}
    self_aliases = {}
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        fields = set()
        for n in ast.walk(cls):
            value, targets = _assigned(n)
            if value is not None and _is_ca(value, set(), set()):
                fields |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr != "ca_comm"}
        for n in ast.walk(cls):
            self_aliases[id(n)] = fields
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))]:
        fields = self_aliases.get(id(scope), set())
        nodes = list(_own_nodes(scope))
        aliases = set()
        grew = True
        while grew:  # `a = x.ca_comm; b = a` ...
            grew = False
            for n in nodes:
                value, targets = _assigned(n)
                if value is not None and _is_ca(value, aliases, fields):
                    for t in targets:
                        if isinstance(t, ast.Name) and t.id not in aliases:
                            aliases.add(t.id)
                            grew = True
        for n in nodes:
            if isinstance(n, ast.Attribute) and _is_ca(n.value, aliases, fields):
                out.setdefault(n.attr, []).append(n.lineno)
            elif (
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
                and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)
                and _is_ca(n.args[0], aliases, fields)
            ):
                out.setdefault(n.args[1].value, []).append(n.lineno)
    return out


def accessed_attributes(src: Source, prefix: str):
    """{attribute: ["file:line", ...]} read on the custom all-reduce object anywhere under
    prefix (see ca_reads)."""
    out = {}
    for name in src.names:
        # Every alias starts from an expression naming `ca_comm` (see _is_ca): a file
        # without the word has none, and is not parsed.
        if name.startswith(prefix) and "ca_comm" in src.text(name):
            for attr, lines in ca_reads(src.tree(name)).items():
                out.setdefault(attr, []).extend(f"{name}:{line}" for line in lines)
    return out


def signature_of(fn: ast.FunctionDef) -> inspect.Signature:
    """The signature of a function in the engine's source, without importing it: its
    parameters (names, kinds, whether defaulted), annotations and bodies dropped."""
    stub = ast.FunctionDef(name=fn.name, args=fn.args, body=[ast.Pass()], decorator_list=[], returns=None, type_params=[])
    for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs + [fn.args.vararg, fn.args.kwarg]:
        if a is not None:
            a.annotation = None
    args = fn.args
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    ns = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[])), "<engine signature>", "exec"), ns)
    return inspect.signature(ns[fn.name])


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


@pytest.fixture(scope="module")
def dropin():
    """A real drop-in, constructed as an engine does on a one-rank group (it sets every
    instance attribute, then stops: there is nobody to all-reduce with). Attributes are
    checked on it, not by name."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
        try:
            objs = {cls.__name__: cls(group=dist.group.WORLD, device="cpu") for cls in (tpar_vllm.VllmCustomAllreduce, tpar_sglang.SglangCustomAllreduce)}
            yield objs
        finally:
            dist.destroy_process_group()


def provided(obj, attr: str) -> bool:
    return hasattr(obj, attr)


def test_dropin_attributes_are_real(dropin):
    """The attributes the engines read are the instance's own, with the engines' meaning."""
    for obj in dropin.values():
        for attr in ("disabled", "original_disabled", "_IS_CAPTURING", "max_size", "world_size", "group", "device", "rank"):
            assert attr in vars(obj), f"{type(obj).__name__}.{attr} is not an instance attribute"
        assert obj.disabled is True and obj.original_disabled is True  # one rank: nothing to do
        assert obj._IS_CAPTURING is False
        assert obj.fully_connected is False and obj.has_multicast is False and obj.mnnvl_lamport_ag_multicast_ptr == 0


@pytest.mark.parametrize("version", engine_carry.versions("vllm"))
def test_vllm(version, dropin):
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
        inspect.signature(tpar_vllm.VllmCustomAllreduce.__init__).bind(None, **{n: None for n in k})

    for m in CONTRACT:
        fn = find(engine_cls, ast.FunctionDef, m)
        assert fn is not None, f"vLLM {version}: CustomAllreduce.{m} is gone: the contract changed"
        assert_compatible(fn, getattr(TparCustomAllreduce, m), f"vLLM {version} {m}")
    assert "self.disabled" in ast.unparse(engine_cls)

    used = accessed_attributes(src, "vllm/")
    assert {"should_custom_ar", "custom_all_reduce", "disabled", "capture", "mnnvl_lamport_ag_multicast_ptr"} <= set(used), sorted(used)
    obj = dropin["VllmCustomAllreduce"]
    missing = {a: used[a][:3] for a in used if not provided(obj, a) and a not in NOT_PROVIDED["vllm"]}
    assert not missing, f"vLLM {version} reads attributes tpar does not provide (provide them or list them in NOT_PROVIDED with a reason): {missing}"
    stale = set(NOT_PROVIDED["vllm"]) - set(used)
    assert not stale, f"NOT_PROVIDED lists attributes vLLM {version} no longer reads: {sorted(stale)}"

    plugins = src.text("vllm/plugins/__init__.py")
    assert '"vllm.general_plugins"' in plugins and "VLLM_PLUGINS" in plugins


@pytest.mark.parametrize("version", engine_carry.versions("sglang"))
def test_sglang(version, dropin):
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
    original = signature_of(dispatch)
    for k in kws:
        # tpar's dispatcher checks each call against the original's signature (a TypeError
        # otherwise, which SGLang logs before falling back): SGLang's own calls must bind.
        original.bind(**{n: None for n in k})
    with pytest.raises(TypeError):
        original.bind(group=None, device=None, not_a_parameter=None)  # the check can fail
    kws, calls = call_keywords(init, "CAClass")
    assert calls, "GroupCoordinator.__init__ no longer instantiates CAClass"
    for k in kws:
        inspect.signature(tpar_sglang.SglangCustomAllreduce.__init__).bind(None, **{n: None for n in k})

    for m in CONTRACT:
        fn = find(engine_cls, ast.FunctionDef, m)
        if fn is None:
            assert m == "all_reduce", f"SGLang {version}: CustomAllreduce.{m} is gone: the contract changed"
            continue  # SGLang's class reduces through a private method; vLLM's name is kept
        assert_compatible(fn, getattr(TparCustomAllreduce, m), f"SGLang {version} {m}")
    assert "self.original_disabled" in ast.unparse(engine_cls)

    used = accessed_attributes(src, "sglang/srt/")
    assert {"should_custom_ar", "custom_all_reduce", "disabled", "capture", "_IS_CAPTURING"} <= set(used), sorted(used)
    obj = dropin["SglangCustomAllreduce"]
    missing = {a: used[a][:3] for a in used if not provided(obj, a) and a not in NOT_PROVIDED["sglang"]}
    assert not missing, f"SGLang {version} reads attributes tpar does not provide (provide them or list them in NOT_PROVIDED with a reason): {missing}"
    stale = set(NOT_PROVIDED["sglang"]) - set(used)
    assert not stale, f"NOT_PROVIDED lists attributes SGLang {version} no longer reads: {sorted(stale)}"

    plugins = src.text("sglang/srt/plugins/__init__.py")
    assert '"sglang.srt.plugins"' in plugins and "SGLANG_PLUGINS" in plugins


def _calls_to(tree, attr):
    """Every call ``X.attr(...)`` or ``attr(...)`` in ``tree``: (line, positional count, keywords)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name == attr:
                out.append((n.lineno, len(n.args), [k.arg for k in n.keywords]))
    return out


@pytest.mark.parametrize("version", engine_carry.versions("sglang"))
def test_sglang_collectives(version):
    """The all-gather and reduce-scatter hook (tpar/engines/sglang.py ``install_collectives``)
    against SGLang's source: the wrapped ``GroupCoordinator`` methods exist with the
    parameters the wrapper passes on, every call to them in SGLang passes ``(output, input)``
    (positional or by those names), the public methods and the custom ops reach them, and the
    DP-attention functions the engine harness drives exist with the arguments it passes."""
    src = Source(wheel("sglang", version))
    ps = src.tree(tpar_sglang.GROUP_MODULE.replace(".", "/") + ".py")
    group = find(ps, ast.ClassDef, tpar_sglang.GROUP_CLASS)
    assert group is not None, f"SGLang {version}: {tpar_sglang.GROUP_CLASS} is gone"
    wrapper = inspect.signature(tpar_sglang._wrap("x", "all-gather", None))
    for attr in tpar_sglang.COLLECTIVES:
        fn = next((n for n in group.body if isinstance(n, ast.FunctionDef) and n.name == attr), None)
        assert fn is not None, f"SGLang {version}: {tpar_sglang.GROUP_CLASS}.{attr} is gone: its collective would stay SGLang's"
        assert not fn.decorator_list, f"{attr} is decorated in SGLang {version}: the class attribute is not the plain method"
        assert [a.arg for a in fn.args.args] == list(wrapper.parameters) and not fn.args.kwonlyargs and fn.args.vararg is None, (
            f"SGLang {version} {attr}{[a.arg for a in fn.args.args]}: the wrapper takes {list(wrapper.parameters)}"
        )
        calls = []
        for name in src.names:
            if name.startswith("sglang/srt/") and attr in src.text(name):
                calls += [(name, *c) for c in _calls_to(src.tree(name), attr)]
        assert calls, f"SGLang {version} never calls {attr}"
        for name, line, npos, kws in calls:
            assert npos + len(kws) == 2 and set(kws) <= {"output", "input"} and (npos == 2 or "input" in kws), f"{name}:{line} calls {attr} with {npos} positional and {kws}"
    # What routes to them: the public methods (directly on CPUs, else the opaque custom ops,
    # which call the wrapped methods by name: checked above), and the ops themselves.
    for public, op, inner in (("all_gather_into_tensor", "reg_all_gather_into_tensor", "_all_gather_into_tensor"),
                              ("reduce_scatter_tensor", "reg_reduce_scatter_tensor", "_reduce_scatter_tensor")):
        fn = find(group, ast.FunctionDef, public)
        assert fn is not None and _calls_to(fn, op) and _calls_to(fn, inner), f"SGLang {version}: {public} no longer reaches {op} / {inner}"
        assert _calls_to(find(ps, ast.FunctionDef, op), inner), f"SGLang {version}: {op} no longer calls {inner}"
    # The DP-attention functions the harness calls, with its arguments.
    dpa = src.tree("sglang/srt/layers/dp_attention.py")
    for fn_name, args in (("dp_gather_partial", ("global_tokens", "local_tokens", "forward_batch")), ("dp_reduce_scatter_tensor", ("output", "input"))):
        fn = find(dpa, ast.FunctionDef, fn_name)
        assert fn is not None, f"SGLang {version}: dp_attention.{fn_name} is gone"
        signature_of(fn).bind(*args)
    assert find(dpa, ast.ClassDef, "DpPaddingMode") is not None and "MAX_LEN" in ast.unparse(find(dpa, ast.ClassDef, "DpPaddingMode"))


def test_entry_points_name_the_plugins():
    """pyproject.toml registers both plug-ins under the engines' group names."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11+")

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]
    assert eps["vllm.general_plugins"]["tpar"] == "tpar.engines.vllm:register"
    assert eps["sglang.srt.plugins"]["tpar"] == "tpar.engines.sglang:register"
    assert callable(tpar_vllm.register) and callable(tpar_sglang.register)


def test_pinned_versions_agree():
    """The versions tpar.engines names as checked are exactly those the tests run (pinned with
    their wheels' sha256 in scripts/engine_carry.py ENGINES)."""
    assert VLLM_VERSIONS == engine_carry.versions("vllm") and VLLM_VERSIONS
    assert SGLANG_VERSIONS == engine_carry.versions("sglang") and SGLANG_VERSIONS
