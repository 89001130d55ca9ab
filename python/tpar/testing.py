"""Inputs and references for testing all-reduces of torch tensors (tpar's own tests use it;
so can an engine's). Imports torch.

    xs = make_inputs(seed, world, n, torch.bfloat16)   # every rank's input; each rank can regenerate all
    y = comm.all_reduce(xs[rank].to(dev))
    assert bits(y.cpu()) == bits(reference(xs, torch.bfloat16))
"""

from __future__ import annotations

import torch

__all__ = ["make_inputs", "reference", "bits", "INT_VIEW"]

#: The integer view of each dtype, for bitwise comparison.
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


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
