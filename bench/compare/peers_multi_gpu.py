#!/usr/bin/env python3
"""Peers that need one process per GPU, against tpar and NCCL in the same run.

FlashInfer's PCIe IPC all-reduce (flashinfer-python 0.7.2.post1,
`flashinfer.comm.pcie_ipc_ar.PcieIpcAllReduceWorkspace`) and b12x's one-shot and
copy-engine all-reduces (b12x 1.5.1, `b12x.comm.pcie.OneshotAllReducePool` and
`DmaAllReduce`) run their own kernels (FlashInfer's compiled by nvcc + ninja on first
use, b12x's CuTe DSL kernels compiled at run time) in one process per GPU. This script
times them beside torch's NCCL all-reduce and tpar (`tpar.torch.Communicator`), same
sizes, same method, in one run:

  * every (method, size) is checked first: random bf16 inputs per rank (seeded, built on
    the CPU so every rank rebuilds every rank's input), outputs poisoned with NaN, the
    result compared with the float64 sum within max(2, world-1) bf16 roundings of the
    sum of magnitudes, and every rank's output compared bitwise; eagerly, then replayed
    from a CUDA graph with fresh inputs copied into the captured buffer;
  * then timed: `--inner` calls per iteration, back to back (eager) or captured once in
    one CUDA graph and replayed (graph); every iteration starts after all ranks met with
    idle GPUs; per iteration the slowest rank; median, p10, p90 over `--iters`;
  * `--sequence 122x43008`: a whole verify step, CALLS calls of BYTES captured in one graph.

A method that cannot be set up here (a package missing, a world size or GPU it refuses)
is reported as skipped with its reason on every rank; it never hangs the others.

Run (2-8 GPUs of one host, one process per GPU; the carry recipe is in
bench/compare/README.md):

    PYTHONPATH=/tmp/site:$PYTHONPATH python3 -m torch.distributed.run --standalone \\
        --nproc-per-node N bench/compare/peers_multi_gpu.py --out DIR \\
        [--methods nccl,tpar,flashinfer,b12x-oneshot,b12x-dma] \\
        [--min-bytes 1K --max-bytes 16M --factor 4 --iters 50 --warmup 5 --inner 20] \\
        [--sequence 122x43008] [--modes graph,eager]

It refuses to run two ranks on one GPU: these peers' kernels spin-wait on each other, and
processes sharing a GPU are time-sliced by CUDA, so such a run measures the scheduler,
not the peer (tpar's emulated ranks are the one-GPU measurement). NVLink multicast stays
off (NCCL_NVLS_ENABLE=0 set before torch loads).

Rank 0 writes DIR/peers_multi_gpu.json and prints a table per mode: median us per call
per method and size, and tpar / method (below 1: tpar is faster).

Exit status: 0 every checked result right; 1 a wrong result or outputs that differ across
ranks; 2 bad command line; 3 a fatal error; 5 refused (fewer GPUs than ranks).
"""

import os
import sys

# Read once when NCCL loads: set before torch is imported, never overridden.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
if os.environ["NCCL_NVLS_ENABLE"] != "0":
    sys.stderr.write("peers_multi_gpu.py: NVLink multicast must stay off (NCCL_NVLS_ENABLE=0)\n")
    sys.exit(3)

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402

from peers_multi_gpu_methods import CLASSES  # noqa: E402

EXIT_OK, EXIT_WRONG, EXIT_FATAL, EXIT_REFUSED = 0, 1, 3, 5
METHODS = ("nccl", "tpar", "flashinfer", "b12x-oneshot", "b12x-dma")
# bf16 keeps 8 significant bits: one rounding to nearest errs by at most 2^-8 of the value.
BF16_UNIT_ROUNDOFF = 2.0 ** -8
SEED_BASE = 0x5EE_D0


def parse_size(text):
    m = re.match(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1024, 1K, 16M")
    return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]


def parse_sequence(text):
    calls, _, size = text.partition("x")
    try:
        return int(calls), parse_size(size)
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise argparse.ArgumentTypeError(f"--sequence {text!r}: expected CALLSxBYTES, e.g. 122x43008 ({e})")


