#!/usr/bin/env python3
"""vLLM's and SGLang's own distributed code driving tpar, in N rank processes.

    python3 scripts/engine_harness.py ENGINE WORLD [--device cuda|cpu] [--out DIR]
                                      [--stages settings,eager,compile,graph,thread,sp,sp_graph,dp,dp_graph,kill]
                                      [--label NAME] [--trace DIR]
    python3 scripts/engine_harness.py --matrix LINES.md   # several runs' lines -> one table

ENGINE is ``vllm`` or ``sglang``; the engine's modules must be importable (PYTHONPATH: the
carry of scripts/engine_carry.py, or its ``prepare()`` paths on a CPU machine) and tpar
installed as a wheel (its entry points are how the engines find the plug-in). Every rank:

1. ``TPAR_ENABLE=1``, then the engine's own plug-in loader (vLLM ``load_general_plugins``,
   SGLang ``load_plugins``), group set-up (vLLM ``init_distributed_environment`` +
   ``initialize_model_parallel``; SGLang ``init_distributed_environment`` +
   ``init_model_parallel_group`` for the TP group), and the check that the TP group's
   ``ca_comm`` is tpar's class and enabled;
2. ``eager``: the engine's all-reduce for every dtype and the engines' size classes
   (1..512 tokens x hidden 7168, and odd sizes), fresh random inputs. Who served a call is
   read from tpar's own counter (the drop-in's ``served_calls``, before and after the
   call), not from ``should_custom_ar``: a call tpar served is compared bitwise with
   ``tpar.testing.reference`` (rank-order float32 sum, rounded once); a call the engine's
   fallback (gloo) took is judged within the fallback's rounding against the exact
   (float64) sum (``fallback_wrong``), since its order is the engine's; a call that
   ``should_custom_ar`` gave tpar and tpar did not serve (or the reverse) is wrong;
3. ``compile``: the engine's own op inside ``torch.compile(fullgraph=True)``; every compiled
   call must have reached tpar (its served counter grew by one per call);
4. ``graph`` (GPU): calls captured inside the engine's ``graph_capture()`` (tpar's counter
   must grow by the captured calls), replayed on fresh inputs;
5. ``thread``: a call from a worker thread (vLLM's dual-batch overlap does this);
6. ``sp`` (vLLM): the engine's sequence-parallel ``sp_all_gather`` / ``sp_reduce_scatter``
   (every dtype, 1-64 rows of hidden 7168, the reduce-scatter's input padded by the engine):
   the all-gather bitwise every rank's rows in rank order, the reduce-scatter bitwise slice
   ``rank`` of the rank-order sum where tpar served it (its counter), else within the
   fallback's rounding; ``sp_graph`` (GPU): both captured in ``graph_capture()`` and replayed
   on fresh inputs, judged alike; ``sp_compile``: both inside ``torch.compile(fullgraph=True)``,
   every call a compiled graph served by tpar. vLLM's functions call the communicator's
   Python method, so Dynamo traces into tpar's drop-in, which puts one op of its own in the
   graph (``tpar::engine_all_gather`` / ``engine_reduce_scatter``) that decides when it runs;
   an all-gather tpar declines when the op runs (its size above ``max_size``) must come out
   of vLLM's own fallback inside the op, bitwise, with no second graph. Where Dynamo cannot
   trace, the stage records where it stopped (``untraceable``) and fails;
7. ``dp``, ``dp_compile``, ``dp_graph`` (SGLang): as ``sp``, ``sp_compile`` and ``sp_graph``, on
   SGLang's DP-attention ``dp_gather_partial`` (MAX_LEN padding) and
   ``dp_reduce_scatter_tensor`` (one attention-TP rank per DP rank), which reach
   ``GroupCoordinator._all_gather_into_tensor`` / ``_reduce_scatter_tensor`` through SGLang's
   opaque custom ops; tpar's plug-in wraps those methods. ``dp`` adds one all-gather above
   ``max_size`` (SGLang's own path must give the same bits) and calls tpar must decline
   (``dp_declines``), and a ``dp`` or ``dp_graph``
   stage where tpar served nothing fails (SGLang's own path is right too: only the counter
   tells that the wrap took). On a CPU the harness registers SGLang's own op body for CPU
   tensors (SGLang registers it for CUDA only);
8. ``kill``: the last rank dies mid-step; every survivor's next calls must raise a tpar
   error within 1 s, without ``check()``. The survivors cycle through the all-reduce and the
   engine's sequence-parallel gather and scatter, or SGLang's DP-attention ones (those tpar
   served before the death), so the death is found by whichever collective is in flight;
9. ``batchinv`` (vLLM with ``VLLM_BATCH_INVARIANT=1``, not in the default list): every size,
   up to 2048 tokens (beyond ``max_size``), through tpar and bitwise the reference.

Ranks are processes; on one GPU they share it (device 0). NCCL refuses two ranks on one GPU,
so torch's own groups use gloo and the engines' NCCL is off (vLLM ``VLLM_DISABLE_PYNCCL=1``,
SGLang ``use_pynccl=False``); calls tpar's plan gives to NCCL then go to the engine's
fallback, ``torch.distributed.all_reduce`` over gloo. One GPU has no peers to plan for, so
tpar plans on a preset (``TPAR_TOPOLOGY``, default ``h200-nvswitch-8``). Processes sharing a GPU
are time-sliced: no timings here, correctness and plumbing only.

On a CPU (``--device cpu``) the same runs with tpar's CPU backend as far as the engines
allow: vLLM's GroupCoordinator builds a ``CpuCommunicator`` on a CPU platform, so the harness
builds the engine's ``CudaCommunicator`` itself on the TP group's groups (device ``cpu``) and
installs it as the group's device communicator; SGLang sends CPU tensors to shared memory
before its dispatch, so the harness calls its dispatch (``_resolve_outplace_all_reduce_method``
and ``outplace_all_reduce``) directly. ``graph`` and ``sp_graph`` are skipped (they need CUDA).

Writes ``<out>/engine-<engine>-w<world>.json`` (every rank's record) and appends a line per
stage to ``<out>/engine-summary.md``; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from engine_adapters import Skip, SglangEngine, VllmEngine  # (it records the environment before any plug-in ran)

HIDDEN = 7168  # DeepSeek-V3's hidden size: the engines' decode all-reduce is tokens x hidden
TOKENS = (1, 3, 8, 64, 512)  # size classes of decode and small prefill batches
ODD = (1, 7, 129, 4099, 21504 + 5)  # element counts off every alignment
STAGES = ("settings", "eager", "compile", "graph", "thread", "sp", "sp_compile", "sp_graph", "dp", "dp_compile", "dp_graph", "kill")  # and "batchinv" (vLLM, VLLM_BATCH_INVARIANT=1), "fusion" (vLLM)
#: The names the sp and dp stages give the engine's all-gather and reduce-scatter in records.
COLLECTIVE_NAMES = {"sp": ("sp_all_gather", "sp_reduce_scatter"), "dp": ("dp_gather_partial", "dp_reduce_scatter_tensor")}
#: A survivor must see a dead peer within this (issue 21).
DEAD_PEER_S = 1.0


# ------------------------------------------------------------------------------------------
# Tracing, for scripts/engine_carry.py: which files a rank opened and loaded.
def _start_trace(prefixes):
    opened = set()

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], str):
            p = os.path.abspath(args[0])
            if any(p.startswith(x) for x in prefixes):
                opened.add(p)

    sys.addaudithook(hook)
    return opened


def _finish_trace(opened, prefixes, path):
    files = set(opened)
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f:
            files.add(os.path.abspath(f))
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[5].startswith("/"):
                    files.add(parts[5])
    except OSError:
        pass
    files = sorted(f for f in files if any(f.startswith(x) for x in prefixes) and os.path.isfile(f))
    with open(path, "w") as fh:
        json.dump(files, fh)



def fallback_wrong(y, xs, world):
    """How many elements of ``y``, the engine's fallback's sum of ``xs`` (every rank's input),
    lie beyond its rounding. The fallback (gloo, NCCL) adds in its own order, ``world - 1``
    additions in the dtype, each rounded; at three ranks and more that order differs from
    tpar's, so its bits may too. Judged against the exact sum (float64): each rounding is
    at most u * |partial sum| <= u * sum|x| (u: the dtype's unit roundoff, 2^-24 float32,
    2^-11 float16, 2^-8 bfloat16) or half a subnormal step, so
    |y - sum| <= world * (u * sum|x| + subnormal step) holds with a rounding to spare."""
    import torch

    fi = torch.finfo(y.dtype)
    u = fi.eps / 2
    exact = torch.zeros(y.numel(), dtype=torch.float64)
    mag = torch.zeros(y.numel(), dtype=torch.float64)
    for x in xs:
        x = x.reshape(-1).double()
        exact += x
        mag += x.abs()
    d = (y.detach().reshape(-1).cpu().double() - exact).abs()
    return int((d > world * (u * mag + fi.tiny * fi.eps)).sum())


def engine_setup(engine, rank, world, init, dev, stages):
    """The engine's set-up in a rank (its plug-in loader, its groups): the adapter of
    scripts/engine_adapters.py, after what a real install has registered before the engine's
    plug-ins load (vLLM's ``_C`` ops where ``stages`` has ``fusion``:
    ``engine_fusion.register_before_setup``; the carry stubs that extension)."""
    from engine_fusion import register_before_setup

    register_before_setup(engine, stages)
    return (VllmEngine if engine == "vllm" else SglangEngine)(rank, world, init, dev)


def rank_main(args):
    rank, world = args.rank, args.world
    prefixes = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    trace = _start_trace(prefixes) if args.trace else None
    import torch

    import tpar
    from tpar.engines import TparCustomAllreduce
    from tpar.testing import INT_VIEW, bits, make_inputs, reference

    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(0)
    rec = {"rank": rank, "stages": {}}
    import logging

    tpar_log = []  # what tpar logged (start-up warnings are checked by the settings stage)

    class _Keep(logging.Handler):
        def emit(self, record):
            tpar_log.append((record.levelname, record.getMessage()))
            if record.levelno >= logging.WARNING:  # this handler replaces logging's last resort: say it in the rank's log too
                print(f"tpar {record.levelname} {record.getMessage()}", file=sys.stderr, flush=True)

    logging.getLogger("tpar").addHandler(_Keep(level=logging.INFO))
    logging.getLogger("tpar").setLevel(logging.INFO)
    stages = [s for s in args.stages.split(",") if s]
    t0 = time.monotonic()
    eng = engine_setup(args.engine, rank, world, args.init, dev, stages)
    ca = eng.ca
    rec["setup_s"] = round(time.monotonic() - t0, 2)
    rec["ca_class"] = f"{type(ca).__module__}.{type(ca).__qualname__}" if ca is not None else None
    rec["ca_is_tpar"] = isinstance(ca, TparCustomAllreduce) and not ca.disabled
    if not rec["ca_is_tpar"]:
        said = "; ".join(m for lvl, m in tpar_log if lvl in ("WARNING", "ERROR")) or "tpar logged no warning"
        rec["error"] = f"the TP group's ca_comm is {rec['ca_class']} (disabled={getattr(ca, 'disabled', None)}), not tpar's: {said}"
        return rec
    import torch.distributed as dist

    world_group = eng.tp.cpu_group
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    digest = hashlib.sha256()
    seed = [1000]
    why = []  # the wrong calls, described

    def one(x_all, dt, call, what):
        """One call through the engine: returns the reductions tpar ran for it (the drop-in's
        ``served_calls`` before and after; 0: the engine's fallback took it) and whether the
        output is right: bitwise ``reference`` (tpar's rank-order float32 sum) where tpar
        served it, within the fallback's rounding (``fallback_wrong``) where not. A call
        that ``should_custom_ar`` promised to tpar and tpar did not serve (or the reverse)
        is wrong, whatever its bits: at two ranks the fallback's sum has tpar's bits."""
        x = x_all[rank].to(dev)
        asked = bool(ca.should_custom_ar(x))
        before = ca.served_calls
        y = call(x)
        served = ca.served_calls - before
        took = served > 0
        ref = reference(x_all, dt)
        if took:
            ok = bits(y) == bits(ref)
            digest.update(bits(y))
        else:  # the engine's fallback (gloo): its own order, a rounding per partial sum
            ok = fallback_wrong(y, x_all, world) == 0
            fallback_bits[0 if bits(y) == bits(ref) else 1] += 1
        if took and bits(x) != bits(x_all[rank]):
            ok = False  # tpar's call leaves its input alone (SGLang's fallback reduces in place, by design)
        if took != asked:
            ok = False
        if not ok:  # what went wrong, for the record (first few)
            d = (y.cpu().float() - ref.float()).abs()
            said = "" if took == asked else f" should_custom_ar={asked} but tpar served {served}"
            why.append(f"{what} {dt} n={x.numel()} took={took}{said} max|d|={d.max().item():.3g} at {int(d.argmax())}, {int((d > 0).sum())} differ"
                       + ("" if took else f", {fallback_wrong(y, x_all, world)} beyond the fallback's rounding"))
        return served, ok

    fallback_bits = [0, 0]  # the fallback's calls with tpar's bits, and with others (its order is not tpar's)

    def count(st, served, ok):
        st["cases"] += 1
        st["tpar" if served else "fallback"] += 1
        st["served"] += served
        st["wrong"] += not ok

    def cases():
        for dname, dt in dtypes.items():
            for n in [t * HIDDEN for t in TOKENS] + list(ODD):
                seed[0] += 1
                yield dname, dt, n, make_inputs(seed[0], world, n, dt)

    def sp_gather_case(fn, dt, rows, what, name="sp_all_gather"):
        """One all-gather through ``fn`` of ``rows`` x HIDDEN per rank: (served, ok), ok when
        the output is every rank's rows in rank order, bit for bit (a copy: whoever ran it)."""
        seed[0] += 1
        xs = make_inputs(seed[0], world, rows * HIDDEN, dt)
        before = ca.served_calls
        y = fn(xs[rank].reshape(rows, HIDDEN).to(dev))
        served = ca.served_calls - before
        want = torch.cat(xs).reshape(world * rows, HIDDEN)
        ok = tuple(y.shape) == tuple(want.shape) and bits(y.cpu()) == bits(want)
        if not ok:
            why.append(f"{what} {name} {dt} rows={rows} shape {tuple(y.shape)} took={served > 0}")
        return served, ok

    def sp_scatter_case(fn, dt, rows, what, name="sp_reduce_scatter"):
        """One reduce-scatter through ``fn`` giving ``rows`` x HIDDEN per rank, of
        ``rows * world - 1`` rows (the engine pads one row of zeros to split evenly) where
        rows > 1: (served, ok), ok when bitwise slice ``rank`` of the rank-order sum where
        tpar served it, within the fallback's rounding where not."""
        total = rows * world - (rows > 1)
        seed[0] += 1
        xs = make_inputs(seed[0], world, total * HIDDEN, dt)
        padded = [torch.nn.functional.pad(x.reshape(total, HIDDEN), (0, 0, 0, rows * world - total)) for x in xs]
        before = ca.served_calls
        y = fn(xs[rank].reshape(total, HIDDEN).to(dev))
        served = ca.served_calls - before
        mine = [p[rank * rows:(rank + 1) * rows].contiguous() for p in padded]
        ref = reference(mine, dt).reshape(rows, HIDDEN)
        ok = tuple(y.shape) == (rows, HIDDEN)
        ok = ok and (bits(y.cpu()) == bits(ref) if served else fallback_wrong(y, mine, world) == 0)
        if not ok:
            why.append(f"{what} {name} {dt} rows={total} shape {tuple(y.shape)} took={served > 0}")
        return served, ok

    def sp_compile(gather, scatter, names=("sp_all_gather", "sp_reduce_scatter")):
        """The engine's sp_all_gather and sp_reduce_scatter, each inside its own
        torch.compile(fullgraph=True) (inductor on CUDA, aot_eager on CPU; static shapes: a
        graph per dtype and row count), judged as the eager calls. Every call is within
        max_size, so every compiled call must reach tpar (its served counter grew by one per
        call), and the backend must have compiled one graph per dtype and shape (a call past
        Dynamo's recompile limit is an error under fullgraph; the count also shows the
        backend was reached). A function Dynamo cannot trace (vLLM's calls the
        communicator's Python method, and so tpar's drop-in, inside the graph) is recorded
        with Dynamo's reason and the innermost frame it stopped at, under ``untraceable``,
        and fails the stage."""
        import torch._dynamo.exc

        st = {"cases": 0, "tpar": 0, "fallback": 0, "served": 0, "wrong": 0}
        backend = "inductor" if dev.type == "cuda" else "aot_eager"
        inner = torch._dynamo.lookup_backend(backend)
        st["backend"], st["graphs"], untraceable = backend, {}, {}

        # x * 1 around the call: the collective is one op among others in the graph (exact,
        # and -0.0 keeps its sign, which + 0 would not).
        def g(x):
            return gather(x * 1) * 1

        def s(x):
            return scatter(x * 1) * 1

        for name, fn, case in ((names[0], g, sp_gather_case), (names[1], s, sp_scatter_case)):
            st["graphs"][name] = 0

            def compile_graph(gm, example_inputs, name=name):
                st["graphs"][name] += 1
                return inner(gm, example_inputs)

            cf = torch.compile(fn, backend=compile_graph, fullgraph=True, dynamic=False)
            shapes = 0
            try:
                for dname, dt in dtypes.items():
                    for rows in (1, 8):  # 8: the reduce-scatter's 8 * world - 1 rows, padded by the engine
                        shapes += 1
                        count(st, *case(cf, dt, rows, "compiled", name))
            except torch._dynamo.exc.Unsupported as e:
                # Dynamo's message ends with the user-code frames it was in: the innermost
                # (file:line, then the source line) says where tracing stopped.
                text = str(e)
                frames = text.split("from user code:")[-1].strip().splitlines()
                at = [m.groups() for m in (re.match(r'\s*File "(.*)", line (\d+), in (\S+)', ln) for ln in frames) if m]
                src = [ln.strip() for ln in frames if ln.strip() and not ln.strip().startswith(("File ", "Set "))]
                where = "/".join(at[-1][0].split("/")[-3:]) + f":{at[-1][1]} {at[-1][2]}()" if at else "?"
                untraceable[name] = {"reason": text.splitlines()[0][:200], "at": where, "code": (src[-1] if src else "?")[:160]}
                continue
            if st["graphs"][name] != shapes:
                raise RuntimeError(f"{name}: {st['graphs'][name]} compiled graphs for {shapes} dtype and shape pairs: some calls did not run a compiled graph")
            # A call tpar declines when it runs (its size above the drop-in's max_size, which
            # the trace does not read): the compiled op must run vLLM's own fallback inside it
            # (the GroupCoordinator's collective), with the same graph, and give the same
            # answer, bitwise for the all-gather; tpar's counter must not move. Not for the
            # reduce-scatter: here vLLM's own fallback for it is torch.distributed's
            # reduce_scatter_tensor on gloo, which returns uninitialised memory (eagerly too,
            # without tpar), so there is no right answer of the engine's to compare with.
            if name == names[1]:
                st["declined_reduce_scatter"] = "not judged: the engines' fallback (reduce_scatter_tensor on gloo) is wrong here without tpar"
                continue
            dt0 = next(iter(dtypes.values()))
            keep = ca.max_size
            ca.max_size = 16
            try:
                served, ok = case(cf, dt0, 1, "compiled, declined", name)
            finally:
                ca.max_size = keep
            st["declined"] = {"served": served, "ok": ok}
            if served or not ok:
                raise RuntimeError(f"{name}: a compiled call tpar declines at run time was {'served by tpar' if served else 'wrong'} (vLLM's fallback inside tpar's op)")
            if st["graphs"][name] != shapes:
                raise RuntimeError(f"{name}: the declined call compiled another graph ({st['graphs'][name]} for {shapes} shapes): the decision leaked into the trace")
        if untraceable:
            st["untraceable"] = untraceable
            said = "; ".join(f"{k} not traceable fullgraph: {v['reason']} at {v['at']}: {v['code']}" for k, v in untraceable.items())
            st["error"] = said[:700]
        elif st["tpar"] < st["cases"]:
            st["error"] = f"{st['cases'] - st['tpar']} of {st['cases']} compiled sequence-parallel calls did not reach tpar (its served counter grew by {st['served']})"
        return st

    for stage in stages:
        st = {"cases": 0, "tpar": 0, "fallback": 0, "served": 0, "wrong": 0}
        t1 = time.monotonic()
        try:
            if stage == "settings":
                st.update(eng.settings(tpar_log))
            elif stage == "eager":
                algos = set()
                for dname, dt, n, xs in cases():
                    served, ok = one(xs, dt, eng.ar, "eager")
                    count(st, served, ok)
                    if served:
                        algos.add(ca._comm.plan(xs[rank].to(dev)))
                st["algos"] = sorted(algos)
            elif stage == "compile":
                backend = "inductor" if dev.type == "cuda" else "aot_eager"

                def f(x):
                    return eng.op(x * 1) + 0  # exact: the op's input and output pass unchanged

                if eng.op_unavailable(dev):
                    raise Skip(eng.op_unavailable(dev))
                cf = torch.compile(f, backend=backend, fullgraph=True)
                for dname, dt in dtypes.items():
                    for n in (8 * HIDDEN, 4099):
                        seed[0] += 1
                        xs = make_inputs(seed[0], world, n, dt)
                        count(st, *one(xs, dt, cf, "compile"))
                st["backend"] = backend
                # Every compiled call is within max_size: the engine's op must reach tpar
                # (its served counter grew by one per call), not only run correctly.
                if st["tpar"] < st["cases"]:
                    raise RuntimeError(f"{st['cases'] - st['tpar']} of {st['cases']} compiled calls did not reach tpar (its served counter grew by {st['served']})")
            elif stage == "graph":
                if dev.type != "cuda":
                    st["skipped"] = "CUDA graphs need a GPU"
                else:
                    st.update(graph_stage(eng, ca, rank, world, dev, digest))
            elif stage == "thread":
                out = {}

                def work():
                    try:
                        for dname, dt in dtypes.items():
                            seed_ = 50_000 + len(out)
                            xs = make_inputs(seed_, world, 3 * HIDDEN, dt)
                            out[dname] = one(xs, dt, eng.ar, "thread")
                    except BaseException as e:  # noqa: BLE001 - a PanicException is a BaseException
                        out["error"] = f"{type(e).__name__}: {e}"

                th = threading.Thread(target=work, name="tpar-harness-worker")
                th.start()
                th.join(timeout=120)
                if th.is_alive():
                    out["error"] = "the worker thread's call did not return in 120 s"
                if "error" in out:
                    raise RuntimeError(out["error"])
                for dname in dtypes:
                    count(st, *out[dname])
            elif stage == "batchinv":
                # VLLM_BATCH_INVARIANT=1 (set by the caller): tpar must take every size, above
                # max_size too, through kernels that sum in rank order: bitwise the reference.
                if not ca.batch_invariant:
                    raise RuntimeError("the drop-in is not batch-invariant (is VLLM_BATCH_INVARIANT=1 set?)")
                for dname, dt in dtypes.items():
                    for tokens in (1, 8, 64, 512, 1024, 2048):
                        seed[0] += 1
                        xs = make_inputs(seed[0], world, tokens * HIDDEN, dt)
                        served, ok = one(xs, dt, eng.ar, "batchinv")
                        count(st, served, ok and served > 0)  # every size must go through tpar
                st["chunked"] = sorted({f"{k[0]}:{k[1]}B->{v}" for k, v in ca._chunks.items() if v is not None and v * k[0].itemsize < k[1]})[:8]
            elif stage in ("sp", "dp"):
                # The engine's own sequence-parallel functions (vLLM: sp_all_gather,
                # sp_reduce_scatter, which try the custom collective, then NCCL / gloo), or
                # its DP-attention gather and scatter (SGLang: dp_gather_partial,
                # dp_reduce_scatter_tensor, whose GroupCoordinator methods tpar's plug-in
                # wraps): the all-gather must be every rank's rows in rank order, bit for
                # bit, whoever ran it; a reduce-scatter tpar served must be bitwise slice
                # `rank` of the rank-order sum, the fallback's within its rounding.
                gather, scatter = eng.sp_functions() if stage == "sp" else eng.dp_functions()
                names = COLLECTIVE_NAMES[stage]
                for dname, dt in dtypes.items():
                    for rows in (1, 3, 8, 64):
                        count(st, *sp_gather_case(gather, dt, rows, "eager", names[0]))
                        count(st, *sp_scatter_case(scatter, dt, rows, "eager", names[1]))
                if stage == "dp":
                    # One all-gather above the drop-in's max_size per rank: tpar declines it
                    # and SGLang's own path (pynccl, here gloo) must give the same bits. (Not
                    # a reduce-scatter: torch's reduce_scatter_tensor on gloo, SGLang's
                    # fallback here, is wrong without tpar.)
                    big = ca.max_size // (HIDDEN * 4) + 1
                    count(st, *sp_gather_case(gather, torch.float32, big, "eager, above max_size", names[0]))
                    st["declined"] = dp_declines(eng, ca, rank, world, dev, seed)
                    bad = {k: v for k, v in st["declined"].items() if not v.get("ok")}
                    if bad:
                        raise RuntimeError(f"calls tpar must leave to SGLang's own path: {bad}")
            elif stage in ("sp_compile", "dp_compile"):
                fns = eng.sp_functions() if stage == "sp_compile" else eng.dp_functions()
                st.update(sp_compile(*fns, names=COLLECTIVE_NAMES[stage[:2]]))
                if stage == "dp_compile" and dev.type == "cpu" and "error" not in st:
                    st["cpu_engine"] = dp_cpu_engine_compile(eng, ca, rank, world, dev, seed)
                    if not st["cpu_engine"].get("ok"):
                        st["error"] = f"SGLang's CPU-engine path compiled: {st['cpu_engine']}"
            elif stage in ("sp_graph", "dp_graph"):
                gather, scatter = eng.sp_functions() if stage == "sp_graph" else eng.dp_functions()
                if dev.type != "cuda":
                    st["skipped"] = "CUDA graphs need a GPU"
                else:
                    st.update(sp_graph_stage(eng, ca, rank, world, dev, gather, scatter, COLLECTIVE_NAMES[stage[:2]]))
            elif stage == "fusion":
                # vLLM's compile stack with tpar's fusion pass on a small layer
                # (scripts/engine_fusion.py), the capability faked to --capability.
                if args.engine != "vllm":
                    raise Skip("the fusion pass stage is vLLM's")
                from engine_fusion import fusion_stage

                st.update(fusion_stage(eng, ca, rank, world, dev, args.capability))
            elif stage == "kill":

                def die():
                    rec["stages"]["kill"] = {"died_at": time.time()}
                    _write_record(args.record, rec)
                    os._exit(3)

                st.update(kill_stage(eng, ca, rank, world, dev, world_group, die))
            else:
                raise ValueError(f"unknown stage {stage}")
        except Skip as e:
            st = {"skipped": str(e)}
        except Exception as e:  # noqa: BLE001 - reported, the parent fails the run
            st["error"] = f"{type(e).__name__}: {e}"[:400]
        if why:
            st["wrong_calls"] = why[:6]
            why.clear()
        if any(fallback_bits):
            st["fallback_same_bits"], st["fallback_other_bits"] = fallback_bits
            fallback_bits[:] = [0, 0]
        st["seconds"] = round(time.monotonic() - t1, 2)
        rec["stages"][stage] = st
        if stage != "kill":
            dist.barrier(group=world_group)  # stages start together on every rank
    rec["digest"] = digest.hexdigest()
    if trace is not None:
        _finish_trace(trace, prefixes, os.path.join(args.trace, f"{args.engine}-r{rank}.json"))
    return rec


def graph_stage(eng, ca, rank, world, dev, digest):
    """Calls captured inside the engine's graph_capture() (three batch sizes, as the engines
    capture one graph per size), replayed on fresh inputs."""
    import torch

    from tpar.testing import bits, make_inputs, reference

    st = {"cases": 0, "tpar": 0, "fallback": 0, "served": 0, "wrong": 0}
    dt = torch.bfloat16
    graphs = []
    with eng.graph_capture() as ctx:
        for tokens in (1, 8, 64):
            n = tokens * HIDDEN
            xs = [torch.empty(n, dtype=dt, device=dev) for _ in range(4)]
            for x in xs:  # warm-up outside the graph, as the engines' runners do
                x.fill_(1)
                eng.ar(x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=ctx.stream):
                asked = bool(ca.should_custom_ar(xs[0]))
                before = ca.served_calls
                ys = [eng.ar(x) for x in xs]  # four dependent-free calls per graph
                served = ca.served_calls - before  # captured: counted once, at capture
            st["served"] += served
            if served not in (0, len(xs)) or (served > 0) != asked:  # recorded, not raised: the peers are capturing too
                st.setdefault("error", f"graph of {tokens} tokens: should_custom_ar={asked}, tpar served {served} of its {len(xs)} captured calls")
            graphs.append((g, xs, ys, served > 0))
    st["captured"] = len(graphs)
    for rep in range(3):
        for gi, (g, xs, ys, took) in enumerate(graphs):
            refs, inputs = [], []
            for i, x in enumerate(xs):
                a = make_inputs(70_000 + 100 * rep + 10 * gi + i, world, x.numel(), dt)
                x.copy_(a[rank])
                refs.append(reference(a, dt))
                inputs.append(a)
            for y in ys:
                y.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            for y, ref, a in zip(ys, refs, inputs):
                st["cases"] += 1
                st["tpar" if took else "fallback"] += 1
                ok = bits(y) == bits(ref) if took else fallback_wrong(y, a, world) == 0
                st["wrong"] += not ok
                if took:
                    digest.update(bits(y))
    return st



def sp_graph_stage(eng, ca, rank, world, dev, gather, scatter, names=("sp_all_gather", "sp_reduce_scatter")):
    """The engine's sequence-parallel all-gather and reduce-scatter captured inside its
    graph_capture() (a graph per row count, as the engines capture one per batch size; the
    reduce-scatter's input of rows * world - 1 rows is padded by the engine inside the graph),
    replayed on fresh inputs copied into the captured inputs, judged as the eager calls:
    the all-gather bitwise every rank's rows in rank order, the reduce-scatter bitwise slice
    ``rank`` of the rank-order sum where tpar took it at capture, within the fallback's
    rounding where not. tpar's counter must grow by one per captured call it took."""
    import torch

    from tpar.testing import bits, make_inputs, reference

    st = {"cases": 0, "tpar": 0, "fallback": 0, "served": 0, "wrong": 0, "wrong_calls": []}
    dt = torch.bfloat16
    graphs = []
    with eng.graph_capture() as ctx:
        for rows in (1, 8):
            total = rows * world - (rows > 1)
            xg = torch.empty(rows, HIDDEN, dtype=dt, device=dev)
            xs = torch.empty(total, HIDDEN, dtype=dt, device=dev)
            for x, fn in ((xg, gather), (xs, scatter)):  # warm-up outside the graph, as the engines' runners do
                x.fill_(1)
                fn(x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            took = []
            with torch.cuda.graph(g, stream=ctx.stream):
                before = ca.served_calls
                yg = gather(xg)
                took.append(ca.served_calls - before)
                before = ca.served_calls
                ys = scatter(xs)
                took.append(ca.served_calls - before)  # captured: counted once, at capture
            st["served"] += sum(took)
            if any(t not in (0, 1) for t in took):  # recorded, not raised: the peers are capturing too
                st.setdefault("error", f"graph of {rows} rows: tpar's counter grew by {took} for its all-gather and reduce-scatter")
            graphs.append((g, rows, total, xg, xs, yg, ys, [t > 0 for t in took]))
    st["captured"] = len(graphs)
    for rep in range(3):
        for gi, (g, rows, total, xg, xs, yg, ys, took) in enumerate(graphs):
            ag = make_inputs(80_000 + 100 * rep + 10 * gi, world, rows * HIDDEN, dt)
            rs = make_inputs(80_000 + 100 * rep + 10 * gi + 1, world, total * HIDDEN, dt)
            xg.copy_(ag[rank].reshape(rows, HIDDEN))
            xs.copy_(rs[rank].reshape(total, HIDDEN))
            yg.fill_(float("nan"))
            ys.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            want = torch.cat(ag).reshape(world * rows, HIDDEN)
            padded = [torch.nn.functional.pad(x.reshape(total, HIDDEN), (0, 0, 0, rows * world - total)) for x in rs]
            mine = [p[rank * rows:(rank + 1) * rows].contiguous() for p in padded]
            ok_g = tuple(yg.shape) == tuple(want.shape) and bits(yg.cpu()) == bits(want)
            ok_s = tuple(ys.shape) == (rows, HIDDEN)
            ok_s = ok_s and (bits(ys.cpu()) == bits(reference(mine, dt).reshape(rows, HIDDEN)) if took[1] else fallback_wrong(ys, mine, world) == 0)
            for name, ok, t in ((names[0], ok_g, took[0]), (names[1], ok_s, took[1])):
                st["cases"] += 1
                st["tpar" if t else "fallback"] += 1
                st["wrong"] += not ok
                if not ok and len(st["wrong_calls"]) < 6:
                    st["wrong_calls"].append(f"graph {name} {dt} rows={rows if name == names[0] else total} replay {rep} took={t}")
    if not st["wrong_calls"]:
        del st["wrong_calls"]
    return st


def dp_cpu_engine_compile(eng, ca, rank, world, dev, seed):
    """SGLang's CPU engine calls ``GroupCoordinator._all_gather_into_tensor`` in Python (no
    op), so Dynamo traces into tpar's wrap: it must trace SGLang's own path there
    (``torch.compile(fullgraph=True)`` succeeds, tpar's counter unmoved) and give every rank's
    rows in rank order, bitwise."""
    import torch
    import torch._dynamo.exc

    from tpar.testing import bits, make_inputs

    seed[0] += 1
    xs = make_inputs(seed[0], world, 8 * HIDDEN, torch.bfloat16)

    def f(x):
        out = x.new_empty((world * x.shape[0],))
        eng.tp._all_gather_into_tensor(out, x * 1)
        return out * 1

    before = ca.served_calls
    try:
        y = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=False)(xs[rank].to(dev))
    except torch._dynamo.exc.Unsupported as e:
        return {"ok": False, "untraceable": str(e).splitlines()[0][:200]}
    served = ca.served_calls - before
    ok = served == 0 and bits(y.cpu()) == bits(torch.cat(xs))
    return {"ok": ok, "served": served}


def dp_declines(eng, ca, rank, world, dev, seed):
    """Calls of SGLang's ``GroupCoordinator.all_gather_into_tensor`` / ``reduce_scatter_tensor``
    that tpar's wrap must leave to SGLang's own path (its counter unmoved, nothing raised):
    NCCL's in-place forms (the input is this rank's slice of the output, or the output this
    rank's slice of the input: tpar runs out of place) and a per-rank size that is not whole
    16-byte vectors. The all-gathers are also judged bitwise (a copy, whoever runs it)."""
    import torch

    import tpar
    from tpar.testing import bits, make_inputs

    out = {}
    rows = 2
    for name, dt, n in (("in-place all-gather", torch.bfloat16, rows * HIDDEN), ("all-gather of 3 x float16 per rank", torch.float16, 3),
                        ("in-place reduce-scatter", torch.bfloat16, rows * HIDDEN)):
        seed[0] += 1
        scatter = "reduce-scatter" in name
        xs = make_inputs(seed[0], world, n * (world if scatter else 1), dt)
        before = ca.served_calls
        try:
            if scatter:
                x = xs[rank].to(dev)
                eng.tp.reduce_scatter_tensor(x[rank * n:(rank + 1) * n], x)
                ok = True
            else:
                y = torch.full((world * n,), float("nan"), dtype=dt, device=dev)
                mine = y[rank * n:(rank + 1) * n] if name.startswith("in-place") else torch.empty(n, dtype=dt, device=dev)
                mine.copy_(xs[rank])
                eng.tp.all_gather_into_tensor(y, mine)
                ok = bits(y.cpu()) == bits(torch.cat(xs))
            served = ca.served_calls - before
            out[name] = {"served": served, "ok": ok and served == 0}
        except Exception as e:  # noqa: BLE001 - recorded
            # tpar's error: tpar took the call (a failure). Another: SGLang's own path raised
            # in this setting (gloo standing in for NCCL, which refuses ranks sharing a GPU):
            # recorded, and the call was still not tpar's.
            served = ca.served_calls - before
            out[name] = {"served": served, "raised": f"{type(e).__name__}: {e}"[:200],
                         "ok": served == 0 and not isinstance(e, tpar.TparError)}
    return out


def liveness_snapshot(world):
    """What a survivor's liveness check sees (diagnosis of a kill stage): this process's pid
    namespace, and per rank of the liveness segment (found among this process's descriptors;
    reopened through /proc, a new open file description) the lock byte's holder and the
    recorded process (pid, start time, namespace) with its /proc state. Layout: tpar's
    transport/shm.rs and transport/holder.rs."""
    import fcntl
    import struct

    out = {}
    try:
        out["ns"] = os.readlink("/proc/self/ns/pid")
        out["ns_ino"] = os.stat("/proc/self/ns/pid").st_ino
    except OSError as e:
        out["ns_error"] = repr(e)
    segs = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not link.startswith("/dev/shm/tpar-"):
            continue
        try:
            f = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        except OSError as e:
            segs.append({"link": link, "error": repr(e)})
            continue
        try:
            seg = {"link": link, "bytes": os.fstat(f).st_size, "ranks": []}
            if seg["bytes"] == 4096:
                for r in range(world):
                    b = os.pread(f, 16, 256 + 16 * r)
                    pid, start, ns = struct.unpack("<IIQ", b) if len(b) == 16 else (0, 0, 0)
                    q = struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, 0, r, 1, 0)
                    try:
                        lt = struct.unpack("hhxxxxqqixxxx", fcntl.fcntl(f, fcntl.F_OFD_GETLK, q))[0]
                        held = lt != fcntl.F_UNLCK
                    except OSError as e:
                        held = repr(e)
                    try:
                        with open(f"/proc/{pid}/stat") as fh:
                            rest = fh.read().rsplit(")", 1)[1].split()
                        now = {"state": rest[0], "start": int(rest[19]) & 0xFFFFFFFF}
                    except (OSError, IndexError, ValueError) as e:
                        now = {"error": type(e).__name__}
                    seg["ranks"].append({"rank": r, "lock_held": held, "pid": pid, "start": start, "ns": ns, "now": now})
            segs.append(seg)
        finally:
            os.close(f)
    out["segments"] = segs
    return out


def kill_stage(eng, ca, rank, world, dev, group, die):
    """The last rank dies right after a barrier; the others keep calling the engine's
    all-reduce (no check()) and must raise a tpar error within DEAD_PEER_S of the death (wall
    clocks of one host)."""
    import torch
    import torch.distributed as dist

    import tpar
    from tpar.testing import make_inputs

    xs = make_inputs(90_000, world, 8 * HIDDEN, torch.bfloat16)
    x = xs[rank].to(dev)
    if not ca.should_custom_ar(x):
        return {"error": "tpar does not take the kill stage's call (8 x 7168 bf16)"}
    eng.ar(x)
    # The survivors cycle through the all-reduce and, where the engine has them, its
    # sequence-parallel gather and scatter (one row per rank): a dead peer must be found by
    # whichever collective is in flight. Only calls tpar served before the death are cycled
    # (a call the engine sends to its own NCCL/gloo would wait on gloo's timeout, not tpar's).
    cycle = [("all_reduce", lambda: eng.ar(x))]
    gather = scatter = None
    names = COLLECTIVE_NAMES["sp"]
    for key, functions in (("sp", eng.sp_functions), ("dp", eng.dp_functions)):
        try:
            gather, scatter = functions()
            names = COLLECTIVE_NAMES[key]
            break
        except Exception:  # noqa: BLE001 - the engine has none (Skip): the next, or the all-reduce alone
            continue
    if gather is not None:
        x2 = x.reshape(8, HIDDEN)
        row = x2[:1].contiguous()
        rows = x2.repeat((world + 7) // 8, 1)[:world].contiguous()  # one row per rank
        sp = []
        for name, fn in ((names[0], lambda: gather(row)), (names[1], lambda: scatter(rows))):
            before = ca.served_calls
            fn()
            if ca.served_calls > before:
                sp.append((name, fn))
        cycle = sp + cycle  # the first call after the death is a sequence-parallel one
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid(), group=group)
    dist.barrier(group=group)
    if rank == world - 1:
        die()  # mid-step: the survivors' next all-reduce has no peer
    t0 = time.monotonic()
    gone = {}  # diagnosis: when the dead rank's process finished exiting (zombie or reaped)

    def watch(pid=pids[-1]):
        while time.monotonic() < t0 + 15 and "after_s" not in gone:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                state = "gone"
            gone.setdefault("states", []).append(state) if state not in gone.get("states", []) else None
            if state in ("Z", "X", "gone"):
                gone["after_s"] = round(time.monotonic() - t0, 3)
                if rank == 0:
                    time.sleep(0.3)  # past the watchdog's grace: what its check sees now
                    gone["liveness"] = liveness_snapshot(world)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    calls = 0
    deadline = t0 + 30
    cycled = [name for name, _ in cycle]
    while time.monotonic() < deadline:
        name, fn = cycle[calls % len(cycle)]
        try:
            fn()
            calls += 1
        except tpar.TparError as e:
            return {"raised": type(e).__name__, "message": str(e)[:300], "raised_at": time.time(), "after_s": round(time.monotonic() - t0, 3), "calls_before": calls, "raised_in": name, "cycled": cycled, "dead_process": dict(gone)}
        except BaseException as e:  # noqa: BLE001 - not tpar's error family: a failure
            return {"error": f"not a TparError from {name}: {type(e).__name__}: {e}", "after_s": round(time.monotonic() - t0, 3), "cycled": cycled}
    return {"error": f"no error in {deadline - t0:.0f} s of calls with a dead peer ({calls} calls returned)"}


# ------------------------------------------------------------------------------------------
def launch(args):
    # The rendezvous file and the ranks' records, removed once read.
    with tempfile.TemporaryDirectory(prefix=f"tpar-{args.engine}-", ignore_cleanup_errors=True) as tmp:
        return launch_in(args, tmp)


def launch_in(args, tmp):
    env = dict(os.environ)
    env.update({"TPAR_ENABLE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if args.device == "cuda":
        env.setdefault("TPAR_TOPOLOGY", "h200-nvswitch-8")
    if args.engine == "vllm":
        # NCCL refuses ranks sharing a GPU; torch symmetric memory is not under test.
        env.update({"VLLM_DISABLE_PYNCCL": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"})
        if args.device == "cpu":
            env["VLLM_TARGET_DEVICE"] = "cpu"
    procs = []
    for r in range(args.world):
        cmd = [sys.executable, os.path.abspath(__file__), args.engine, str(args.world), "--device", args.device, "--stages", args.stages,
               "--rank", str(r), "--init", os.path.join(tmp, "init"), "--record", os.path.join(tmp, f"r{r}.json"), "--capability", str(args.capability)]
        if args.trace:
            cmd += ["--trace", args.trace]
        log = open(os.path.join(args.out, f"engine-{args.engine}-w{args.world}-r{r}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    end = time.monotonic() + args.deadline
    recs = []
    for r, (p, log) in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        path = os.path.join(tmp, f"r{r}.json")
        rec = {"rank": r, "returncode": p.returncode}
        if os.path.exists(path):
            with open(path) as f:
                rec.update(json.load(f))
        elif p.returncode is None or p.returncode < 0:
            rec["error"] = "hung: killed at the deadline"
        recs.append(rec)
    return recs


def judge(args, recs):
    """(ok, lines): one summary line per stage."""
    lines, ok = [], True
    world = args.world
    survivors = recs[:-1]
    head = f"{args.label or args.engine} w{world} {args.device}"
    bad = [r for r in recs if "error" in r or not r.get("ca_is_tpar")]
    if bad:
        return False, [f"| {head} | setup | FAIL | " + "; ".join(f"rank {r['rank']}: {r.get('error', 'rc=%s' % r.get('returncode'))}" for r in bad) + " |"]
    lines.append(f"| {head} | setup | PASS | ca_comm {recs[0].get('ca_class')} on every rank; {recs[0].get('setup_s')} s |")
    for stage in args.stages.split(","):
        if stage == "kill":
            sts = [r.get("stages", {}).get("kill", {}) for r in survivors]
            died = recs[-1].get("stages", {}).get("kill", {}).get("died_at")
            for s in sts:
                if "raised_at" in s and died:
                    s["after_death_s"] = round(s["raised_at"] - died, 3)
            fine = died is not None and recs[-1].get("returncode") == 3 and all(s.get("after_death_s", 1e9) <= DEAD_PEER_S for s in sts)
            detail = "; ".join(f"r{r['rank']}: " + (f"{s['raised']} in {s.get('raised_in')} {s.get('after_death_s')} s after the death (cycling {'/'.join(s.get('cycled', []))}; its process: {s.get('dead_process')})" if "raised" in s else s.get("error", "?")) for r, s in zip(survivors, sts))
            msg = next((s.get("message") for s in sts if s.get("message")), "")
            lines.append(f"| {head} | kill | {'PASS' if fine else 'FAIL'} | {detail}; {msg[:120]!r} |")
            ok &= fine
            continue
        sts = [r.get("stages", {}).get(stage, {}) for r in recs]
        if all("skipped" in s for s in sts):
            lines.append(f"| {head} | {stage} | skipped | {sts[0]['skipped']} |")
            continue
        errors = [f"r{r['rank']}: {s.get('error', 'no record')}" for r, s in zip(recs, sts) if "error" in s or not s]
        wrong = sum(s.get("wrong", 0) for s in sts)
        fine = not errors and wrong == 0 and all(s.get("cases", 0) > 0 for s in sts)
        if stage in ("dp", "dp_graph") and not all(s.get("tpar", 0) > 0 for s in sts):
            # SGLang's gathers reach tpar only through the plug-in's wrap: none served is a
            # wrap that did not take (the results alone cannot tell: SGLang's own path is right too)
            errors.append("tpar served none of SGLang's DP-attention gathers on " + ", ".join(f"r{r['rank']}" for r, s in zip(recs, sts) if not s.get("tpar")))
            fine = False
        s0 = sts[0]
        if "checked" in s0 and not errors:
            lines.append(f"| {head} | {stage} | PASS | {json.dumps(s0['checked'])} |")
            continue
        extra = f" algos {','.join(s0.get('algos', []))}" if s0.get("algos") else ""
        if stage in ("sp_compile", "dp_compile"):
            extra += f"; {s0.get('backend')} graphs {json.dumps(s0.get('graphs'))}"
        if stage in ("sp_graph", "dp_graph"):
            extra += f"; {s0.get('captured')} graphs captured, replayed 3 times"
        extra += "".join(f"; r{r['rank']} wrong: " + " / ".join(s["wrong_calls"]) for r, s in zip(recs, sts) if s.get("wrong_calls"))[:900]
        if "fusion_routed" in s0:
            forms = ",".join(f"{k}:{v.get('tpar_ops')}op/{v.get('fused_calls')}fused{'' if v.get('ok') else '(WRONG)'}" for k, v in s0.get("forms", {}).items())
            extra += f"; sm_{s0.get('capability')} fusion_routed {s0['fusion_routed']} (tpar's fused calls, rank 0), max_token_num {s0.get('max_token_num')}; {forms}"
        served = "/".join(str(s.get("served", "?")) for s in sts)
        detail = "; ".join(errors) if errors else f"{s0.get('cases')} calls a rank, {s0.get('tpar')} served by tpar (its counter, ranks {served}), {s0.get('fallback')} fallback, {wrong} wrong{extra}"
        lines.append(f"| {head} | {stage} | {'PASS' if fine else 'FAIL'} | {detail} |")
        ok &= fine
    digests = {r.get("digest") for r in (survivors if "kill" in args.stages else recs)}
    if len(digests) != 1:
        lines.append(f"| {head} | ranks identical | FAIL | {len(digests)} different digests of tpar's outputs |")
        ok = False
    return ok, lines


def _write_record(path, rec):
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".tmp", path)


def matrix(path):
    """The summary lines of several runs (``| run | stage | result | detail |``), then one
    row per run: each stage's result, the kill stage's slowest detection after the death."""

    with open(path) as f:
        lines = [ln.rstrip("\n") for ln in f if ln.startswith("| ")]
    rows, stages = {}, []
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split(" | ")]
        if len(cells) < 4 or cells[2] not in ("PASS", "FAIL", "skipped"):
            continue
        run, stage, result, detail = cells[0], cells[1], cells[2], " | ".join(cells[3:])
        if stage not in stages:
            stages.append(stage)
        if stage == "kill":
            times = [float(t) for t in re.findall(r"([0-9.]+) s after the death", detail)]
            result += f" {max(times):.2f} s" if times else ""
        rows.setdefault(run, {})[stage] = "skip" if result == "skipped" else result
    order = ["setup", *STAGES, "batchinv", "fusion"]
    stages.sort(key=lambda st: order.index(st) if st in order else len(order))
    data = [ln for ln in lines if not ln.startswith("| run |")]
    print("| run | stage | result | detail |\n|---|---|---|---|\n" + "\n".join(data))
    print()
    print("| run | " + " | ".join(stages) + " | result |")
    print("|---" * (len(stages) + 2) + "|")
    for run, cells in rows.items():
        ok = not any(v.startswith("FAIL") for v in cells.values())
        print(f"| {run} | " + " | ".join(cells.get(s, "-") for s in stages) + f" | {'PASS' if ok else 'FAIL'} |")
    print()
    print("kill: the slowest survivor's error after the death (wall clock; the bound is %.1f s)" % DEAD_PEER_S)


def main():
    if sys.argv[1:2] == ["--matrix"]:
        matrix(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=("vllm", "sglang"))
    ap.add_argument("--label", help="the run's name in the summary (default: ENGINE)")
    ap.add_argument("world", type=int)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--trace", help="write the files each rank loaded under this directory (scripts/engine_carry.py)")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("DEADLINE_S", "600")))
    ap.add_argument("--capability", type=int, default=int(os.environ.get("FUSION_CAPABILITY", "120")), help="the compute capability vLLM sees in the fusion stage (120: sm_120, 90: sm_90)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--record", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        try:
            rec = rank_main(args)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            import traceback

            traceback.print_exc()
            rec = {"rank": args.rank, "error": f"{type(e).__name__}: {e}"[:400]}
        _write_record(args.record, rec)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # peers may be dead (kill stage): skip the engines' and tpar's teardown
    os.makedirs(args.out, exist_ok=True)
    recs = launch(args)
    with open(os.path.join(args.out, f"engine-{args.engine}-w{args.world}-{args.device}.json"), "w") as f:
        json.dump(recs, f, indent=1)
    ok, lines = judge(args, recs)
    with open(os.path.join(args.out, "engine-summary.md"), "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"RESULT {args.engine} world={args.world} device={args.device} -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
