#!/usr/bin/env python3
"""PyTorch's own small all-reduces on one multi-GPU host, for comparison with tpar.

Runs the all-reduces that PyTorch ships, on the same GPUs and in the same session as
tpar's benchmark, so the two sets of figures can go side by side. It measures a bf16
sum all-reduce with three methods:

  torch-nccl     dist.all_reduce on an ordinary CUDA tensor (NCCL backend, in place)
  symm-oneshot   torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
                 (out of place; buf is a view of a symmetric-memory buffer)
  symm-twoshot   torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group_name)
                 (in place on a view of a symmetric-memory buffer)

each in two modes: `eager` (inner calls back to back between two CUDA events) and
`graph` (inner calls captured once in a CUDA graph, the replay timed with events).
Per-call time = elapsed / inner. Every timed iteration starts after all ranks have met
(a tiny NCCL all-reduce plus a synchronize); its time is the slowest rank's. Reported
per (method, mode, size): median, p10 and p90 over --iters iterations.

Before timing, every (method, size) is checked: random bf16 inputs per rank (seeded by
rank and size, so every rank can rebuild every rank's input), reference = exact sum in
float64, output poisoned with NaN where the op has a separate output, then the number
of elements off by more than the bf16 rounding bound (or not finite) and whether every
rank's output is bitwise identical. The bound is max(2, world-1) * 2^-8 * sum_r |x_r|
(world-1 bf16 roundings of partial sums; see `reference`).

Command line (2-4 NVIDIA GPUs on one host, NVLink):

    python3 -m torch.distributed.run --standalone --nproc-per-node N \\
        bench/compare/torch_symm_mem.py --out DIR \\
        [--min-bytes 1K --max-bytes 16M --iters 30 --warmup 5 --inner 20]

Rank 0 writes DIR/torch_symm_mem.json ({"header": {...}, "records": [...]}) and prints
an nccl-tests-like table (median us per call) to stdout; progress goes to stderr.

MULTICAST RULE: NVLink multicast (NVLS) must stay off on the benchmark machine. This
script sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (os.environ.setdefault) before torch is imported, exits with
status 4 if any of them is set to anything else, refuses to run if symmetric memory
still reports multicast support, and never calls a multimem op (multimem_all_reduce_,
multimem_one_shot_all_reduce, ...).

Exit status: 0 all checked results right; 1 some result wrong or not identical across
ranks; 2 bad command line; 3 a fatal error (partial JSON is written); 4 the multicast
rule would be broken.
"""

import os
import sys

# The multicast rule is enforced when torch_symm_mem_lib loads, before torch is imported
# (see that module's REQUIRED_ENV); it is the first import for that reason.
from torch_symm_mem_lib import (  # noqa: E402
    DTYPE_NAME,
    EXIT_FATAL,
    EXIT_MULTICAST,
    EXIT_OK,
    EXIT_WRONG,
    METHOD_CLASSES,
    METHODS,
    MODES,
    REQUIRED_ENV,
    Bench,
    MulticastRuleError,
    check_point,
    make_input,
    parse_size,
    percentile,
    reference,
    short_error,
    size_list,
    time_eager,
    time_graph,
)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shlex  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# Environment variables recorded in the header besides REQUIRED_ENV, because they
# change what NCCL or symmetric memory do.
RECORDED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_P2P_LEVEL",
    "NCCL_CUMEM_ENABLE",
    "NCCL_DEBUG",
    "TORCH_SYMMEM",
    "TORCH_SYMMEM_IMPLICIT_POOL",
    "TORCH_SYMMEM_NBLOCKS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


# --------------------------------------------------------------------------- output


def make_record(method, mode, world, nbytes, stats=None, wrong=None, identical=None,
                reason=None, samples=None):
    rec = {
        "method": method,
        "mode": mode,
        "dtype": DTYPE_NAME,
        "world": world,
        "bytes": nbytes,
        "count": nbytes // 2,
        "time_us": None,
        "p10_us": None,
        "p90_us": None,
        "wrong": wrong,
        "identical": identical,
        "skipped_reason": reason,
    }
    if stats is not None:
        rec.update(stats)
    if samples is not None:
        rec["samples_us"] = [round(s, 4) for s in samples]
    return rec


def summarize(samples: list) -> dict:
    s = sorted(samples)
    return {
        "time_us": round(percentile(s, 50), 4),
        "p10_us": round(percentile(s, 10), 4),
        "p90_us": round(percentile(s, 90), 4),
    }


def nccl_version() -> str:
    try:
        from torch.cuda import nccl  # not imported by `import torch` in every release

        v = nccl.version()
    except Exception as exc:
        return f"unknown ({short_error(exc)})"
    if isinstance(v, tuple):
        return ".".join(str(p) for p in v)
    # Old releases return NCCL_VERSION_CODE as one integer (major*10000+minor*100+patch
    # since NCCL 2.9, major*1000+minor*100+patch before); kept as it is.
    return str(v)


