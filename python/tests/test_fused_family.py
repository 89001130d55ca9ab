"""The fused all-reduce + RMSNorm family's torch reference (docs/cuda.md "Fused all-reduce +
RMSNorm family"): the FP8 e4m3 rounding against torch's float8_e4m3fn conversion and a
brute-force nearest code, vLLM's static quantization's edges (saturation, NaN, the rounded
reciprocal), every pattern against an independent float64 computation (eps deciding too),
the torch reference against the Rust one (through the extension) bit for bit, and the Python
API on CPU rank processes, bit for bit and ranks identical."""

import pytest
import torch

from tpar.testing import FP8_E4M3_MAX, bits, make_fused_inputs, quant_fp8_static, reference, reference_add_rmsnorm, reference_rmsnorm, rmsnorm

PATTERNS = [dict(residual=r, gemma=g, fp8=f) for f in (False, True) for g in (False, True) for r in (True, False)]
CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)


def nearest_code(x: torch.Tensor) -> torch.Tensor:
    """The e4m3fn bits nearest to each float32 of x (|x| <= 448), ties to the even code: by
    brute force over every finite code, independent of any conversion."""
    finite = ~torch.isnan(CODES)
    d = (x.double()[:, None] - CODES[None, :]).abs()
    d[:, ~finite] = float("inf")
    # -0.0 and +0.0: the code with x's sign.
    neg = torch.signbit(x)
    d[:, 0x80] = torch.where(neg, d[:, 0], torch.full_like(d[:, 0], float("inf")))
    d[:, 0x00] = torch.where(neg, torch.full_like(d[:, 0], float("inf")), d[:, 0])
    best = d.min(dim=1, keepdim=True).values
    ties = d == best
    even = ties & (torch.arange(256) % 2 == 0)[None, :]
    pick = torch.where(even.any(dim=1), even.int().argmax(dim=1), ties.int().argmax(dim=1))
    return pick.to(torch.uint8)


def test_torch_fp8_conversion_is_nearest_ties_to_even():
    g = torch.Generator().manual_seed(5)
    xs = (torch.rand(20000, generator=g, dtype=torch.float64) * 2 - 1) * torch.exp2(torch.randint(-12, 10, (20000,), generator=g).double())
    codes = CODES[:0x7F]
    mids = (codes[:-1] + codes[1:]) / 2  # exact halfway points: ties to even
    xs = torch.cat([xs.clamp(-448, 448), codes, mids, torch.tensor([448.0, 463.9, 2.0**-10, 1e-30, 0.0])]).float()
    xs = torch.cat([xs, -xs, torch.nextafter(mids.float(), torch.tensor(1e9)), torch.nextafter(mids.float(), torch.tensor(-1e9))])
    xs = xs[xs.abs() < 464]
    got = xs.to(torch.float8_e4m3fn).view(torch.uint8)
    want = nearest_code(xs)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(float(xs[i]), int(got[i]), int(want[i])) for i in bad[:5]]


