#!/usr/bin/env python3
"""A tensor-parallel decoder step with random weights, to compare all-reduces end to end.

    torchrun --nproc-per-node 8 examples/tp_decode.py --allreduce nccl --save nccl.pt
    torchrun --nproc-per-node 8 examples/tp_decode.py --allreduce tpar --compare nccl.pt
    torchrun --nproc-per-node 8 examples/tp_decode.py --allreduce torch-symm --compare nccl.pt
    torchrun --nproc-per-node 2 examples/tp_decode.py --device cpu --preset tiny   # CPU ranks, gloo + tpar's CPU backend

Shapes follow the engines' sharding of a dense transformer layer: attention as a
column-parallel QKV projection and a row-parallel output projection, the MLP as a
column-parallel gate/up projection and a row-parallel down projection, so two all-reduces per
layer (the attention core is a stand-in: a per-head mix of q, k and v; the all-reduces, the
matmul shapes and the sharding are what matter here). The default preset has Kimi-K2 /
DeepSeek-V3's hidden size and depth (7168, 61 layers; dense MLP of 18432 in place of MoE):
122 all-reduces of tokens x 7168 x 2 bytes per step, 14 KiB per token. Weights are seeded random
(no checkpoint needed: the all-reduces are the same as a real model's).

One decode or speculative-verify step of `--tokens` (1-8) is captured in a CUDA graph (GPU) and
replayed; the script prints the step time, the share of it spent in all-reduce (the same graph
with the all-reduces removed, timed the same way), and how the output compares with a saved run
(`--compare`: within bf16 tolerance; tpar's own runs are bitwise reproducible, which it checks by
replaying twice). `--allreduce` picks: `nccl` (torch.distributed), `tpar` (tpar.torch), `torch-symm`
(PyTorch's symmetric-memory one-shot all-reduce, torch >= 2.5), `gloo` (CPU).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

PRESETS = {
    # name: (layers, hidden, intermediate, heads)
    "kimi-k2": (61, 7168, 18432, 64),
    "small": (16, 4096, 11008, 32),
    "tiny": (4, 1024, 2816, 16),
}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="kimi-k2", choices=sorted(PRESETS))
    p.add_argument("--layers", type=int, help="override the preset's layer count")
    p.add_argument("--tokens", type=int, default=4, help="tokens per step (1 = decode, 2-8 = speculative verify)")
    p.add_argument("--allreduce", default="tpar", choices=["nccl", "tpar", "torch-symm", "gloo"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=50, help="timed replays (steps)")
    p.add_argument("--no-graph", action="store_true", help="run eagerly instead of replaying a CUDA graph")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save", help="rank 0 writes the step's output here")
    p.add_argument("--compare", help="compare the output with a file written by --save")
    p.add_argument("--same-gpu", action="store_true", help="every rank on cuda:0 (testing on one GPU; not a performance setup)")
    return p.parse_args()


class AllReduce:
    """The all-reduce under test, out of place like the engines' custom all-reduces."""

    def __init__(self, kind, device, group):
        self.kind, self.group = kind, group
        if kind == "tpar":
            import tpar.torch

            cpu_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
            nccl = None if dist.get_backend() == "gloo" else dist.group.WORLD
            self.comm = tpar.torch.Communicator(cpu_group, device, nccl_group=nccl)
        elif kind == "torch-symm":
            import torch.distributed._symmetric_memory as symm

            self.symm = symm
            self.buf = None

    def __call__(self, x):
        if self.kind == "tpar":
            return self.comm.all_reduce(x)
        if self.kind == "torch-symm":
            n = x.numel()
            if self.buf is None or self.buf.numel() < n:
                self.buf = self.symm.empty(max(n, 1 << 20), dtype=x.dtype, device=x.device)
                self.symm.rendezvous(self.buf, dist.group.WORLD.group_name)
            b = self.buf[:n]
            b.copy_(x.reshape(-1))
            return torch.ops.symm_mem.one_shot_all_reduce(b, "sum", dist.group.WORLD.group_name).view_as(x)
        y = x.clone()
        dist.all_reduce(y)
        return y


