"""Inputs and references for testing all-reduces of torch tensors (tpar's own tests use it;
so can an engine's). Imports torch.

    xs = make_inputs(seed, world, n, torch.bfloat16)   # every rank's input; each rank can regenerate all
    y = comm.all_reduce(xs[rank].to(dev))
    assert bits(y.cpu()) == bits(reference(xs, torch.bfloat16))

    xs, res, w = make_fused_inputs(seed, world, rows, hidden, torch.bfloat16)
    out, res_out = comm.all_reduce_add_rmsnorm(xs[rank].to(dev), res.to(dev), w.to(dev), 1e-6)
    want_out, want_res = reference_add_rmsnorm(xs, res, w, 1e-6)   # bit for bit

    # the family: no residual, the Gemma offset, a static FP8 e4m3 output
    out, res_out = comm.all_reduce_rmsnorm(x, w, 1e-6, residual=res, gemma=True, fp8_scale=s)
    want_out, want_res = reference_rmsnorm(xs, w, 1e-6, residual=res, gemma=True, fp8_scale=s)

    # an NVFP4 output (vLLM's scaled_fp4_quant, swizzled block scales)
    q, sf, res_out = comm.all_reduce_rmsnorm(x, w, 1e-6, residual=res, nvfp4_scale=gs)
    (want_q, want_sf), want_res = reference_rmsnorm(xs, w, 1e-6, residual=res, nvfp4_scale=gs)
"""

from __future__ import annotations

import torch

__all__ = [
    "make_inputs",
    "reference",
    "bits",
    "INT_VIEW",
    "make_fused_inputs",
    "tree_sum",
    "add_rmsnorm",
    "reference_add_rmsnorm",
    "FP8_E4M3_MAX",
    "quant_fp8_static",
    "rmsnorm",
    "reference_rmsnorm",
    "E2M1_MAX",
    "NVFP4_BLOCK",
    "e2m1_codes",
    "nvfp4_scale_shape",
    "swizzle_nvfp4_scales",
    "quant_nvfp4",
]

#: The integer view of each dtype, for bitwise comparison.
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.uint8: torch.uint8, torch.int32: torch.int32}


def make_inputs(seed: int, world: int, n: int, dtype: torch.dtype):
    """Every rank's input (each rank regenerates all of them, on the CPU): fresh random values
    in +-[2^-6, 2^6), never zero, so that sums round and their order matters."""
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1_000_003 + r * 7919 + n)
        mag = torch.exp2(torch.randint(-6, 6, (n,), generator=g).to(torch.float64))
        x = (torch.rand(n, generator=g, dtype=torch.float64) + 0.5) * mag
        sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        xs.append((x * sign).to(dtype))
    return xs


def reference(xs, dtype: torch.dtype):
    """The rank-order float32 sum, rounded once to the dtype: what tpar promises bitwise."""
    acc = xs[0].to(torch.float32).clone()
    for x in xs[1:]:
        acc += x.to(torch.float32)
    return acc.to(dtype)


def bits(t: torch.Tensor) -> bytes:
    """The tensor's bytes (moved to the CPU), for bitwise comparison across ranks."""
    return t.detach().cpu().contiguous().view(INT_VIEW[t.dtype]).numpy().tobytes()


# ---------------------------------------------------------------------------------------
# The fused all-reduce + residual add + RMSNorm (docs/cuda.md "Fused all-reduce + residual
# add + RMSNorm"): the same arithmetic as tpar's kernels and its Rust reference
# (tpar::testing::expected_add_rmsnorm), bit for bit. Every float32 operation is done in
# float64 and rounded to float32 (``_rn``): for +, *, / and sqrt that is the correctly rounded
# float32 result (float64 has more than 2 x 24 + 2 bits), whatever torch's float32 kernels do
# (torch 2.11's CPU float32 sqrt is not correctly rounded: 1 ulp off on some inputs).


def _rn(t: torch.Tensor) -> torch.Tensor:
    """A float64 result rounded once to float32."""
    return t.to(torch.float32)