def size_steps(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def percentile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def short_error(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("Exception raised from", "frame #"))]
    return " | ".join(lines[:3])[:600]


def args_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for peers_multi_gpu.json (rank 0)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("16M"))
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--inner", type=int, default=20, help="calls per timed iteration")
    p.add_argument("--modes", default="graph,eager", help="graph, eager, or both (comma list)")
    p.add_argument("--sequence", type=parse_sequence, default=None, help="CALLSxBYTES, e.g. 122x43008")
    p.add_argument("--timeout-s", type=int, default=300, help="process-group timeout (a hung peer aborts)")
    p.add_argument("--flashinfer-tune", type=int, default=0, metavar="HIDDEN",
                   help="tune FlashInfer's launch configurations for this hidden size first (its ws.tune); "
                        "sizes that are whole rows of HIDDEN then run as (rows, HIDDEN)")
    p.add_argument("--b12x-dma-wire", default="", help="b12x DmaAllReduce wire mode (default bf16; e.g. ag, ring: fp8, inexact)")
    return p


# --------------------------------------------------------------------------- the group


class Ranks:
    """The process group, its GPU, and the cross-rank plumbing every measurement uses."""

    def __init__(self, args):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            if name not in os.environ:
                sys.stderr.write(f"peers_multi_gpu.py: {name} is not set; start it with python3 -m torch.distributed.run --standalone --nproc-per-node N ...\n")
                sys.exit(EXIT_FATAL)
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ["LOCAL_WORLD_SIZE"])
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.world != local_world:
            self.refuse(f"{self.world} ranks across hosts: these peers run on one host only")
        if gpus < local_world or local_world < 2:
            self.refuse(
                f"{local_world} rank(s) on {gpus} GPU(s): these peers need one GPU per rank and 2 or more ranks. "
                "Their kernels spin-wait on each other; processes sharing a GPU are time-sliced by CUDA, so such a run "
                "measures the scheduler, not the peer (on one GPU, tpar bench --emulate-ranks N --compare vllm is the measurement)"
            )
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        dist.init_process_group(backend="nccl", device_id=self.device, timeout=datetime.timedelta(seconds=args.timeout_s))
        self.group = dist.group.WORLD
        # A CPU group for objects and for the libraries that want one (tpar's rendezvous,
        # FlashInfer's tuning group as vLLM passes it).
        self.gloo = dist.new_group(backend="gloo")
        self._meet = torch.zeros(1, dtype=torch.float32, device=self.device)

    def refuse(self, why):
        if os.environ.get("RANK", "0") == "0":
            sys.stderr.write(f"peers_multi_gpu.py: refused: {why}\n")
        sys.exit(EXIT_REFUSED)

    def log(self, msg):
        if self.rank == 0:
            sys.stderr.write(f"[peers] {msg}\n")
            sys.stderr.flush()

    def sync(self):
        """Back only when every rank got here with an idle GPU."""
        self.torch.cuda.synchronize()
        self.dist.all_reduce(self._meet, group=self.group)
        self.torch.cuda.synchronize()

    def agree(self, err):
        """Every rank learns whether any rank failed: the first failure, or None."""
        msgs = [None] * self.world
        self.dist.all_gather_object(msgs, err, group=self.gloo)
        for r, m in enumerate(msgs):
            if m is not None:
                return f"rank {r}: {m}"
        return None

    def slowest(self, samples):
        t = self.torch.tensor(samples, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def digests_agree(self, out):
        d = hashlib.sha256(out.detach().contiguous().view(self.torch.uint8).cpu().numpy().tobytes()).hexdigest()
        every = [None] * self.world
        self.dist.all_gather_object(every, d, group=self.gloo)
        return all(x == every[0] for x in every)

    def sum_int(self, v):
        t = self.torch.tensor([v], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t, group=self.group)
        return int(t.item())


def make_input(torch, rank, nbytes, call):
    """Rank `rank`'s input of `nbytes` for check `call`, built on the CPU (zeros replaced)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(SEED_BASE + 1_000_003 * (rank + 1) + 7919 * call + nbytes)
    x = torch.randn(nbytes // 2, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    x[x == 0] = 1.0
    return x


def count_wrong(torch, out, inputs, world):
    """Elements farther from the f64 sum than max(2, world-1) bf16 roundings of the sum of
    magnitudes (NaN and infinities always count): the bound for sums rounded to bf16 at
    every partial step, which NCCL's ring and b12x's copy-engine ring do."""
    s = torch.zeros(inputs[0].numel(), dtype=torch.float64)
    mag = torch.zeros_like(s)
    for x in inputs:
        x64 = x.to(torch.float64)
        s += x64
        mag += x64.abs()
    got = out.detach().reshape(-1).cpu().to(torch.float64)
    bound = max(2, world - 1) * BF16_UNIT_ROUNDOFF * mag + 1e-30
    bad = ~((got - s).abs() <= bound)
    return int(bad.sum().item())


# --------------------------------------------------------------------------- measuring


def buffers_for(m, nbytes):
    """The input and output a method runs on: its prepared pair where it binds one."""
    torch = m.torch
    if hasattr(m, "buffers"):
        return m.buffers(nbytes)
    x = torch.zeros(m.shape(nbytes), dtype=torch.bfloat16, device=m.r.device)
    return x, torch.empty_like(x)


def check(m, nbytes, mode, call):
    """One checked call (eager, or replayed from a one-call graph) on fresh inputs; returns
    (wrong elements summed over ranks, whether every rank's output is identical)."""
    r, torch = m.r, m.torch
    inp, out = buffers_for(m, nbytes)
    graph = m.capture(inp, out, 1) if mode == "graph" else None
    inputs = [make_input(torch, q, nbytes, call) for q in range(r.world)]
    inp.view(-1).copy_(inputs[r.rank].to(r.device))
    if not m.in_place:
        out.fill_(float("nan"))
    r.sync()
    if graph is not None:
        graph.replay()
    else:
        m.run(inp, out)
    torch.cuda.synchronize()
    res = inp if m.in_place else out
    wrong = r.sum_int(count_wrong(torch, res, inputs, r.world))
    same = r.digests_agree(res)
    del graph
    return wrong, same


def timed(m, nbytes, mode, calls, warmup, iters):
    r, torch = m.r, m.torch
    inp, out = buffers_for(m, nbytes)
    inp.fill_(1.0 / r.world)
    graph = m.capture(inp, out, calls) if mode == "graph" else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for k in range(warmup + iters):
        r.sync()
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(calls):
                m.run(inp, out)
        end.record()
        end.synchronize()
        if k >= warmup:
            samples.append(start.elapsed_time(end) * 1e3 / calls)
    worst = sorted(r.slowest(samples))
    del graph
    return {"median_us": percentile(worst, 50), "p10_us": percentile(worst, 10), "p90_us": percentile(worst, 90)}


def main():
    args = args_parser().parse_args()
    methods = [x.strip() for x in args.methods.split(",") if x.strip()]
    unknown = [x for x in methods if x not in CLASSES]
    modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    if unknown or not methods or any(x not in ("graph", "eager") for x in modes) or args.factor < 2:
        sys.stderr.write(f"bad --methods/--modes/--factor (methods: {', '.join(METHODS)}; modes: graph, eager)\n")
        sys.exit(2)
    r = Ranks(args)
    torch = r.torch
    sizes = size_steps(args.min_bytes, args.max_bytes, args.factor)
    all_sizes = sorted(set(sizes + ([args.sequence[1]] if args.sequence else [])))
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "world": r.world,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "argv": sys.argv,
        "dtype": "bfloat16",
        "method": "checked first (eager and graph replay), then timed: inner calls per iteration, slowest rank, median/p10/p90",
    }
    results, skipped, wrong_total = [], {}, 0
    live = []
    for name in methods:
        m = CLASSES[name](r, args, all_sizes)
        err = None
        try:
            m.setup()
        except Exception as e:  # noqa: BLE001 - reported jointly, never left to hang peers
            err = short_error(e)
            if os.environ.get("PEERS_TRACEBACK"):
                traceback.print_exc()
        err = r.agree(err)
        if err:
            skipped[name] = err
            r.log(f"{name}: skipped: {err}")
            continue
        r.log(f"{name}: {m.version}")
        live.append(m)
    for m in live:
        for nbytes in all_sizes:
            if not m.supports(nbytes):
                results.append({"method": m.name, "bytes": nbytes, "skipped": "size not supported by this method"})
                continue
            row = {"method": m.name, "bytes": nbytes, "wrong": 0, "identical": True}
            err = None
            try:
                for k, mode in enumerate(modes):
                    w, same = check(m, nbytes, mode, call=k)
                    row["wrong"] += w
                    row["identical"] &= same
                ok = row["wrong"] == 0 and row["identical"]
                if not ok:
                    wrong_total += max(1, row["wrong"])
                if nbytes in sizes:
                    for mode in modes:
                        row[mode] = timed(m, nbytes, mode, args.inner, args.warmup, args.iters)
                if args.sequence and nbytes == args.sequence[1] and "graph" in modes:
                    row["sequence"] = timed(m, nbytes, "graph", args.sequence[0], min(args.warmup, 3), args.iters)
            except Exception as e:  # noqa: BLE001
                err = short_error(e)
            err = r.agree(err)
            if err:
                row = {"method": m.name, "bytes": nbytes, "error": err}
                wrong_total += 1
            results.append(row)
            r.log(f"{m.name} {nbytes} B: {row}")
    for m in live:
        try:
            m.close()
        except Exception as e:  # noqa: BLE001
            r.log(f"{m.name}: close: {short_error(e)}")
    if r.rank == 0:
        report(args, header, live, skipped, results, sizes, modes)
    r.dist.barrier(group=r.gloo)
    r.dist.destroy_process_group()
    sys.exit(EXIT_WRONG if wrong_total else EXIT_OK)


def report(args, header, live, skipped, results, sizes, modes):
    os.makedirs(args.out, exist_ok=True)
    header["versions"] = {m.name: m.version for m in live}
    header["skipped"] = skipped
    path = os.path.join(args.out, "peers_multi_gpu.json")
    with open(path, "w") as f:
        json.dump({"header": header, "records": results}, f, indent=1)
    names = [m.name for m in live]
    at = {(x["method"], x["bytes"]): x for x in results}
    print(f"# peers_multi_gpu: {header['world']} ranks, {', '.join(sorted(set(header['gpus'])))}; bf16; {header['date']}")
    for name, v in header["versions"].items():
        print(f"#   {name}: {v}")
    for name, why in skipped.items():
        print(f"#   {name}: SKIPPED: {why}")
    for mode in modes:
        print(f"# {mode}: median us per call [#wrong]; tpar/X = tpar's time over X's (below 1: tpar is faster)")
        print("  " + f"{'size (B)':>10}" + "".join(f" {n:>16}" for n in names) + "".join(f" {'tpar/' + n:>18}" for n in names if n != "tpar"))
        for nbytes in sizes:
            cells, ratios = [], []
            tp = at.get(("tpar", nbytes), {}).get(mode, {}).get("median_us")
            for n in names:
                x = at.get((n, nbytes), {})
                t = x.get(mode, {}).get("median_us")
                cells.append("error" if "error" in x else "-" if t is None else f"{t:.2f} [{x.get('wrong', 0)}{'' if x.get('identical', True) else ' differ'}]")
                if n != "tpar":
                    ratios.append("-" if t is None or tp is None else f"{tp / t:.2f}")
            print("  " + f"{nbytes:>10}" + "".join(f" {c:>16}" for c in cells) + "".join(f" {c:>18}" for c in ratios))
    if args.sequence:
        calls, nbytes = args.sequence
        print(f"# sequence: {calls} x {nbytes} B in one graph, us per step (median [p10-p90])")
        for n in names:
            s = at.get((n, nbytes), {}).get("sequence")
            if s:
                print(f"  {n:>14} {s['median_us'] * calls:10.1f} [{s['p10_us'] * calls:.1f}-{s['p90_us'] * calls:.1f}]  {s['median_us']:.2f} us per call")
    for x in results:
        if "error" in x:
            print(f"# ERROR {x['method']} {x['bytes']} B: {x['error']}")
        elif x.get("wrong") or not x.get("identical", True):
            print(f"# WRONG {x['method']} {x['bytes']} B: {x.get('wrong')} elements outside the bound; identical across ranks: {x.get('identical')}")
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()
