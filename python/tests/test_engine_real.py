"""The plug-ins inside the engines' real code, with ``TPAR_ENABLE=1``, on CPU rank processes.

scripts/engine_carry.py downloads the pinned vLLM and SGLang wheels and the wheels their
distributed layer imports (sha256 checked, into the git-ignored .engine-wheels/), and
unpacks them without the engines' compiled extensions, with the same stubs as the GPU carry
(engine_carry.STUBS). scripts/engine_harness.py then runs, in real rank processes over gloo:
the engine's own plug-in loader (which finds tpar through the entry points of the installed
wheel), its own group set-up, and its own all-reduce dispatch, with tpar's CPU backend behind
the drop-in. A test fails if the replacement does not take (the TP group's ``ca_comm`` is not
tpar's, or is disabled), if tpar's own counter of the calls it reduced (``served_calls``)
does not grow where ``should_custom_ar`` said yes (eager calls, and vLLM's compiled
``torch.ops.vllm.all_reduce``), if a call tpar served is not bitwise the rank-order sum, if a
call the engine's fallback took is beyond its rounding of the exact sum, if a plug-in setting
did not reach the engine (FlashInfer's all-reduce still first, ``TPAR_`` not copied to Ray
workers, SGLang's dispatcher not tpar's or not checking calls), or if a killed
rank is not reported to the others within 1 s.

Two ranks alone could not tell tpar from the engine's fallback by the results: a sum of two
has one rounding, so gloo's bits are tpar's. Three ranks (vLLM, eager and compiled calls) are
the world where the fallback's order differs from tpar's; there its calls are judged by
their rounding and tpar's bitwise, and the run shows that the fallback's bits differ.

On a CPU the engines allow less than on a GPU (the harness's docstring says what): CUDA graphs
are not captured, and SGLang registers its all-reduce op for CUDA only. scripts/gpu-engines.sh
runs the same harness on a GPU.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import engine_carry  # noqa: E402


HARNESS = os.path.join(ROOT, "scripts", "engine_harness.py")
#: A run imports the engine's distributed layer in every rank (about 20-40 s on two cores).
DEADLINE_S = 420


def run_harness(engine, version, world, stages, out, args=(), **env):
    paths = engine_carry.prepare(engine, version)
    # The engine's tree first; then what this process was given (a tpar installed with
    # ``pip --target`` outside the environment, say): the ranks import the same tpar.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + inherited), **env)
    e.pop("TPAR_ENABLE", None)  # the harness sets it for the ranks
    for k in ("VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"):
        e.pop(k, None)  # the plug-in must set them itself
    r = subprocess.run(
        [sys.executable, HARNESS, engine, str(world), "--device", "cpu", "--stages", stages, "--out", str(out), "--deadline", str(DEADLINE_S), *args],
        env=e, capture_output=True, text=True, timeout=DEADLINE_S + 60,
    )
    with open(os.path.join(out, f"engine-{engine}-w{world}-cpu.json")) as f:
        recs = json.load(f)
    logs = "\n".join(open(os.path.join(out, f"engine-{engine}-w{world}-r{i}.log")).read()[-3000:] for i in range(world))
    return r, recs, logs


def check_common(r, recs, logs, world, stages):
    """Every stage of ``stages`` passed on every rank, and the run passed."""
    assert len(recs) == world
    for rec in recs:
        assert rec.get("ca_is_tpar"), f"rank {rec['rank']}: the TP group's ca_comm is {rec.get('ca_class')}, not tpar's enabled drop-in: {rec.get('error')}\n{logs}"
        assert rec["ca_class"].startswith("tpar.engines."), rec["ca_class"]
    for stage in stages:
        for rec in recs[:-1] if "kill" in stages else recs:
            st = rec["stages"][stage]
            assert "error" not in st, f"rank {rec['rank']} {stage}: {st['error']}\n{logs}"
            if "skipped" not in st and stage not in ("kill", "settings"):
                assert st["cases"] > 0 and st["wrong"] == 0, f"rank {rec['rank']} {stage}: {st}"
                # tpar's counter: every call it took grew it (chunked calls more than once)
                assert st["served"] >= st["tpar"] > 0, f"rank {rec['rank']} {stage}: tpar's counter saw {st['served']} reductions: {st}"
    if "compile" in stages and "skipped" not in recs[0]["stages"]["compile"]:
        for rec in recs:  # the engine's compiled op reached tpar: one reduction per call
            st = rec["stages"]["compile"]
            assert st["tpar"] == st["served"] == st["cases"], f"rank {rec['rank']}: compiled calls not served by tpar: {st}"
    assert r.returncode == 0, r.stdout + r.stderr + logs


@pytest.mark.parametrize("version", engine_carry.versions("vllm"))
def test_vllm_real_modules(version, tmp_path):
    stages = ["settings", "eager", "compile", "thread", "kill"]
    r, recs, logs = run_harness("vllm", version, 2, ",".join(stages), tmp_path)
    check_common(r, recs, logs, 2, stages)
    eager = recs[0]["stages"]["eager"]
    assert eager["tpar"] == eager["served"] == eager["cases"] - 1, eager  # all but the 14.7 MB float32 call (above max_size), by tpar's counter
    s = recs[0]["stages"]["settings"]["checked"]
    assert s["flashinfer_env"] == "0" and not s["use_flashinfer_allreduce"], s
    assert "TPAR_ENABLE" in s["ray_copies_tpar"], s
    kill = recs[0]["stages"]["kill"]
    assert kill["raised"] == "PeerDiedError", kill


@pytest.mark.parametrize("version", engine_carry.versions("vllm"))
def test_vllm_three_ranks_served_by_tpar(version, tmp_path):
    """Three ranks: the engine's fallback (gloo) adds in its own order, so its bits are not
    tpar's; tpar's calls stay bitwise the rank-order sum, the fallback's are judged by their
    rounding, and tpar's counter shows that it served the calls it was given, compiled ones
    included; and vLLM's sequence-parallel all-gather and reduce-scatter reach tpar, eager
    and inside torch.compile(fullgraph=True). Eager, compile, sp and sp_compile only: a
    third rank process costs import time."""
    stages = ["eager", "compile", "sp", "sp_compile"]
    r, recs, logs = run_harness("vllm", version, 3, ",".join(stages), tmp_path)
    check_common(r, recs, logs, 3, stages)
    for rec in recs:
        # vLLM's own sp_all_gather / sp_reduce_scatter: every call reached tpar (its counter),
        # bitwise the definition; 3 dtypes x 4 row counts x both collectives.
        sp = rec["stages"]["sp"]
        assert sp["tpar"] == sp["served"] == sp["cases"] == 24, sp
        eager = rec["stages"]["eager"]
        assert eager["tpar"] == eager["served"] == eager["cases"] - 1 and eager["fallback"] == 1, eager  # the 14.7 MB float32 call: gloo
        assert eager["fallback_other_bits"] == 1, f"the fallback's sum of three has tpar's bits: no order told apart: {eager}"
    # vLLM's sp_all_gather / sp_reduce_scatter compiled: Dynamo traces them into the device
    # communicator's custom_all_gather / custom_reduce_scatter and so into tpar's drop-in,
    # which puts one op of its own in the graph (tpar::engine_all_gather /
    # engine_reduce_scatter) that decides when it runs.
    for rec in recs:
        st = rec["stages"]["sp_compile"]
        # 3 dtypes x (1, 8 rows) x both collectives, each a compiled graph, each served by tpar
        assert "error" not in st and "untraceable" not in st, f"rank {rec['rank']} sp_compile: {st}\n{logs}"
        assert st["tpar"] == st["served"] == st["cases"] == 12 and st["wrong"] == 0, st
        assert st["graphs"] == {"sp_all_gather": 6, "sp_reduce_scatter": 6}, st
        # an all-gather tpar declines when the op runs: vLLM's own fallback inside the op,
        # bitwise, tpar's counter unmoved, no second graph
        assert st["declined"] == {"served": 0, "ok": True}, st
    assert r.returncode == 0, r.stdout + r.stderr + logs


@pytest.mark.parametrize("version", engine_carry.versions("vllm"))
def test_vllm_batch_invariant_takes_every_size(version, tmp_path):
    """VLLM_BATCH_INVARIANT=1: vLLM's own class takes every size (one reduction order at
    every batch size); tpar's must too, above max_size included, bitwise the reference."""
    stages = ["settings", "batchinv"]
    r, recs, logs = run_harness("vllm", version, 2, ",".join(stages), tmp_path, VLLM_BATCH_INVARIANT="1")
    check_common(r, recs, logs, 2, stages)
    for rec in recs:
        st = rec["stages"]["batchinv"]
        assert st["tpar"] == st["cases"] == 18 and st["fallback"] == 0, st
        assert st["served"] > st["tpar"], f"no call above max_size was split into chunks tpar reduced: {st}"


