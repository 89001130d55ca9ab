"""tpar's all-reduce + RMSNorm fusion pass inside vLLM's real compile stack, on CPU rank
processes (scripts/engine_harness.py's ``fusion`` stage, scripts/engine_fusion.py).

vLLM 0.33.0's own pass needs FlashInfer and has size rows for sm_90/100/103/107 only; tpar's
plug-in adds a pass of its own (python/tpar/engines/vllm_pass.py, docs/engines.md "Fused
all-reduce + RMSNorm"). Here the pinned vLLM's ``PostGradPassManager`` is configured by
vLLM's own ``configure`` (which the plug-in wraps) with the device capability faked to 12.0
(sm_120, where vLLM's pass never runs) and 9.0 (Hopper), and Inductor compiles a layer
(linear -> vLLM's all-reduce -> vLLM's RMSNorm IR op, with and without the residual add,
plain and Gemma, with and without vLLM's static FP8 quant layer or its NVFP4 quant,
``scaled_fp4_quant``) in two rank processes.

A test fails if any form is not replaced by tpar's op (the all-reduce still in the graph), if
a compile range beyond tpar's plan is replaced, if a call tpar's kernels served is not bitwise
tpar's reference (``tpar.testing``), or if a handed-back call is beyond the rounding of the
engine's unfused ops. Without tpar's registration (``vllm_pass.install``) the stage fails:
the pass is not in vLLM's list. vLLM's compiled ``_C`` ops that the pass modules name are
stubbed (scripts/engine_carry.py ``C_OP_STUBS``: the matched quants with their torch
references; ``scaled_fp4_quant`` is defined there, so tpar's pass registers its NVFP4 forms).
"""

import pytest

from test_engine_real import engine_carry, run_harness

FORMS = ("residual", "norm", "gemma_residual", "gemma_norm", "fp8_residual", "fp8_norm", "nvfp4_residual", "nvfp4_norm")


@pytest.mark.parametrize("capability", [120, 90])
@pytest.mark.parametrize("version", engine_carry.versions("vllm"))
def test_vllm_fusion_pass_replaces_every_form(version, capability, tmp_path):
    r, recs, logs = run_harness("vllm", version, 2, "fusion", tmp_path, args=("--capability", str(capability)))
    assert len(recs) == 2, logs
    for rec in recs:
        assert rec.get("ca_is_tpar"), f"rank {rec['rank']}: {rec.get('error')}\n{logs}"
        st = rec["stages"]["fusion"]
        assert "error" not in st, f"rank {rec['rank']}: {st['error']}\n{logs}"
        assert st["capability"] == capability
        i = st["passes"].index("TparAllReduceFusionPass")
        assert "NoOpEliminationPass" in st["passes"][:i], st["passes"]
        for form in FORMS:
            f = st["forms"][form]
            assert f["tpar_ops"] == 1 and f["all_reduces"] == 0, f"rank {rec['rank']} {form}: not replaced by tpar's op: {f}"
            if form.startswith("nvfp4"):
                assert f["nvfp4_ops"] == 1 and f["fp4_quants"] == 0, f"rank {rec['rank']} {form}: the NVFP4 quant not fused into tpar's op: {f}"
            assert f["ok"], f"rank {rec['rank']} {form}: {f}"
        # the plain forms run tpar's fused kernel (all_reduce_add_rmsnorm), bitwise its reference
        for form in ("residual", "norm"):
            assert st["forms"][form]["fused_calls"] == 1 and st["forms"][form]["served"] >= 1, st["forms"][form]
        beyond = st["forms"]["beyond_plan"]
        assert beyond["tpar_ops"] == 0 and beyond["all_reduces"] >= 1 and beyond["fused_calls"] == 0, f"a range beyond tpar's plan was fused: {beyond}"
        assert st["fusion_routed"] >= 2 and st["wrong"] == 0, st
    assert r.returncode == 0, r.stdout + r.stderr + logs