def build_header(bench: Bench, args, sizes, tol_factor) -> dict:
    script = os.path.relpath(os.path.abspath(sys.argv[0]))
    nproc = os.environ.get("LOCAL_WORLD_SIZE", str(bench.world))
    launcher = (
        f"python3 -m torch.distributed.run --standalone --nproc-per-node {nproc} "
        + " ".join(shlex.quote(a) for a in [script] + sys.argv[1:])
    )
    return {
        "tool": "bench/compare/torch_symm_mem.py",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "command_line": launcher,
        "process_argv": list(getattr(sys, "orig_argv", sys.argv)),
        "python": sys.version.split()[0],
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": nccl_version(),
        "gpu_name": torch.cuda.get_device_name(bench.device),
        "gpu_capability": list(torch.cuda.get_device_capability(bench.device)),
        "gpus_visible": torch.cuda.device_count(),
        "world": bench.world,
        "dtype": DTYPE_NAME,
        "reduce_op": "sum",
        "methods": list(args.methods),
        "modes": list(args.modes),
        "sizes_bytes": sizes,
        "iters": args.iters,
        "warmup": args.warmup,
        "inner": args.inner,
        "env": {k: os.environ.get(k) for k in list(REQUIRED_ENV) + list(RECORDED_ENV)},
        "symm_mem": bench.symm_info,
        "timing": (
            "per iteration: ranks meet (tiny NCCL all-reduce + synchronize), then CUDA "
            "events around `inner` back-to-back calls (eager) or one replay of a graph "
            "holding `inner` calls (graph); per-call us = elapsed / inner; the max across "
            "ranks per iteration; time_us/p10_us/p90_us = median/p10/p90 over `iters`"
        ),
        "correctness": (
            "inputs: torch.randn (CPU generator seeded by rank and size) in bf16, zeros "
            "replaced; reference: float64 sum over ranks; wrong = elements (summed over "
            f"ranks and checked outputs) with |out - ref| > {tol_factor:g} * 2^-8 * "
            "sum_r |x_r| or not finite; identical = every rank's output bitwise equal; "
            "symm-oneshot checks both one_shot_all_reduce_out into a NaN-poisoned tensor "
            "and the returned tensor of one_shot_all_reduce"
        ),
        "tol_factor": tol_factor,
    }


def format_table(records, sizes, methods, modes) -> str:
    lookup = {(r["method"], r["mode"], r["bytes"]): r for r in records}
    cols = [(m, mo) for m in methods for mo in modes]
    width = max(12, max(len(f"{m}/{mo}") for m, mo in cols) + 1)
    lines = [
        "#",
        "# median us per call (bf16 sum); '!' = wrong or not identical across ranks, "
        "'-' = skipped",
        "#",
        "# " + f"{'size(B)':>10} {'count':>10}" + "".join(f" {f'{m}/{mo}':>{width}}" for m, mo in cols),
    ]
    reasons = {}  # (method, reason) -> {"modes": [...], "sizes": [...]}
    for nbytes in sizes:
        cells = []
        for m, mo in cols:
            r = lookup.get((m, mo, nbytes))
            if r is None or r["time_us"] is None:
                cells.append("-")
                if r is not None and r["skipped_reason"]:
                    entry = reasons.setdefault((m, r["skipped_reason"]), {"modes": [], "sizes": []})
                    if mo not in entry["modes"]:
                        entry["modes"].append(mo)
                    if nbytes not in entry["sizes"]:
                        entry["sizes"].append(nbytes)
                continue
            flag = "!" if (r["wrong"] or r["identical"] is False) else ""
            cells.append(f"{r['time_us']:.2f}{flag}")
        lines.append("  " + f"{nbytes:>10} {nbytes // 2:>10}" + "".join(f" {c:>{width}}" for c in cells))
    if reasons:
        lines.append("#")
        lines.append("# skipped:")
        for (m, why), entry in reasons.items():
            where = entry["sizes"]
            if len(where) <= 3:
                span = ", ".join(str(w) for w in where)
            else:
                span = f"{len(where)} sizes from {where[0]} to {where[-1]}"
            lines.append(f"#   {m} ({', '.join(entry['modes'])}) at {span} B: {why}")
    return "\n".join(lines)