@pytest.mark.parametrize("version", engine_carry.versions("sglang"))
def test_sglang_real_modules(version, tmp_path):
    stages = ["settings", "eager", "compile", "thread", "kill"]
    r, recs, logs = run_harness("sglang", version, 2, ",".join(stages), tmp_path)
    check_common(r, recs, logs, 2, stages)
    eager = recs[0]["stages"]["eager"]
    assert eager["tpar"] == eager["served"] == eager["cases"] - 1, eager
    assert "skipped" in recs[0]["stages"]["compile"]  # SGLang's op is CUDA-only: said, not hidden
    assert recs[0]["stages"]["kill"]["raised"] == "PeerDiedError"


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("version", engine_carry.versions("sglang"))
def test_sglang_dp_attention_gathers_served_by_tpar(version, world, tmp_path):
    """SGLang's DP-attention gather and scatter (dp_gather_partial in MAX_LEN padding,
    dp_reduce_scatter_tensor), unmodified, reach tpar through the plug-in's wrap of
    GroupCoordinator._all_gather_into_tensor / _reduce_scatter_tensor: every call within
    max_size served by tpar (its counter), the all-gather bitwise every rank's rows in rank
    order, the reduce-scatter bitwise slice `rank` of the rank-order sum; an all-gather above
    max_size declined to SGLang's own path, bitwise all the same, and NCCL's in-place forms
    and a size off 16-byte parts left to SGLang's path (tpar's counter unmoved); the same inside
    torch.compile(fullgraph=True), where SGLang's functions put its opaque ops
    (sglang::reg_all_gather_into_tensor / reg_reduce_scatter_tensor) in the graph and their
    body reaches the wrapped methods when the graph runs (the harness registers that body for
    CPU tensors: SGLang registers it for CUDA only); and when a rank dies, the survivors'
    next SGLang gather raises tpar's error. Captured calls need CUDA: scripts/gpu-engines.sh
    runs them."""
    stages = ["dp", "dp_compile", "dp_graph", "kill"]
    r, recs, logs = run_harness("sglang", version, world, ",".join(stages), tmp_path)
    check_common(r, recs, logs, world, stages)
    for rec in recs[:-1]:  # the last rank dies in the kill stage
        dp = rec["stages"]["dp"]
        # 3 dtypes x 4 row counts x both collectives, and the all-gather above max_size
        assert dp["tpar"] == dp["served"] == 24 and dp["cases"] == 25 and dp["fallback"] == 1 and dp["wrong"] == 0, dp
        # NCCL's in-place forms and a size off 16-byte parts: SGLang's own path, tpar's counter unmoved
        assert len(dp["declined"]) == 3 and all(v == {"served": 0, "ok": True} for v in dp["declined"].values()), dp
        st = rec["stages"]["dp_compile"]
        # 3 dtypes x (1, 8 rows) x both collectives, each a compiled graph, each served by tpar
        assert "untraceable" not in st and st["tpar"] == st["served"] == st["cases"] == 12 and st["wrong"] == 0, st
        assert st["graphs"] == {"dp_gather_partial": 6, "dp_reduce_scatter_tensor": 6}, st
        # an all-gather tpar declines when the graph runs: SGLang's own path inside its op,
        # bitwise, tpar's counter unmoved, no second graph
        assert st["declined"] == {"served": 0, "ok": True}, st
        # SGLang's CPU engine calls the wrapped method in Python: Dynamo traces SGLang's own path
        assert st["cpu_engine"] == {"ok": True, "served": 0}, st
        assert "skipped" in rec["stages"]["dp_graph"], rec["stages"]["dp_graph"]  # said, not hidden
        kill = rec["stages"]["kill"]
        assert kill["cycled"][:2] == ["dp_gather_partial", "dp_reduce_scatter_tensor"], kill  # served by tpar before the death
        assert kill["raised"] in ("PeerDiedError", "AbortedError"), kill
