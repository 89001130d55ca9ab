#!/usr/bin/env python3
"""tpar.torch on one GPU shared by N rank processes (scripts/gpu-python.sh runs it).

    python3 scripts/gpu_python_check.py WORLD STAGE [--out DIR]

STAGE: `correct` (eager calls, every dtype and size class, in and out of place; then a
122-call step captured with torch.cuda.graph, replayed with fresh inputs interleaved with eager
calls, inside ``comm.capture()``), `gmismatch` (one rank captures another dtype: every rank
must raise MismatchError when the capture block ends), `dead` (the last rank dies; the others must raise within the timeout),
`deadeager` / `deadsync` (the last rank dies mid-step; the others, never calling check(), must
raise PeerDiedError naming it within 1 s of the death, also when blocked in a host
synchronisation), `thread` (a call from a worker thread, bitwise right), `cost` (host
time of an eager call through tpar.torch and through the raw binding, and per-call time of a
graph replay). Ranks: processes with a gloo group for torch's own collectives (NCCL refuses
two ranks on one GPU); tpar's kernels forced with TPAR_ALGO, planned on a preset topology
(TPAR_TOPOLOGY), since one GPU's own topology has no peers. Inputs are fresh random values
(never zero), outputs poisoned with NaN; every output is compared bitwise with the rank-order
float32 sum rounded once, and ranks' outputs with each other (digests).
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

def rank_main(stage, rank, world, out):
    import torch
    import torch.distributed as dist

    import tpar
    import tpar.torch as tt
    from tpar.testing import INT_VIEW as INT, bits, make_inputs, reference

    dist.init_process_group("gloo", init_method="file://" + os.environ["INIT_FILE"], rank=rank, world_size=world)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    t0 = time.monotonic()
    comm = tt.Communicator(device=dev, max_bytes=8 << 20)
    rec = {"rank": rank, "init_s": time.monotonic() - t0, "algo_env": os.environ.get("TPAR_ALGO")}
    h = hashlib.sha256()
    if stage == "correct":
        wrong = cases = 0
        algos = set()
        sizes = [1, 7, 129, 4099, 21504, 65537, 1 << 20, (8 << 20) // 4 - 5]  # elements; up to the workspace
        seed = 100
        for dname, dt in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            for n in sizes:
                if n * dt.itemsize > 8 << 20:
                    continue
                for mode in ("out", "inplace"):
                    seed += 1
                    xs = make_inputs(seed, world, n, dt)
                    ref = reference(xs, dt)
                    x = xs[rank].to(dev)
                    if mode == "out":
                        o = torch.full((n,), float("nan"), dtype=dt, device=dev)
                        comm.all_reduce(x, out=o)
                    else:
                        o = comm.all_reduce_(x)
                    comm.check()
                    algos.add(comm.plan(x))
                    if bits(o) != bits(ref):
                        wrong += int((o.cpu().view(INT[dt]) != ref.view(INT[dt])).sum())
                    h.update(bits(o))
                    cases += 1
        rec.update(eager_cases=cases, eager_wrong=wrong, algos=sorted(algos))
        # A verify step: 122 all-reduces of 42 KiB (bf16), captured once, replayed with fresh
        # inputs, eager calls of other sizes in between.
        calls, n, dt = 122, 21504, torch.bfloat16
        ins = [torch.empty(n, dtype=dt, device=dev) for _ in range(calls)]
        outs = [torch.empty(n, dtype=dt, device=dev) for _ in range(calls)]
        for i in range(calls):  # warm-up (and the same calls on every rank)
            ins[i].fill_(1.0)
        g = torch.cuda.CUDAGraph()
        with comm.capture():  # checked capture: no per-call descriptors, sequences compared at the end
            with torch.cuda.graph(g):
                graph_algo = comm.plan(ins[0])
                for i in range(calls):
                    comm.all_reduce(ins[i], out=outs[i])
        rec["captured_calls"] = comm.captured_calls
        gwrong = 0
        replays = max(5, 40 // world)  # every call waits for the GPU's time slices of all ranks
        for rep in range(replays):
            refs = []
            for i in range(calls):
                xs = make_inputs(10_000 + rep * calls + i, world, n, dt)
                ins[i].copy_(xs[rank])
                outs[i].fill_(float("nan"))
                refs.append(reference(xs, dt))
            g.replay()
            e = make_inputs(50_000 + rep, world, 3001 + rep, torch.float16)
            eo = comm.all_reduce(e[rank].to(dev))
            comm.check()
            if bits(eo) != bits(reference(e, torch.float16)):
                gwrong += 1
            for i in range(calls):
                if bits(outs[i]) != bits(refs[i]):
                    gwrong += int((outs[i].cpu().view(torch.int16) != refs[i].view(torch.int16)).sum())
                h.update(bits(outs[i]))
        rec.update(graph_calls=calls * replays, graph_wrong=gwrong, graph_algo=graph_algo, digest=h.hexdigest())
    elif stage == "collectives":
        # all_gather_into_tensor and reduce_scatter_tensor on CUDA tensors: every dtype, per-rank
        # sizes of whole 16-byte vectors (others are NCCL's, which ranks sharing a GPU lack),
        # outputs poisoned; then 16 of each captured in one graph and replayed on fresh inputs.
        wrong = cases = 0
        seed = 7000
        for dname, dt in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            vec = 16 // dt.itemsize
            for n in (vec, 17 * vec, 1024, 21504, (1 << 20) // world // dt.itemsize // vec * vec):
                seed += 1
                xs = make_inputs(seed, world, n, dt)
                o = torch.full((world * n,), float("nan"), dtype=dt, device=dev)
                comm.all_gather_into_tensor(o, xs[rank].to(dev))
                want = torch.cat(xs)
                wrong += int((o.cpu().view(INT[dt]) != want.view(INT[dt])).sum())
                big = make_inputs(seed + 500, world, world * n, dt)
                p_ = torch.full((n,), float("nan"), dtype=dt, device=dev)
                comm.reduce_scatter_tensor(p_, big[rank].to(dev))
                want = reference(big, dt)[rank * n:(rank + 1) * n]
                wrong += int((p_.cpu().view(INT[dt]) != want.view(INT[dt])).sum())
                comm.check()
                h.update(bits(o))
                cases += 2
        n, dt, k = 21504 // world // 8 * 8, torch.bfloat16, 16
        gin = [torch.empty(n, dtype=dt, device=dev) for _ in range(k)]
        gout = [torch.empty(world * n, dtype=dt, device=dev) for _ in range(k)]
        rin = [torch.empty(world * n, dtype=dt, device=dev) for _ in range(k)]
        rout = [torch.empty(n, dtype=dt, device=dev) for _ in range(k)]
        for t in gin + rin:
            t.fill_(1.0)
        g = torch.cuda.CUDAGraph()
        with comm.capture():
            with torch.cuda.graph(g):
                for i in range(k):
                    comm.all_gather_into_tensor(gout[i], gin[i])
                    comm.reduce_scatter_tensor(rout[i], rin[i])
        gwrong = 0
        for rep in range(3):
            refs = []
            for i in range(k):
                a = make_inputs(90_000 + rep * k + i, world, n, dt)
                b = make_inputs(95_000 + rep * k + i, world, world * n, dt)
                gin[i].copy_(a[rank])
                rin[i].copy_(b[rank])
                gout[i].fill_(float("nan"))
                rout[i].fill_(float("nan"))
                refs.append((torch.cat(a), reference(b, dt)[rank * n:(rank + 1) * n]))
            g.replay()
            torch.cuda.synchronize()
            comm.check()
            for i in range(k):
                gwrong += int((gout[i].cpu().view(torch.int16) != refs[i][0].view(torch.int16)).sum())
                gwrong += int((rout[i].cpu().view(torch.int16) != refs[i][1].view(torch.int16)).sum())
                h.update(bits(gout[i]))
        rec.update(cases=cases, wrong=wrong, graph_calls=2 * k * 3, graph_wrong=gwrong, captured_calls=comm.captured_calls,
                   served=comm.served_calls, plan=comm.plan_collective("all-gather", gin[0]), digest=h.hexdigest())
    elif stage == "gmismatch":
        # The last rank captures bfloat16 at call 5 of 8 where the others capture float16
        # (same bytes): every rank must raise MismatchError when the capture block ends.
        n = 21504
        xs = {dt: torch.ones(n, dtype=dt, device=dev) for dt in (torch.float16, torch.bfloat16)}
        comm.all_reduce(xs[torch.float16])
        comm.check()
        g = torch.cuda.CUDAGraph()
        t1 = time.monotonic()
        try:
            with comm.capture():
                with torch.cuda.graph(g):
                    for k in range(8):
                        dt = torch.bfloat16 if (k == 5 and rank == world - 1) else torch.float16
                        comm.all_reduce(xs[dt])
            rec["error"] = None
        except tpar.TparError as e:
            rec.update(error=type(e).__name__, message=str(e), seconds=time.monotonic() - t1)
        try:
            comm.all_reduce(xs[torch.float16])
            comm.check()
            rec["after"] = None
        except tpar.TparError as e:
            rec["after"] = type(e).__name__
        comm.close()
        rec["ok"] = True
        with open(out, "w") as f:
            json.dump(rec, f)
        os._exit(0)
    elif stage == "dead":
        x = torch.ones(21504, dtype=torch.bfloat16, device=dev)
        comm.all_reduce(x)
        comm.check()
        dist.barrier()
        if rank == world - 1:
            os._exit(3)
        time.sleep(0.3)
        t1 = time.monotonic()
        try:
            for _ in range(3):
                comm.all_reduce(x)
                comm.check()
            rec["error"] = None
        except tpar.TparError as e:
            rec.update(error=type(e).__name__, message=str(e), seconds=time.monotonic() - t1)
        t1 = time.monotonic()
        comm.close()  # after an error: must neither raise nor wait past the timeout
        rec["close_s"] = time.monotonic() - t1
    elif stage in ("deadeager", "deadsync"):
        # The last rank dies in the middle of a step; the others keep calling eagerly and
        # never call check(): the next call must raise PeerDiedError naming it within 1 s of
        # the death (the liveness watchdog). deadsync: the survivors are blocked in a host
        # synchronisation (as an engine is when it samples) when the peer dies; the watchdog
        # must end their calls in flight so the synchronisation returns, and the next call
        # raises.
        x = torch.ones(21504, dtype=torch.bfloat16, device=dev)
        comm.all_reduce(x)
        comm.check()
        dist.barrier()
        stamp = os.path.join(os.path.dirname(os.environ["INIT_FILE"]), "death")
        if rank == world - 1:
            for _ in range(20):
                comm.all_reduce(x)
            torch.cuda.synchronize()
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
            os._exit(3)
        err = None
        t_sync = None
        try:
            for _ in range(5000):
                comm.all_reduce(x)
                if stage == "deadsync" and t_sync is None and os.path.exists(stamp):
                    t0 = time.time()
                    torch.cuda.synchronize()
                    t_sync = time.time() - t0
                time.sleep(0.0005)
        except tpar.TparError as e:
            err = e
        t_err = time.time()
        died = float(open(stamp).read()) if os.path.exists(stamp) else None
        rec.update(error=type(err).__name__ if err else None, message=str(err) if err else None,
                   seconds=(t_err - died) if died else -1.0, sync_s=t_sync,
                   names_peer=bool(err) and f"rank {world - 1}" in str(err))
        comm.close()
    elif stage == "thread":
        # A call from a worker thread (vLLM's dual-batch overlap runs the forward pass in
        # threads): bitwise right, no exception, then back on the main thread.
        import threading

        n = 21504
        seed = 7
        xs = make_inputs(seed, world, n, torch.bfloat16)
        ref = reference(xs, torch.bfloat16)
        outs, errs = {}, []

        def work(tag):
            try:
                torch.cuda.set_device(0)
                y = comm.all_reduce(xs[rank].to(dev))
                comm.check()
                outs[tag] = bits(y)
            except BaseException as e:  # noqa: BLE001 - the test reports any failure
                errs.append(f"{type(e).__name__}: {e}")

        t = threading.Thread(target=work, args=("thread",))
        t.start()
        t.join()
        work("main")
        rec.update(thread_ok=outs.get("thread") == bits(ref), main_ok=outs.get("main") == bits(ref), errors=errs)
        comm.close()
    elif stage == "cost":
        n, dt = 21504, torch.bfloat16
        x = torch.randn(n, device=dev).to(dt)
        o = torch.empty_like(x)
        stream = torch.cuda.current_stream().cuda_stream
        raw = comm._native
        K = 300  # below the launch queue's depth: the GPU time-slices between the ranks' contexts
        res = {}
        # "torch": tpar.torch's call (its native call checks for a dead peer or a recorded
        # error first); "raw": the native binding alone.
        for label in ("torch", "raw"):
            for _ in range(50):
                comm.all_reduce(x, out=o)
            torch.cuda.synchronize()
            dist.barrier()
            t1 = time.perf_counter()
            if label == "raw":
                xp, op = x.data_ptr(), o.data_ptr()
                for _ in range(K):
                    raw.all_reduce(stream, "bfloat16", n, xp, op, False, False)
            else:
                for _ in range(K):
                    comm.all_reduce(x, out=o)
            host = time.perf_counter() - t1
            torch.cuda.synchronize()
            wall = time.perf_counter() - t1
            res[label] = {"host_us_per_call": host / K * 1e6, "wall_us_per_call": wall / K * 1e6}
            comm.check()
        calls = 122
        outs = [torch.empty_like(x) for _ in range(calls)]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                comm.all_reduce(x, out=outs[i])
        g.replay()
        torch.cuda.synchronize()
        dist.barrier()
        R = 5
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t1 = time.perf_counter()
        for _ in range(R):
            g.replay()
        host = time.perf_counter() - t1
        end.record()
        torch.cuda.synchronize()
        res["graph"] = {"host_us_per_call": host * 1e6 / (R * calls), "gpu_us_per_call": start.elapsed_time(end) * 1e3 / (R * calls)}
        comm.check()
        rec["cost"] = res
    if stage != "dead":
        comm.close()
    rec["ok"] = True
    with open(out, "w") as f:
        json.dump(rec, f)
    os._exit(0)


def launch(world, stage, outdir, deadline):
    tmp = tempfile.mkdtemp(prefix="tpar-gpu-")
    procs = []
    for r in range(world):
        env = dict(os.environ, INIT_FILE=os.path.join(tmp, "init"), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", stage, str(r), str(world), os.path.join(tmp, f"r{r}.json")], env=env))
    end = time.monotonic() + deadline
    recs = []
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            recs.append({"rank": r, "hung": True})
            continue
        path = os.path.join(tmp, f"r{r}.json")
        recs.append(json.load(open(path)) if os.path.exists(path) else {"rank": r, "returncode": p.returncode})
    with open(os.path.join(outdir, f"{stage}-w{world}-{os.environ.get('TPAR_ALGO', 'auto')}.json"), "w") as f:
        json.dump(recs, f, indent=1)
    return recs


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    world, stage = int(sys.argv[1]), sys.argv[2]
    outdir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    recs = launch(world, stage, outdir, deadline=float(os.environ.get("DEADLINE_S", "150")))
    print(json.dumps(recs))
    if stage == "correct":
        ok = all(r.get("ok") for r in recs) and len({r.get("digest") for r in recs}) == 1
        ok = ok and all(r["eager_wrong"] == 0 and r["graph_wrong"] == 0 for r in recs)
        r0 = recs[0] if recs[0].get("ok") else {}
        print(f"RESULT correct world={world} algo={os.environ.get('TPAR_ALGO')} eager_cases={r0.get('eager_cases')} "
              f"eager_wrong={sum(r.get('eager_wrong', -1) for r in recs)} graph_calls={r0.get('graph_calls')} "
              f"graph_wrong={sum(r.get('graph_wrong', -1) for r in recs)} graph_algo={r0.get('graph_algo')} "
              f"captured={r0.get('captured_calls')} ranks_identical={len({r.get('digest') for r in recs}) == 1} init_s={r0.get('init_s', 0):.2f} -> {'PASS' if ok else 'FAIL'}")
    elif stage == "collectives":
        ok = all(r.get("ok") for r in recs) and len({r.get("digest") for r in recs}) == 1
        ok = ok and all(r["wrong"] == 0 and r["graph_wrong"] == 0 and r["served"] >= r["cases"] for r in recs)
        r0 = recs[0] if recs[0].get("ok") else {}
        print(f"RESULT collectives world={world} cases={r0.get('cases')} wrong={sum(r.get('wrong', -1) for r in recs)} "
              f"graph_calls={r0.get('graph_calls')} graph_wrong={sum(r.get('graph_wrong', -1) for r in recs)} captured={r0.get('captured_calls')} "
              f"served={r0.get('served')} plan={r0.get('plan')} ranks_identical={len({r.get('digest') for r in recs}) == 1} -> {'PASS' if ok else 'FAIL'}")
    elif stage == "dead":
        others = recs[:-1]
        ok = all(r.get("error") in ("PeerDiedError", "TparTimeoutError", "AbortedError", "PoisonedError") for r in others)
        print(f"RESULT dead world={world} " + " ".join(f"rank{r['rank']}={r.get('error')}@{r.get('seconds', -1):.2f}s" for r in others)
              + f" msg0={others[0].get('message')!r} -> {'PASS' if ok else 'FAIL'}")
    elif stage in ("deadeager", "deadsync"):
        others = recs[:-1]
        ok = all(r.get("error") == "PeerDiedError" and r.get("names_peer") and 0 <= r.get("seconds", -1) < 1.0 for r in others)
        if stage == "deadsync":
            ok = ok and all(r.get("sync_s") is not None and r["sync_s"] < 1.0 for r in others)
        print(f"RESULT {stage} world={world} " + " ".join(f"rank{r['rank']}={r.get('error')}@{r.get('seconds', -1):.3f}s sync={r.get('sync_s')}" for r in others)
              + f" msg0={others[0].get('message')!r} -> {'PASS' if ok else 'FAIL'}")
    elif stage == "thread":
        ok = all(r.get("thread_ok") and r.get("main_ok") and not r.get("errors") for r in recs)
        print(f"RESULT thread world={world} " + " ".join(f"rank{r['rank']}={r.get('thread_ok')}/{r.get('main_ok')}{r.get('errors') or ''}" for r in recs)
              + f" -> {'PASS' if ok else 'FAIL'}")
    elif stage == "gmismatch":
        ok = all(r.get("error") == "MismatchError" and r.get("after") is not None for r in recs)
        print(f"RESULT gmismatch world={world} " + " ".join(f"rank{r['rank']}={r.get('error')}/{r.get('after')}" for r in recs)
              + f" msg0={recs[0].get('message')!r} -> {'PASS' if ok else 'FAIL'}")
    else:
        c = recs[0].get("cost", {})
        ok = bool(c)
        print(f"RESULT cost world={world} " + json.dumps(c))
    # A FAIL is the exit status too: a step that runs this script passes only on PASS.
    sys.exit(0 if ok else 1)