def test_static_fp8_quant_edges():
    q = lambda x, s: quant_fp8_static(torch.tensor(x, dtype=torch.float32), torch.tensor([s], dtype=torch.float32)).view(torch.uint8).tolist()  # noqa: E731
    assert q([1000.0, -1e30, float("inf"), float("-inf")], 1.0) == [0x7E, 0xFE, 0x7E, 0xFE], "saturates to +-448"
    assert q([float("nan")], 1.0) == [0x7E], "fminf turns NaN into +448"
    assert q([3.0, -3.0], 2.0) == [int(torch.tensor(1.5).to(torch.float8_e4m3fn).view(torch.uint8)), int(torch.tensor(-1.5).to(torch.float8_e4m3fn).view(torch.uint8))]
    # The product with the float32 reciprocal (vLLM's kernel), not the quotient: inputs whose
    # quotient is a halfway point between two codes, where the two round apart.
    g = torch.Generator().manual_seed(8)
    mids = ((CODES[:0x7D] + CODES[1:0x7E]) / 2).float()
    differ = 0
    for _ in range(64):
        s = float(torch.rand((), generator=g) + 0.5) * 0.02
        st = torch.tensor([s], dtype=torch.float32)
        x = mids * st
        x = torch.cat([x, torch.nextafter(x, torch.tensor(1e9)), torch.nextafter(x, torch.tensor(-1e9))])
        prod = (x * (1.0 / st)).to(torch.float8_e4m3fn).view(torch.uint8)
        quot = (x / st).to(torch.float8_e4m3fn).view(torch.uint8)
        got = quant_fp8_static(x, st).view(torch.uint8)
        assert torch.equal(got, prod)
        differ += int((prod != quot).sum())
    assert differ > 0, "no input where product and quotient round apart: the test proves nothing"
    assert FP8_E4M3_MAX == float(torch.finfo(torch.float8_e4m3fn).max)


def f64_judge(out, r, weight, eps, gemma, scale):
    """Elements of ``out`` outside the rounding bound of an independent float64 RMSNorm of the
    ``r`` it was given (the all-reduce's output, or the updated residual)."""
    x = r
    r = r.double()
    hidden = weight.numel()
    rd = r.reshape(-1, hidden)
    inv = 1.0 / torch.sqrt((rd * rd).sum(dim=1, keepdim=True) / hidden + eps)
    want = rd * inv * (weight.double() + (1.0 if gemma else 0.0))
    u = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[x.dtype]
    if scale is None:
        tol = (u + 40 * 2.0**-24) * want.abs() + 2.0**-24
        return int(((out.double().reshape(-1, hidden) - want).abs() > tol).sum())
    # FP8: within half a code step of the clamped quotient, plus the norm's own rounding.
    y = (want / scale).clamp(-448, 448)
    step = torch.where(y.abs() < 2.0**-6, torch.full_like(y, 2.0**-9), torch.exp2(torch.floor(torch.log2(y.abs().clamp(min=2.0**-6))) - 3))
    tol = step / 2 + (u + 40 * 2.0**-24) * y.abs() + 2.0**-9
    return int(((out.to(torch.float64).reshape(-1, hidden) - y).abs() > tol).sum())


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shift", [0, -14])
def test_every_pattern_matches_float64(dt, shift):
    world, rows, hidden, eps = 4, 3, 1024, 1e-6
    xs, res, w = make_fused_inputs(17, world, rows, hidden, dt)
    xs = [x * 2.0**shift for x in xs]  # exact: powers of two
    res = res * 2.0**shift
    s = reference([x.reshape(-1) for x in xs], dt).reshape(rows, hidden)
    if shift:
        ms = float((s.double() + res.double()).pow(2).mean())
        assert eps / 8 < ms < 8 * eps, f"mean square {ms:e} must be near eps"
    for p in PATTERNS:
        scale = torch.tensor([0.004], dtype=torch.float32) if p["fp8"] else None
        r = res if p["residual"] else None
        out, ro = reference_rmsnorm(xs, w, eps, residual=r, gemma=p["gemma"], fp8_scale=scale)
        assert (ro is not None) == p["residual"]
        assert out.dtype == (torch.float8_e4m3fn if p["fp8"] else dt)
        if ro is not None:  # the updated residual: one rounding of the float64 add
            h = s.double() + res.double()
            u = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dt]
            assert bool(((ro.double() - h).abs() <= u * h.abs() + 2.0**-24).all()), p
        base = ro if ro is not None else s
        sc = 0.004 if p["fp8"] else None
        assert f64_judge(out, base, w, eps, p["gemma"], sc) == 0, p
        # The judge catches a flipped Gemma offset, and (eps deciding) a dropped eps.
        flip, _ = rmsnorm(s, w, eps, residual=r, gemma=not p["gemma"], fp8_scale=scale)
        assert f64_judge(flip, base, w, eps, p["gemma"], sc) > out.numel() // 4, p
        if shift:
            noeps, _ = rmsnorm(s, w, 0.0, residual=r, gemma=p["gemma"], fp8_scale=scale)
            assert f64_judge(noeps, base, w, eps, p["gemma"], sc) > out.numel() // 4, p
        if p["fp8"]:
            plain, _ = rmsnorm(s, w, eps, residual=r, gemma=p["gemma"])
            assert bits(out) == bits(quant_fp8_static(plain, scale)), "fp8 is the quantized dtype output"
            assert (out.view(torch.uint8) & 0x7F == 0x7E).any(), "no saturated output: the scale tests no clamp"
        if p["residual"] and not p["gemma"] and not p["fp8"]:
            o2, r2 = reference_add_rmsnorm(xs, res, w, eps)
            assert bits(out) == bits(o2) and bits(ro) == bits(r2), "the plain pattern is add_rmsnorm"