class Layer:
    def __init__(self, hidden, inter, heads, world, rank, gen, dtype, device):
        assert heads % world == 0 and inter % world == 0, "heads and intermediate size must split evenly"
        hd = hidden // heads
        qkv = 3 * (heads // world) * hd
        scale = hidden ** -0.5

        def w(*shape, s=scale):
            # Each rank draws its own shard from its own stream: a model whose full weights
            # would be these shards side by side.
            return (torch.randn(*shape, generator=gen, dtype=torch.float32) * s).to(dtype).to(device)

        self.heads_local, self.hd = heads // world, hd
        self.w_qkv = w(hidden, qkv)
        self.w_o = w(qkv // 3, hidden, s=(qkv // 3 * world) ** -0.5)
        self.w_gate_up = w(hidden, 2 * inter // world)
        self.w_down = w(inter // world, hidden, s=inter ** -0.5)
        self.norm1 = torch.ones(hidden, dtype=dtype, device=device)
        self.norm2 = torch.ones(hidden, dtype=dtype, device=device)

    def forward(self, x, ar, with_ar=True):
        h = torch.nn.functional.rms_norm(x, x.shape[-1:], self.norm1)
        q, k, v = (h @ self.w_qkv).chunk(3, dim=-1)
        t = x.shape[0]
        q, k, v = (z.view(t, self.heads_local, self.hd) for z in (q, k, v))
        # Attention stand-in over the step's own tokens (no KV cache): softmax over tokens.
        att = torch.softmax(torch.einsum("thd,shd->hts", q, k).float() * self.hd ** -0.5, dim=-1).to(x.dtype)
        a = torch.einsum("hts,shd->thd", att, v).reshape(t, -1)
        o = a @ self.w_o  # row-parallel: a partial sum on every rank
        x = x + (ar(o) if with_ar else o)
        h = torch.nn.functional.rms_norm(x, x.shape[-1:], self.norm2)
        g, u = (h @ self.w_gate_up).chunk(2, dim=-1)
        d = (torch.nn.functional.silu(g) * u) @ self.w_down  # row-parallel
        return x + (ar(d) if with_ar else d)


def main():
    args = parse()
    cpu = args.device == "cpu"
    if args.allreduce == "gloo" or cpu:
        backend = "gloo"
    else:
        backend = "cpu:gloo,cuda:nccl" if args.allreduce != "nccl" or args.same_gpu else "nccl"
        if args.same_gpu:
            backend = "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cpu:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        device = torch.device("cuda", 0 if args.same_gpu else local)
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    layers_n, hidden, inter, heads = PRESETS[args.preset]
    layers_n = args.layers or layers_n
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    layers = [Layer(hidden, inter, heads, world, rank, gen, dtype, device) for _ in range(layers_n)]
    x_in = (torch.randn(args.tokens, hidden, generator=torch.Generator().manual_seed(args.seed)) * 0.5).to(dtype).to(device)
    ar = AllReduce(args.allreduce, device, None)

    def step(x, with_ar=True):
        for layer in layers:
            x = layer.forward(x, ar, with_ar)
        return x

    use_graph = not cpu and not args.no_graph
    static_x = x_in.clone()
    if use_graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up outside the graph (allocator, kernels, tpar's plan)
            step(static_x)
            step(static_x, with_ar=False)
        torch.cuda.current_stream().wait_stream(s)
        g, g_noar = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = step(static_x)
        with torch.cuda.graph(g_noar):
            step(static_x, with_ar=False)
        run, run_noar = (lambda: g.replay()), (lambda: g_noar.replay())
    else:
        holder = {}

        def run():
            holder["y"] = step(static_x)

        def run_noar():
            step(static_x, with_ar=False)

    def sync():
        if not cpu:
            torch.cuda.synchronize()

    def timed(fn, n):
        for _ in range(3):
            fn()
        sync()
        dist.barrier()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t) / n

    t_step = timed(run, args.iters)
    t_noar = timed(run_noar, args.iters)
    y = (static_y if use_graph else holder["y"]).clone()
    run()
    sync()
    y2 = static_y if use_graph else holder["y"]
    reproducible = torch.equal(y.view(torch.int16 if dtype != torch.float32 else torch.int32), y2.view(torch.int16 if dtype != torch.float32 else torch.int32))
    gathered = [torch.empty_like(y.cpu()) for _ in range(world)] if rank == 0 else None
    dist.gather_object(y.cpu(), gathered if rank == 0 else None, dst=0)
    if args.allreduce == "tpar":
        ar.comm.check()
    if rank == 0:
        same_across = all(torch.equal(gathered[0], z) for z in gathered)
        share = max(0.0, (t_step - t_noar) / t_step)
        ars = 2 * layers_n
        kib = args.tokens * hidden * dtype.itemsize / 1024
        print(f"tp_decode: preset {args.preset} ({layers_n} layers, hidden {hidden}), {args.tokens} tokens, {dtype}, world {world}, "
              f"{args.allreduce} on {device.type}{' (all ranks on one GPU)' if args.same_gpu else ''}, {'CUDA graph' if use_graph else 'eager'}")
        print(f"  step {t_step * 1e3:.3f} ms; without all-reduces {t_noar * 1e3:.3f} ms; all-reduce share {share * 100:.1f}% "
              f"({ars} all-reduces of {kib:.1f} KiB, {(t_step - t_noar) / ars * 1e6:.1f} us each)")
        print(f"  ranks' outputs bitwise identical: {same_across}; a second replay bitwise identical: {reproducible}")
        if args.save:
            torch.save(gathered[0], args.save)
            print(f"  saved the output to {args.save}")
        if args.compare:
            ref = torch.load(args.compare).float()
            diff = (gathered[0].float() - ref).abs()
            tol = 2 ** -7 if dtype == torch.bfloat16 else (2 ** -10 if dtype == torch.float16 else 1e-5)
            rel = (diff / ref.abs().clamp_min(1e-2)).max().item()
            print(f"  against {args.compare}: max abs diff {diff.max().item():.4g}, max rel diff {rel:.4g}, "
                  f"bitwise equal {torch.equal(gathered[0], torch.load(args.compare))}; "
                  f"{'within' if rel <= 8 * tol * layers_n ** 0.5 else 'OUTSIDE'} {args.dtype} tolerance")
    if args.allreduce == "tpar":
        ar.comm.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
