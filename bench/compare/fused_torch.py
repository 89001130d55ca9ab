#!/usr/bin/env python3
"""Torch's unfused ops after an all-reduce, for reference beside `tpar bench --fused`:
per call, in CUDA graphs of 20 calls, on one GPU, for [rows, hidden] tensors:

  add        x + res                                   (the residual add alone)
  add+norm   F.rms_norm(x + res, (hidden,), w, eps)    (what an engine without a fused kernel runs)

No all-reduce is timed here: these are what each all-reduce is followed by (issue 24's
figures: 7.4-8.6 us per call for F.rms_norm(x + res) and about 1.2 us for the add on one
H200, [1-32, 7168] bf16, graphs). Median over iterations, p10/p90 beside it.

    python3 bench/compare/fused_torch.py [--hidden 7168] [--rows 1,3,8] [--dtype bfloat16] [--json out.json]
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def timed(fn, inner=20, warmup=10, iters=50):
    """Per-call microseconds of `fn` captured `inner` times in one graph, per replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for k in range(warmup + iters):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        if k >= warmup:
            samples.append(start.elapsed_time(end) * 1e3 / inner)
    samples.sort()
    q = lambda p: samples[min(len(samples) - 1, int(p * len(samples)))]  # noqa: E731
    return statistics.median(samples), q(0.1), q(0.9)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default="7168")
    ap.add_argument("--rows", default="1,3,8")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--json")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    dev = torch.device("cuda", 0)
    recs = []
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(dev)}: us per call, CUDA graphs of 20 calls, median [p10-p90]")
    print(f"# {'hidden':>6} {'rows':>5} {'add':>22} {'add+rms_norm':>22}")
    for h in (int(v) for v in a.hidden.split(",")):
        for r in (int(v) for v in a.rows.split(",")):
            x = torch.randn(r, h, device=dev).to(dt)
            res = torch.randn(r, h, device=dev).to(dt)
            w = torch.rand(h, device=dev).to(dt) + 0.5
            out = {}
            out["add"] = timed(lambda: x + res)
            out["add+norm"] = timed(lambda: F.rms_norm(x + res, (h,), w, a.eps))
            cell = lambda t: f"{t[0]:.2f} [{t[1]:.2f}-{t[2]:.2f}]"  # noqa: E731
            print(f"  {h:>6} {r:>5} {cell(out['add']):>22} {cell(out['add+norm']):>22}")
            for op, (m, p10, p90) in out.items():
                recs.append({"hidden": h, "rows": r, "dtype": a.dtype, "op": op, "median_us": m, "p10_us": p10, "p90_us": p90})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