def finite_or_none(obj):
    """Strict JSON has no NaN or inf; a missing figure becomes null instead."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def write_json(path, header, records) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(finite_or_none({"header": header, "records": records}), f, indent=1,
                  allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)  # never leave a half-written file behind


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch NCCL and symmetric-memory all-reduce latency (bf16), eager and CUDA graph.",
    )
    p.add_argument("--out", required=True, help="directory for torch_symm_mem.json")
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("16M"))
    p.add_argument("--iters", type=int, default=30, help="timed iterations per point")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per point")
    p.add_argument("--inner", type=int, default=20, help="calls per timed iteration")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated subset of " + ",".join(METHODS))
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated subset of " + ",".join(MODES))
    p.add_argument("--tol-factor", type=float, default=None,
                   help="tolerance in units of 2^-8 * sum_r |x_r|; default max(2, world-1)")
    p.add_argument("--timeout-s", type=int, default=300,
                   help="NCCL collective timeout; a stuck rank aborts instead of hanging")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    if args.min_bytes < 2 or args.min_bytes % 2:
        p.error("--min-bytes must be a positive multiple of 2 (bf16 elements)")
    if args.max_bytes < args.min_bytes:
        p.error("--max-bytes must be >= --min-bytes")
    if args.iters < 1 or args.warmup < 0 or args.inner < 1:
        p.error("--iters and --inner must be >= 1, --warmup >= 0")
    return args


def run(bench: Bench, args, state: dict) -> int:
    sizes = size_list(args.min_bytes, args.max_bytes)
    tol_factor = args.tol_factor if args.tol_factor is not None else max(2.0, float(bench.world - 1))
    bench.log(
        f"world={bench.world} gpu={torch.cuda.get_device_name(bench.device)} "
        f"torch={torch.__version__} nccl={nccl_version()} sizes={sizes[0]}..{sizes[-1]} B "
        f"({len(sizes)}) iters={args.iters} warmup={args.warmup} inner={args.inner}"
    )
    if any(m.startswith("symm-") for m in args.methods):
        bench.setup_symm(sizes[-1])
    else:
        bench.symm_reason = "not requested"
    state["header"] = build_header(bench, args, sizes, tol_factor)
    records = state["records"]
    methods = [METHOD_CLASSES[m](bench) for m in args.methods]
    any_bad = False
    total = len(sizes) * len(methods)
    done = 0

    for nbytes in sizes:
        # The same inputs serve every method at this size; every rank builds all of them
        # so that it can form the reference without moving data between ranks.
        inputs = [make_input(r, nbytes) for r in range(bench.world)]
        x_dev = inputs[bench.rank].to(bench.device)
        ref, tol = reference(bench, inputs, tol_factor)
        for method in methods:
            done += 1
            tag = f"[{done}/{total}] {method.name} {nbytes} B"
            reason = method.skip_reason(nbytes)  # same on every rank
            if reason is not None:
                bench.log(f"{tag}: skipped: {reason}")
                for mode in args.modes:
                    records.append(make_record(method.name, mode, bench.world, nbytes, reason=reason))
                continue

            wrong, identical, err = check_point(bench, method, x_dev, ref, tol)
            if err is not None:
                bench.log(f"{tag}: unsupported (correctness run raised): {err}")
                for mode in args.modes:
                    records.append(make_record(method.name, mode, bench.world, nbytes,
                                               reason=f"raised: {err}"))
                method.release()
                continue
            bad = bool(wrong) or not identical
            any_bad = any_bad or bad
            bench.log(f"{tag}: check wrong={wrong} identical={identical}" + ("  <-- BAD" if bad else ""))

            for mode in args.modes:
                err, samples = None, None
                try:
                    timer = time_eager if mode == "eager" else time_graph
                    samples = timer(bench, method, args)
                except Exception as exc:
                    err = short_error(exc)
                    bench.warn(f"{method.name} {mode} {nbytes} B raised: {err}")
                err = bench.agree(err)
                if err is not None:
                    bench.log(f"{tag} {mode}: unsupported: {err}")
                    records.append(make_record(method.name, mode, bench.world, nbytes,
                                               wrong=wrong, identical=identical,
                                               reason=f"raised: {err}"))
                    continue
                worst = bench.max_across_ranks(samples)
                stats = summarize(worst)
                records.append(make_record(method.name, mode, bench.world, nbytes, stats=stats,
                                           wrong=wrong, identical=identical, samples=worst))
                bench.log(
                    f"{tag} {mode}: median {stats['time_us']:.2f} us "
                    f"(p10 {stats['p10_us']:.2f}, p90 {stats['p90_us']:.2f})"
                )
            method.release()
        del inputs, x_dev, ref, tol

    if bench.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "torch_symm_mem.json")
        write_json(path, state["header"], records)
        print(format_table(records, sizes, args.methods, args.modes), flush=True)
        bench.log(f"wrote {path}")
    if any_bad:
        bench.log("some checked results were WRONG or not identical across ranks")
        return EXIT_WRONG
    return EXIT_OK


def main() -> int:
    args = parse_args()
    bench = Bench(args)
    state = {"header": {}, "records": []}
    code = EXIT_FATAL
    try:
        code = run(bench, args, state)
    except MulticastRuleError:
        code = EXIT_MULTICAST
    except Exception:
        bench.warn("fatal error:\n" + traceback.format_exc())
        if bench.rank == 0:
            try:
                os.makedirs(args.out, exist_ok=True)
                header = dict(state["header"])
                header["fatal_error"] = traceback.format_exc(limit=5)
                write_json(os.path.join(args.out, "torch_symm_mem.json"), header, state["records"])
                bench.log("wrote partial results after a fatal error")
            except Exception:
                bench.warn("could not write partial results:\n" + traceback.format_exc())
        code = EXIT_FATAL
    finally:
        # Symmetric memory goes before the process group it was rendezvoused on.
        bench.release_symm()
        try:
            if code != EXIT_FATAL:
                bench.sync_ranks()
            dist.destroy_process_group()
        except Exception:
            bench.warn("destroy_process_group failed:\n" + traceback.format_exc())
    return code


if __name__ == "__main__":
    sys.exit(main())