def rust_family(xs, res, w, eps, dname, gemma, scale):
    from tpar import _tpar

    raw = lambda t: t.contiguous().view(torch.uint8).numpy().tobytes()  # noqa: E731
    o, q, r = _tpar.reference_rmsnorm(dname, w.numel(), eps, [raw(x) for x in xs], raw(res) if res is not None else None, raw(w), gemma, scale)
    dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dname]
    back = lambda b, d: torch.frombuffer(bytearray(b), dtype=d).reshape(xs[0].shape)  # noqa: E731
    return back(o, dt), (back(q, torch.uint8).view(torch.float8_e4m3fn) if q is not None else None), (back(r, dt) if r is not None else None)


@pytest.mark.parametrize("dname", ["bfloat16", "float16", "float32"])
def test_torch_reference_is_the_rust_reference_bit_for_bit(dname):
    dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dname]
    for i, (rows, hidden) in enumerate([(1, 4096), (3, 5120), (8, 7168), (2, 8192), (5, 2880)]):
        for world in (2, 8):
            xs, res, w = make_fused_inputs(300 + i * 10 + world, world, rows, hidden, dt)
            for p in PATTERNS:
                for scale in ([0.004, 0.3] if p["fp8"] else [None]):
                    r = res if p["residual"] else None
                    st = torch.tensor([scale], dtype=torch.float32) if scale is not None else None
                    po, pr = reference_rmsnorm(xs, w, 1e-6, residual=r, gemma=p["gemma"], fp8_scale=st)
                    ro, rq, rr = rust_family(xs, r, w, 1e-6, dname, p["gemma"], scale)
                    what = f"{dname} {rows} x {hidden} world {world} {p} scale {scale}"
                    assert bits(po) == bits(rq if p["fp8"] else ro), what
                    assert (pr is None) == (rr is None) and (pr is None or bits(pr) == bits(rr)), what
    with pytest.raises(Exception, match="residual"):
        from tpar import _tpar

        _tpar.reference_rmsnorm(dname, 64, 1e-6, [b"\0" * 256], b"\0" * 64, b"\0" * 256, False, None)


def test_family_on_cpu_ranks_bit_for_bit():
    from ranks import run_ranks

    shapes = [[1, 1024], [3, 7168], [2, 2880]]
    recs = run_ranks(3, "fused_family_cpu", shapes=shapes, dtypes=["bfloat16", "float16", "float32"])
    for r in recs:
        assert not r.get("hung"), r["output"]
        assert r.get("ok"), f"rank {r['rank']}: {r.get('error_type')}: {r.get('message')}\n{r['output']}"
    res = [r["result"] for r in recs]
    for r in res:
        assert r["cases"] == len(shapes) * 3 * len(PATTERNS)
        assert r["wrong"] == 0, res
        assert r["compiled"] is True
        assert r["bad_args_raise"] is True
    assert len({r["digest"] for r in res}) == 1, "ranks' outputs differ"