def make_fused_inputs(seed: int, world: int, rows: int, hidden: int, dtype: torch.dtype):
    """Every rank's x (``make_inputs``, rows x hidden), and the residual (values as x's) and
    the weight (in [0.5, 1.5), an RMSNorm weight near one), the same on every rank."""
    xs = [x.reshape(rows, hidden) for x in make_inputs(seed, world, rows * hidden, dtype)]
    residual = make_inputs(seed + 7_777_777, 1, rows * hidden, dtype)[0].reshape(rows, hidden)
    g = torch.Generator().manual_seed(seed * 31 + hidden)
    weight = (torch.rand(hidden, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    return xs, residual, weight


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """The fixed-order float32 sum over the last dimension: a perfect binary tree over the
    elements, padded with +0.0 to a power of two, every node the float32 sum (rounded once) of
    its left and right child (what the kernels compute in vectors, warps and tiles)."""
    t = t.to(torch.float32)
    n = t.shape[-1]
    p = 1 << max(0, (n - 1).bit_length())
    if p != n:
        t = torch.nn.functional.pad(t, (0, p - n))
    while t.shape[-1] > 1:
        t = _rn(t[..., 0::2].double() + t[..., 1::2].double())
    return t[..., 0]


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """tpar's add-RMSNorm, bit for bit, rows of ``weight.numel()``: ``residual_out =
    round(x + residual)`` (a float32 add, then one rounding to the dtype); per row ``inv = 1 /
    sqrt(tree_sum(r * r) / hidden + eps)``, each operation in float32; ``out = round((r * inv) *
    weight)``. Returns (out, residual_out), shaped as x. Works on any device."""
    dtype, hidden = x.dtype, weight.numel()
    r = _rn(x.double() + residual.double()).to(dtype)
    rd = r.double().reshape(-1, hidden)
    ss = tree_sum(_rn(rd * rd))
    eps32 = torch.tensor(eps, dtype=torch.float32, device=x.device).double()
    mean = _rn(ss.double() / hidden)
    root = _rn(torch.sqrt(_rn(mean.double() + eps32).double()))
    inv = _rn(1.0 / root.double())
    out = _rn(_rn(rd * inv.double()[:, None]).double() * weight.double()).to(dtype)
    return out.reshape(x.shape), r


def reference_add_rmsnorm(xs, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """What tpar's fused all-reduce + add-RMSNorm gives every rank, bit for bit:
    ``add_rmsnorm`` of the rank-order float32 sum rounded once (``reference``)."""
    s = reference([x.reshape(-1) for x in xs], xs[0].dtype).reshape(xs[0].shape)
    return add_rmsnorm(s, residual, weight, eps)


# ---------------------------------------------------------------------------------------
# The family (docs/cuda.md "Fused all-reduce + RMSNorm family"): without a residual, with
# the Gemma weight offset, with a static per-tensor FP8 e4m3 output. The same bits as the
# Rust reference (tpar::testing::rmsnorm_pattern).

#: The largest finite float8 e4m3fn value.
FP8_E4M3_MAX = 448.0


def quant_fp8_static(t: torch.Tensor, scale) -> torch.Tensor:
    """vLLM's ``static_scaled_fp8_quant`` of ``t`` with a per-tensor ``scale`` (a number or a
    1-element tensor), bit for bit as its CUDA kernel: ``inv = 1.0f / scale`` (float32),
    ``y = t * inv`` (float32), clamped with fminf / fmaxf to +-448 (fminf returns its other
    operand for NaN, so NaN becomes +448), rounded to nearest even into
    ``torch.float8_e4m3fn``. Returns the float8_e4m3fn tensor."""
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(()).to(t.device).double()
    inv = _rn(1.0 / s).double()
    y = _rn(t.double() * inv)
    y = torch.where(torch.isnan(y), torch.full_like(y, FP8_E4M3_MAX), y).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return y.to(torch.float8_e4m3fn)


#: The largest e2m1 magnitude, and the elements that share one NVFP4 block scale.
E2M1_MAX = 6.0
NVFP4_BLOCK = 16


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """The e2m1 codes (int64, sign 8, magnitude codes 0-7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6) of
    float32 ``y``: ``|y|`` clamped to 6 and rounded to the nearest grid value, ties to the even
    code (the count of rounding boundaries it passes); the sign kept; NaN passes none and gives
    0 whatever its sign bit. Bit for bit ``tpar::testing::e2m1_bits``."""
    m = y.abs()
    q = sum(c.to(torch.int64) for c in (m > 0.25, m >= 0.75, m > 1.25, m >= 1.75, m > 2.5, m >= 3.5, m > 5.0))
    return q | ((torch.signbit(y) & ~torch.isnan(y)).to(torch.int64) << 3)


def nvfp4_scale_shape(rows: int, hidden: int):
    """The int32 shape of vLLM's swizzled NVFP4 scale tensor: rows padded to 128, the row's
    ``hidden / 16`` e4m3 scales padded to a multiple of 4, four to an int32."""
    return (-(-rows // 128) * 128, -(-(hidden // NVFP4_BLOCK) // 4))


def swizzle_nvfp4_scales(linear: torch.Tensor) -> torch.Tensor:
    """Block scales (uint8, rows x hidden / 16) into vLLM's 128x4-swizzled layout, the padding
    0, viewed as its int32 tensor (``nvfp4_scale_shape``): byte ``(row / 128 * k_tiles + kb /
    4) * 512 + row % 32 * 16 + row / 32 % 4 * 4 + kb % 4`` holds the scale of block kb of row
    row (``tpar::testing::nvfp4_scale_offset``)."""
    rows, nb = linear.shape
    r128, k4 = nvfp4_scale_shape(rows, nb * NVFP4_BLOCK)
    padded = torch.zeros((r128, k4 * 4), dtype=torch.uint8, device=linear.device)
    padded[:rows, :nb] = linear
    t = padded.reshape(r128 // 128, 4, 32, k4, 4).permute(0, 3, 2, 1, 4).contiguous()
    return t.reshape(-1).view(torch.int32).reshape(r128, k4)


def quant_nvfp4(t: torch.Tensor, global_scale):
    """vLLM's ``scaled_fp4_quant(t, global_scale)`` with the swizzled scale layout, bit for bit
    as tpar's kernels and ``tpar::testing::quant_nvfp4``: per block of 16 elements of a row
    (the last dimension, a multiple of 16), ``amax = max |t|`` (NaN ignored, as fmaxf); ``sf = e4m3fn(gs * (amax *
    float32(1/6)))`` (``quant_fp8_static`` with scale 1: clamped to 448, nearest even);
    ``os = 1 / (float32(sf) * (1 / gs))`` with exact float32 reciprocals, 0 where a divisor is
    0 (vLLM's Python reference; its CUDA kernel's ``rcp.approx.ftz`` may differ in the last
    bit); the codes ``e2m1_codes(t * os)``, two a byte, the even element in the low nibble.
    Returns (codes uint8 ``[..., hidden / 2]``, scales int32 ``nvfp4_scale_shape``)."""
    hidden = t.shape[-1]
    if hidden % NVFP4_BLOCK != 0 or t.dim() == 0:
        raise ValueError(f"NVFP4 needs rows of a multiple of {NVFP4_BLOCK} elements, got shape {tuple(t.shape)}")
    x = t.double().reshape(-1, hidden // NVFP4_BLOCK, NVFP4_BLOCK)
    gs = torch.as_tensor(global_scale, dtype=torch.float32).reshape(()).to(t.device).double()
    r6 = float(torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32))
    a = x.abs()
    amax = torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(-1)  # NaN ignored, as CUDA's fmaxf
    sf = quant_fp8_static(_rn(gs * _rn(amax * r6).double()), torch.tensor(1.0))
    sfv = sf.to(torch.float32).double()
    rg = torch.where(gs == 0, torch.zeros_like(gs), _rn(1.0 / gs).double())
    d = _rn(sfv * rg).double()
    os = torch.where(d == 0, torch.zeros_like(d), _rn(1.0 / d).double())
    codes = e2m1_codes(_rn(x * os[..., None])).reshape(-1, hidden)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).reshape(*t.shape[:-1], hidden // 2)
    return packed, swizzle_nvfp4_scales(sf.view(torch.uint8).reshape(-1, hidden // NVFP4_BLOCK))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, residual=None, gemma: bool = False, fp8_scale=None, nvfp4_scale=None):
    """tpar's RMSNorm family on ``x`` (rows of ``weight.numel()``), bit for bit: with a
    residual, ``r = round(x + residual)`` (float32 add), else ``r = x``; per row ``inv = 1 /
    sqrt(tree_sum(r * r) / hidden + eps)``; ``out = round((r * inv) * g)`` with ``g = weight``
    or, Gemma, ``g = float32(weight) + 1.0`` (vLLM's and SGLang's GemmaRMSNorm); with
    ``fp8_scale``, ``out`` quantized by ``quant_fp8_static``; with ``nvfp4_scale`` (the global
    scale; never with ``fp8_scale``), ``out`` is ``quant_nvfp4``'s (codes, swizzled scales).
    Returns ``(out, residual_out)`` (``residual_out`` None without a residual). Works on any
    device."""
    if fp8_scale is not None and nvfp4_scale is not None:
        raise ValueError("fp8_scale and nvfp4_scale exclude each other")
    dtype, hidden = x.dtype, weight.numel()
    r = _rn(x.double() + residual.double()).to(dtype) if residual is not None else x
    rd = r.double().reshape(-1, hidden)
    ss = tree_sum(_rn(rd * rd))
    eps32 = float(torch.tensor(eps, dtype=torch.float32))  # a number: no host-to-device copy (capturable)
    mean = _rn(ss.double() / hidden)
    root = _rn(torch.sqrt(_rn(mean.double() + eps32).double()))
    inv = _rn(1.0 / root.double())
    g = _rn(weight.double() + 1.0).double() if gemma else weight.double()
    out = _rn(_rn(rd * inv.double()[:, None]).double() * g).to(dtype).reshape(x.shape)
    if fp8_scale is not None:
        out = quant_fp8_static(out, fp8_scale)
    if nvfp4_scale is not None:
        out = quant_nvfp4(out, nvfp4_scale)
    return out, (r if residual is not None else None)


def reference_rmsnorm(xs, weight: torch.Tensor, eps: float, *, residual=None, gemma: bool = False, fp8_scale=None, nvfp4_scale=None):
    """What tpar's fused all-reduce + RMSNorm family gives every rank, bit for bit:
    ``rmsnorm`` of the rank-order float32 sum rounded once (``reference``)."""
    s = reference([x.reshape(-1) for x in xs], xs[0].dtype).reshape(xs[0].shape)
    return rmsnorm(s, weight, eps, residual=residual, gemma=gemma, fp8_scale=fp8_scale, nvfp4_scale=nvfp4_scale)
