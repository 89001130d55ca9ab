"""The NVFP4 output of the fused all-reduce + RMSNorm family (docs/cuda.md "NVFP4 output"):
``tpar.testing.quant_nvfp4`` (vLLM's ``scaled_fp4_quant`` with the 128x4-swizzled scales)
bit for bit against the Rust reference (``tpar::testing::quant_nvfp4``, through the
extension) on random rows and on the edges (every e2m1 code and its rounding boundaries, a
zero block, amax at saturation, subnormal e4m3 scales, a zero global scale); its rounding
against a brute-force nearest grid value; its swizzle against vLLM's documented un-swizzle
(reshape + permute); dequantized values against the input; the family's NVFP4 patterns
against the Rust family; and ``Communicator.all_reduce_rmsnorm(..., nvfp4_scale=)`` on CPU
rank processes."""

import pytest
import torch

from tpar.testing import (
    E2M1_MAX,
    bits,
    e2m1_codes,
    make_fused_inputs,
    nvfp4_scale_shape,
    quant_nvfp4,
    reference,
    reference_rmsnorm,
    rmsnorm,
    swizzle_nvfp4_scales,
)

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rust_quant(t: torch.Tensor, gs: float):
    """The Rust reference's (codes, swizzled scales as int32) of ``t``."""
    from tpar import _tpar

    name = {v: k for k, v in DT.items()}[t.dtype]
    hidden = t.shape[-1]
    packed, scales = _tpar.reference_quant_nvfp4(name, hidden, t.contiguous().view(torch.uint8).numpy().tobytes(), gs)
    rows = t.numel() // hidden
    return (
        torch.frombuffer(bytearray(packed), dtype=torch.uint8).reshape(*t.shape[:-1], hidden // 2),
        torch.frombuffer(bytearray(scales), dtype=torch.uint8).view(torch.int32).reshape(nvfp4_scale_shape(rows, hidden)),
    )


def unswizzle(sf: torch.Tensor, rows: int, hidden: int) -> torch.Tensor:
    """vLLM's documented un-swizzle (tests/kernels/quantization/nvfp4_utils.py
    ``convert_swizzled_to_linear``, the facts: reshape (m_tiles, k_tiles, 32, 4, 4), permute
    (0, 3, 2, 1, 4)... written here for uint8 without a leading batch dimension)."""
    m_tiles, k_tiles = -(-rows // 128), -(-(hidden // 16) // 4)
    t = sf.view(torch.uint8).reshape(m_tiles, k_tiles, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(m_tiles * 128, k_tiles * 4)[:rows, : hidden // 16]


def test_e2m1_codes_are_the_nearest_grid_value_ties_to_even():
    g = torch.Generator().manual_seed(5)
    y = (torch.rand(50000, generator=g, dtype=torch.float64) * 16 - 8).to(torch.float32)
    mids = (GRID[:-1] + GRID[1:]) / 2
    edge = torch.cat([GRID, mids, torch.nextafter(mids, torch.tensor(0.0, dtype=torch.float64)), torch.nextafter(mids, torch.tensor(9.0, dtype=torch.float64))]).float()
    y = torch.cat([y, edge, -edge, torch.tensor([7.0, 1e30, float("inf"), -0.0, 0.0])])
    c = e2m1_codes(y)
    a = y.double().abs().clamp(max=E2M1_MAX)
    d = (a[:, None] - GRID[None, :]).abs()
    best = d.min(dim=1).values
    assert torch.equal(d.gather(1, (c & 7)[:, None])[:, 0], best), "a code that is not the nearest"
    tie = (d == best[:, None]).sum(dim=1) > 1
    assert tie.sum() >= 14 and bool(((c[tie] & 7) % 2 == 0).all()), "ties to the even code"
    assert torch.equal((c >> 3).bool(), torch.signbit(y))
    nan = torch.tensor([float("nan"), -float("nan")])
    assert e2m1_codes(nan).tolist() == [0, 0], "NaN gives 0 whatever its sign bit"


def test_swizzle_is_vllms_layout():
    for rows, hidden in [(1, 1024), (3, 7168), (130, 80), (33, 16)]:
        lin = torch.randint(0, 256, (rows, hidden // 16), dtype=torch.uint8)
        sw = swizzle_nvfp4_scales(lin)
        assert tuple(sw.shape) == nvfp4_scale_shape(rows, hidden) and sw.dtype == torch.int32
        assert torch.equal(unswizzle(sw, rows, hidden), lin)
        # Every byte outside the rows' own scales is 0.
        assert int(sw.view(torch.uint8).ne(0).sum()) == int(lin.ne(0).sum())


def edge_rows(dt):
    """Rows of 16-element blocks that hit the edges: a zero block, amax at saturation, tiny
    blocks (subnormal e4m3 scales), every e2m1 code and its rounding boundaries at a block
    scale of 1, negative zeros."""
    blocks = [torch.zeros(16), torch.full((16,), 1e4), torch.full((16,), -3e4), torch.full((16,), 6.0 * 2.0**-7), torch.full((16,), 1e-6)]
    grid = torch.cat([GRID.float(), -GRID.float()])
    grid[8] = -0.0
    blocks.append(grid)
    mids = torch.cat([((GRID[:-1] + GRID[1:]) / 2).float(), torch.tensor([6.0]), -((GRID[:-1] + GRID[1:]) / 2).float(), torch.tensor([-6.0])])
    blocks.append(mids)
    for k in range(1, 12):
        blocks.append(torch.linspace(-1, 1, 16) * 2.0 ** (-k))
    nan = torch.linspace(-2, 2, 16)
    nan[[3, 9]] = torch.tensor([float("nan"), -float("nan")])
    inf = torch.linspace(-2, 2, 16)
    inf[5] = float("inf")
    blocks += [nan, inf]  # 20 blocks: 5 rows of 64
    return torch.cat(blocks).reshape(-1, 64).to(dt)


@pytest.mark.parametrize("dname", ["bfloat16", "float16", "float32"])
def test_torch_reference_is_the_rust_reference_bit_for_bit(dname):
    dt = DT[dname]
    g = torch.Generator().manual_seed(11)
    cases = []
    for rows, hidden in [(1, 1024), (3, 7168), (9, 2880), (130, 80)]:
        mag = torch.exp2(torch.randint(-12, 6, (rows, hidden // 16, 1), generator=g).double())
        cases.append(((torch.rand(rows, hidden // 16, 16, generator=g, dtype=torch.float64) * 2 - 1) * mag).reshape(rows, hidden).to(dt))
    cases.append(edge_rows(dt))
    for t in cases:
        for gs in (1.0, 448.0 * 6.0 / 4.5, 3.0e-3, 0.0, 1e30):
            pq, ps = quant_nvfp4(t, torch.tensor([gs], dtype=torch.float32))
            rq, rs = rust_quant(t, gs)
            what = f"{dname} {tuple(t.shape)} gs {gs}"
            assert torch.equal(pq, rq), what
            assert torch.equal(ps, rs), what
    # The edges did reach them: a zero scale, a saturated scale, subnormal scales, every code.
    q, s = quant_nvfp4(edge_rows(dt), torch.tensor([1.0]))
    sb = unswizzle(s, q.shape[0], 64).reshape(-1)
    assert (sb == 0).any() and (sb == 0x7E).any() and ((sb > 0) & (sb < 8)).any(), sb
    codes = torch.stack([q & 15, q >> 4], dim=-1).reshape(-1)
    assert set(codes.tolist()) == set(range(16)), sorted(set(codes.tolist()))
    with pytest.raises(Exception, match="multiple of 16"):
        rust_quant(torch.zeros(2, 24, dtype=dt), 1.0)


def test_dequantized_values_are_near_the_input():
    g = torch.Generator().manual_seed(3)
    rows, hidden = 5, 256
    x = ((torch.rand(rows, hidden, generator=g, dtype=torch.float64) * 2 - 1) * torch.exp2(torch.randint(-4, 4, (rows, hidden // 16, 1), generator=g).double()).repeat_interleave(16, 1).reshape(rows, hidden)).to(torch.bfloat16)
    gs = 448.0 * 6.0 / float(x.abs().max())
    q, s = quant_nvfp4(x, torch.tensor([gs]))
    codes = torch.stack([q & 15, q >> 4], dim=-1).reshape(rows, hidden).long()
    vals = GRID[codes & 7] * torch.where((codes >> 3) == 1, -1.0, 1.0)
    sf = unswizzle(s, rows, hidden).view(torch.float8_e4m3fn).double() / gs
    deq = (vals.reshape(rows, hidden // 16, 16) * sf[..., None]).reshape(rows, hidden)
    xd = x.double()
    r = (xd.reshape(rows, hidden // 16, 16) / sf[..., None]).abs().reshape(rows, hidden)
    step = torch.where(r < 2, 0.5, torch.where(r < 4, 1.0, 2.0)) * sf.repeat_interleave(16, 1)
    assert bool(((deq - xd).abs() <= step / 2 * 1.0001 + xd.abs() / 16).all())


def rust_family_nvfp4(xs, res, w, eps, dname, gemma, gs):
    """The Rust family's normalised output (tpar::testing::expected_rmsnorm), then the Rust
    NVFP4 quantization of it."""
    from tpar import _tpar

    raw = lambda t: t.contiguous().view(torch.uint8).numpy().tobytes()  # noqa: E731
    o, _, r = _tpar.reference_rmsnorm(dname, w.numel(), eps, [raw(x) for x in xs], raw(res) if res is not None else None, raw(w), gemma, None)
    dt = DT[dname]
    out = torch.frombuffer(bytearray(o), dtype=dt).reshape(xs[0].shape)
    q, s = rust_quant(out, gs)
    return q, s, (torch.frombuffer(bytearray(r), dtype=dt).reshape(xs[0].shape) if r is not None else None)


@pytest.mark.parametrize("dname", ["bfloat16", "float16"])
def test_the_family_nvfp4_patterns_match_the_rust_family(dname):
    dt = DT[dname]
    for i, (rows, hidden) in enumerate([(1, 4096), (3, 7168), (5, 2880)]):
        xs, res, w = make_fused_inputs(500 + i, 4, rows, hidden, dt)
        for residual in (True, False):
            for gemma in (False, True):
                r = res if residual else None
                gs = 448.0 * 6.0 / 4.5
                (pq, ps), pr = reference_rmsnorm(xs, w, 1e-6, residual=r, gemma=gemma, nvfp4_scale=torch.tensor([gs]))
                rq, rs, rr = rust_family_nvfp4(xs, r, w, 1e-6, dname, gemma, gs)
                what = f"{dname} {rows} x {hidden} residual {residual} gemma {gemma}"
                assert torch.equal(pq, rq) and torch.equal(ps, rs), what
                assert (pr is None) == (rr is None) and (pr is None or bits(pr) == bits(rr)), what
    s = reference([x.reshape(-1) for x in xs], dt).reshape(xs[0].shape)
    with pytest.raises(ValueError):
        rmsnorm(s, w, 1e-6, fp8_scale=torch.tensor([1.0]), nvfp4_scale=torch.tensor([1.0]))


def test_nvfp4_on_cpu_ranks_bit_for_bit():
    from ranks import run_ranks

    recs = run_ranks(2, "fused_nvfp4_cpu", shapes=[[3, 1024], [2, 2880]])
    for r in recs:
        assert not r.get("hung"), r["output"]
        assert r.get("ok"), f"rank {r['rank']}: {r.get('error_type')}: {r.get('message')}\n{r['output']}"
    res = [r["result"] for r in recs]
    for r in res:
        assert r["cases"] == 2 * 4 and r["wrong"] == 0, res
        assert r["bad_args_raise"] is True, res
        assert r["padding_zeroed"] is True, res
    assert res[0]["digest"] == res[1]["digest"], "ranks differ"
