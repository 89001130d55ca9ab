"""The fused all-reduce + residual add + RMSNorm's references (docs/cuda.md "Fused
all-reduce + residual add + RMSNorm"): tpar.testing's torch one against the Rust one
(tpar::testing::expected_add_rmsnorm, through the extension), bit for bit, on fresh random
inputs of every dtype and of shapes the kernels take and the unfused path takes; both
against float64 within the rounding bound; and the Python API on CPU rank processes."""

import math

import pytest
import torch

from tpar import _tpar
from tpar.testing import add_rmsnorm, bits, make_fused_inputs, reference, reference_add_rmsnorm, tree_sum

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SHAPES = [(1, 1024), (3, 7168), (8, 7168), (5, 4096), (2, 8192), (1, 16384), (2, 2880), (7, 256), (64, 1024)]


def rust(xs, res, w, eps, dname):
    raw = lambda t: t.contiguous().view(torch.uint8).numpy().tobytes()  # noqa: E731
    n, r = _tpar.reference_add_rmsnorm(dname, w.numel(), eps, [raw(x) for x in xs], raw(res), raw(w))
    dt = DTYPES[dname]
    back = lambda b: torch.frombuffer(bytearray(b), dtype=dt).reshape(res.shape)  # noqa: E731
    return back(n), back(r)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_torch_reference_is_the_rust_reference_bit_for_bit(dname):
    dt = DTYPES[dname]
    for i, (rows, hidden) in enumerate(SHAPES):
        for world in (2, 8):
            xs, res, w = make_fused_inputs(1000 + i * 10 + world, world, rows, hidden, dt)
            for eps in (1e-6, 1e-5):
                po, pr = reference_add_rmsnorm(xs, res, w, eps)
                ro, rr = rust(xs, res, w, eps, dname)
                assert bits(pr) == bits(rr), f"{dname} {rows} x {hidden} world {world}: residual_out differs"
                assert bits(po) == bits(ro), f"{dname} {rows} x {hidden} world {world}: norm out differs"


def test_the_reference_is_within_the_f64_bound_and_the_order_is_fixed():
    # Against float64 (as tpar::testing::count_wrong_add_rmsnorm): residual_out within the
    # all-reduce's rounding plus one, out within (u + 24 * 2^-24) relative of the float64 norm
    # of the residual_out it was given.
    for dt, u in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11), (torch.float32, 2.0**-24)):
        for rows, hidden in ((3, 7168), (2, 2880)):
            world = 4
            xs, res, w = make_fused_inputs(7, world, rows, hidden, dt)
            o, r = reference_add_rmsnorm(xs, res, w, 1e-6)
            s64 = sum(x.double() for x in xs)
            mag = sum(x.double().abs() for x in xs)
            h = s64 + res.double()
            tol_r = u * (s64.abs() + h.abs()) * 1.001 + world * 2.0**-23 * mag + 2.0**-149
            assert bool(((r.double() - h).abs() <= tol_r).all()), dt
            r64 = r.double()
            want = r64 / torch.sqrt((r64 * r64).mean(-1, keepdim=True) + 1e-6) * w.double()
            assert bool(((o.double() - want).abs() <= (u + 24 * 2.0**-24) * want.abs() + 2.0**-24).all()), dt
    # The tree: pairs first, padding with +0.0, not the sequential order.
    t = torch.tensor([1.0, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24], dtype=torch.float32)
    assert tree_sum(t).item() == ((1.0 + 2.0**-24) + (2.0**-24 + 2.0**-24)) + 2.0**-24
    seq = torch.tensor(0.0)
    for v in t:
        seq = seq + v
    assert tree_sum(t).item() != seq.item(), "the example must tell the two orders apart"
    # The all-reduce part is tpar's plain reference.
    xs, res, w = make_fused_inputs(3, 3, 2, 1024, torch.bfloat16)
    o, r = add_rmsnorm(reference([x.reshape(-1) for x in xs], torch.bfloat16).reshape(2, 1024), res, w, 1e-6)
    o2, r2 = reference_add_rmsnorm(xs, res, w, 1e-6)
    assert bits(o) == bits(o2) and bits(r) == bits(r2)
    assert not math.isnan(o.float().sum().item())


def test_fused_on_cpu_ranks_every_form_bit_for_bit():
    from ranks import run_ranks

    shapes = [[1, 1024], [3, 7168], [2, 2880], [5, 256]]
    recs = run_ranks(3, "fused_cpu", shapes=shapes, dtypes=list(DTYPES))
    for r in recs:
        assert not r.get("hung"), r["output"]
        assert r.get("ok"), f"rank {r['rank']}: {r.get('error_type')}: {r.get('message')}\n{r['output']}"
    res = [r["result"] for r in recs]
    for r in res:
        assert r["cases"] == len(shapes) * 3
        assert r["wrong"] == 0, res
        assert r["compiled"] is True
    assert len({r["digest"] for r in res}) == 1, "ranks' outputs differ"
