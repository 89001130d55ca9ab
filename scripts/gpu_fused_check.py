#!/usr/bin/env python3
"""tpar.torch's fused all-reduce + residual add + RMSNorm on one GPU shared by N rank
processes (scripts/gpu-fused.sh runs it). Correctness only: processes sharing a GPU are
time-sliced, their timings mean nothing.

    python3 scripts/gpu_fused_check.py WORLD [--out DIR]

Each rank: eager calls of several shapes (fused-kernel shapes, and shapes the unfused path
takes: rows of 2880, 65 rows) in every dtype, four forms (new tensors, vLLM's in-place form,
the custom op, the norm apart with the updated residual into x as vLLM's fusion pass asks),
then fused calls captured in a CUDA graph inside ``comm.capture()`` (beside
plain all-reduces), replayed with fresh inputs. Every output bit for bit against
``tpar.testing.reference_add_rmsnorm`` (or ``reference`` for the plain calls), outputs
poisoned first, the ranks' digests compared. Ranks: processes with a gloo group; tpar's
kernels forced with TPAR_ALGO and planned on a preset topology (TPAR_TOPOLOGY).
The family (``comm.all_reduce_rmsnorm``: no residual, the Gemma offset, the static FP8 e4m3
output, and their combinations) at hidden 4096/5120/7168/8192 and rows 1/3/8/16/32, bf16 and
fp16, eager, and every pattern captured in one CUDA graph and replayed, bit for bit against
``tpar.testing.reference_rmsnorm``; the NVFP4 output (``nvfp4_scale``: codes and the whole
swizzled scale tensor, poisoned first) at hidden 2880/7168 and rows 1/3/33 in every
dtype, eager, and both residual forms captured; then vLLM's fused all-reduce + RMSNorm op as
tpar routes it (``tpar.engines.fusion.vllm_fused_allreduce_norm``, every form its pass emits,
NVFP4 included), counted with the family.
EXPECT_PATH=fused: the 1 x 7168 call must take the algorithm's fused kernel; =unfused: every
call the all-reduce followed by the add-RMSNorm kernel (TPAR_FUSED's rule, or =0).
EXPECT_GRAPH_ROUTES="1x7168=fused:oneshot-pull,...": the routes captured bf16 calls of those
shapes take ("path:algorithm", printed as graph_routes), e.g. the plan's own fused pick at 8
NVLink ranks without TPAR_ALGO.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = [(1, 7168), (3, 7168), (8, 7168), (5, 4096), (2, 8192), (64, 1024), (1, 16384), (1, 2880), (65, 1024)]


def rank_main(rank, world, out):
    import torch
    import torch.distributed as dist

    import tpar.torch as tt
    from tpar.testing import bits, make_fused_inputs, make_inputs, reference, reference_add_rmsnorm

    dist.init_process_group("gloo", init_method="file://" + os.environ["INIT_FILE"], rank=rank, world_size=world)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    comm = tt.Communicator(device=dev, max_bytes=8 << 20)
    h = hashlib.sha256()
    rec = {"rank": rank, "algo_env": os.environ.get("TPAR_ALGO"), "transport_env": os.environ.get("TPAR_TRANSPORT")}
    wrong, cases, paths, failures = 0, 0, {}, []
    eps = 1e-6
    seed = 500
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for rows, hidden in SHAPES:
            if dt == torch.float32 and rows * hidden > 8 * 7168:
                continue  # f32 at the shapes the engines use it least: a few suffice
            seed += 1
            xs, res, w = make_fused_inputs(seed, world, rows, hidden, dt)
            want_o, want_r = reference_add_rmsnorm(xs, res, w, eps)
            x, r, wd = xs[rank].to(dev), res.to(dev), w.to(dev)
            path = comm.fused_path(x, hidden)
            paths[f"{rows}x{hidden}"] = path
            forms = {}
            o = torch.full_like(x, float("nan"))
            ro = torch.full_like(r, float("nan"))
            comm.all_reduce_add_rmsnorm(x, r, wd, eps, out=o, residual_out=ro)
            comm.check()
            forms["out"] = (o, ro)
            xi, ri = x.clone(), r.clone()
            comm.all_reduce_add_rmsnorm_(xi, ri, wd, eps)
            comm.check()
            forms["inplace"] = (xi, ri)
            forms["op"] = torch.ops.tpar.all_reduce_add_rmsnorm(x, r, wd, eps, comm.handle)
            comm.check()
            # vLLM's fusion pass with a separate norm output: the updated residual into x.
            xa, na = x.clone(), torch.full_like(x, float("nan"))
            comm.all_reduce_add_rmsnorm(xa, r, wd, eps, out=na, residual_out=xa)
            comm.check()
            forms["norm_apart"] = (na, xa)
            for form, (go, gr) in forms.items():
                bad = (bits(go) != bits(want_o)) + (bits(gr) != bits(want_r))
                if bad:
                    wrong += bad
                    failures.append(f"{dt} {rows}x{hidden} {form} ({path})")
                cases += 1
            if bits(x) != bits(xs[rank].to(dev)) or bits(r) != bits(res.to(dev)):
                wrong += 1
                failures.append(f"{dt} {rows}x{hidden}: an out-of-place call changed its inputs")
            h.update(bits(o) + bits(ro))
    rec.update(eager_cases=cases, eager_wrong=wrong, paths=paths)
    # The family: every pattern but the plain residual one (covered above).
    from tpar.testing import reference_rmsnorm

    fcases = fwrong = 0
    scale = torch.tensor([0.004], dtype=torch.float32)
    for dt in (torch.bfloat16, torch.float16):
        for hidden in (4096, 5120, 7168, 8192):
            for rows in (1, 3, 8, 16, 32):
                seed += 1
                xs, res, w = make_fused_inputs(seed, world, rows, hidden, dt)
                x, wd = xs[rank].to(dev), w.to(dev)
                for residual in (True, False):
                    for gemma in (False, True):
                        for fp8 in (False, True):
                            if residual and not gemma and not fp8:
                                continue
                            r = res.to(dev) if residual else None
                            want_o, want_r = reference_rmsnorm(xs, w, eps, residual=res if residual else None, gemma=gemma, fp8_scale=scale if fp8 else None)
                            o, ro = comm.all_reduce_rmsnorm(x, wd, eps, residual=r, gemma=gemma, fp8_scale=scale.to(dev) if fp8 else None)
                            comm.check()
                            bad = (bits(o) != bits(want_o)) + ((ro is None) != (want_r is None)) + (ro is not None and bits(ro) != bits(want_r))
                            if bad:
                                fwrong += bad
                                failures.append(f"family {dt} {rows}x{hidden} residual={residual} gemma={gemma} fp8={fp8}")
                            h.update(bits(o))
                            fcases += 1
    # NVFP4 (eager): codes, the whole swizzled scale tensor (poisoned first: the padding must
    # come back 0) and the residual, bit for bit tpar.testing; hidden 2880 runs the unfused
    # path (not whole tiles), 33 rows a partial 128-row scale tile.
    gs4 = torch.tensor([448.0 * 6.0 / 4.5], dtype=torch.float32)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for hidden in (2880, 7168):
            for rows in (1, 3, 33):
                seed += 1
                xs, res, w = make_fused_inputs(seed, world, rows, hidden, dt)
                x, wd = xs[rank].to(dev), w.to(dev)
                for residual in (True, False):
                    for gemma in (False, True):
                        r = res.to(dev) if residual else None
                        (wq, wsf), want_r = reference_rmsnorm(xs, w, eps, residual=res if residual else None, gemma=gemma, nvfp4_scale=gs4)
                        sf = torch.full(tuple(wsf.shape), 0x7FA57FA5, dtype=torch.int32, device=dev)
                        q, sf, ro = comm.all_reduce_rmsnorm(x, wd, eps, residual=r, gemma=gemma, nvfp4_scale=gs4.to(dev), scale_out=sf)
                        comm.check()
                        bad = (bits(q) != bits(wq)) + (not torch.equal(sf.cpu(), wsf)) + ((ro is None) != (want_r is None)) + (ro is not None and bits(ro) != bits(want_r))
                        if bad:
                            fwrong += bad
                            failures.append(f"nvfp4 {dt} {rows}x{hidden} residual={residual} gemma={gemma}")
                        h.update(bits(q) + bits(sf))
                        fcases += 1
    # The family captured: every pattern at 3 x 7168 bf16 in one graph, replayed with fresh
    # inputs copied into the captured buffers.
    pats = [(rs, gm, f8) for rs in (True, False) for gm in (False, True) for f8 in (False, True) if not (rs and not gm and not f8)]
    fx = [torch.ones(3, 7168, dtype=torch.bfloat16, device=dev) for _ in pats]
    fr = [torch.ones(3, 7168, dtype=torch.bfloat16, device=dev) for _ in pats]
    fw = torch.ones(7168, dtype=torch.bfloat16, device=dev)
    fs = scale.to(dev)
    for k, (rs, gm, f8) in enumerate(pats):  # warm-up
        comm.all_reduce_rmsnorm(fx[k], fw, eps, residual=fr[k] if rs else None, gemma=gm, fp8_scale=fs if f8 else None)
    comm.check()
    g4 = gs4.to(dev)
    for rs in (True, False):  # warm-up of the NVFP4 patterns captured below
        comm.all_reduce_rmsnorm(fx[0], fw, eps, residual=fr[0] if rs else None, nvfp4_scale=g4)
    comm.check()
    fg = torch.cuda.CUDAGraph()
    with comm.capture():
        with torch.cuda.graph(fg):
            fouts = [comm.all_reduce_rmsnorm(fx[k], fw, eps, residual=fr[k] if rs else None, gemma=gm, fp8_scale=fs if f8 else None) for k, (rs, gm, f8) in enumerate(pats)]
            f4 = [comm.all_reduce_rmsnorm(fx[k], fw, eps, residual=fr[k] if rs else None, nvfp4_scale=g4) for k, rs in ((0, True), (1, False))]
    xs, res, w = make_fused_inputs(77000, world, 3, 7168, torch.bfloat16)
    fw.copy_(w)
    for k in range(len(pats)):
        fx[k].copy_(xs[rank])
        fr[k].copy_(res)
    fg.replay()
    comm.check()
    for k, (rs, gm, f8) in enumerate(pats):
        want_o, want_r = reference_rmsnorm(xs, w, eps, residual=res if rs else None, gemma=gm, fp8_scale=scale if f8 else None)
        o, ro = fouts[k]
        bad = (bits(o) != bits(want_o)) + (ro is not None and bits(ro) != bits(want_r))
        if bad:
            fwrong += bad
            failures.append(f"family graph residual={rs} gemma={gm} fp8={f8}")
        fcases += 1
    for k, rs in ((0, True), (1, False)):  # fx[0], fx[1]: the first two patterns' inputs, as captured
        (wq, wsf), want_r = reference_rmsnorm(xs, w, eps, residual=res if rs else None, nvfp4_scale=gs4)
        q, sf, ro = f4[k]
        bad = (bits(q) != bits(wq)) + (not torch.equal(sf.cpu(), wsf)) + (ro is not None and bits(ro) != bits(want_r))
        if bad:
            fwrong += bad
            failures.append(f"nvfp4 graph residual={rs}")
        fcases += 1
    # The engines' emitted call routed (python/tpar/engines/fusion.py): vLLM's
    # flashinfer_trtllm_fused_allreduce_norm in every form its pass emits but NVFP4 (with and
    # without a residual, plain and Gemma, bf16 and static FP8 output), tpar's drop-in as the
    # group's custom all-reduce, outputs poisoned; a call handed to the original is wrong here.
    from tpar.engines import TparCustomAllreduce, fusion

    ca = TparCustomAllreduce(group=dist.group.WORLD, device=dev)
    fusion._vllm["code"], fusion._vllm["fp8_code"], fusion._vllm["fp4_code"] = 1, 2, 3  # FlashInfer's kARResidualRMSNorm, ...FP8Quant, ...FP4Quant
    handed = []
    fusion._vllm["original"] = lambda *a, **k: handed.append(a[8])
    for rows, hidden in ((1, 7168), (3, 4096), (16, 8192)):
        seed += 1
        xs, res, w = make_fused_inputs(seed, world, rows, hidden, torch.bfloat16)
        wd, sd = w.to(dev), scale.to(dev)
        for with_res in (True, False):
            for wbias in (0.0, 1.0):
                for fp8 in (False, True):
                    r0 = res if with_res else torch.zeros_like(res)
                    want_o, want_r = reference_rmsnorm(xs, w, eps, residual=r0, gemma=wbias == 1.0, fp8_scale=scale if fp8 else None)
                    x, r = xs[rank].to(dev), r0.to(dev)
                    n = None if with_res else torch.full_like(x, float("nan"))
                    q = torch.full(x.shape, 7.0, device=dev).to(torch.float8_e4m3fn) if fp8 else None
                    before = len(handed)
                    fusion.vllm_fused_allreduce_norm(
                        x, r, wd, eps, world, True, True, 64, 2 if fp8 else 1, norm_out=n, quant_out=q,
                        scale_factor=sd if fp8 else None, weight_bias=wbias, _group_ca=lambda: ca,
                    )
                    torch.cuda.synchronize()
                    ca._comm.check()
                    got = q if fp8 else (x if with_res else n)
                    res_out = r if with_res else x
                    bad = (len(handed) != before) + (bits(got) != bits(want_o)) + (bits(res_out) != bits(want_r))
                    if bad:
                        fwrong += bad
                        failures.append(f"routed vLLM op {rows}x{hidden} residual={with_res} weight_bias={wbias} fp8={fp8}")
                    h.update(bits(got) + bits(res_out))
                    fcases += 1
            # NVFP4, as vLLM's pass emits it: uint8 codes, its int32 scales viewed as FP8, poisoned
            for wbias in (0.0, 1.0):
                r0 = res if with_res else torch.zeros_like(res)
                (wq, wsf), want_r = reference_rmsnorm(xs, w, eps, residual=r0, gemma=wbias == 1.0, nvfp4_scale=gs4)
                x, r = xs[rank].to(dev), r0.to(dev)
                n = None if with_res else torch.full_like(x, float("nan"))
                q = torch.full((rows, hidden // 2), 0xA5, dtype=torch.uint8, device=dev)
                sf = torch.full(tuple(wsf.shape), 0x7FA57FA5, dtype=torch.int32, device=dev).view(torch.float8_e4m3fn)
                before = len(handed)
                fusion.vllm_fused_allreduce_norm(
                    x, r, wd, eps, world, True, True, 64, 3, norm_out=n, quant_out=q, scale_out=sf,
                    scale_factor=gs4.reshape(1, 1).to(dev), weight_bias=wbias, _group_ca=lambda: ca,
                )
                torch.cuda.synchronize()
                ca._comm.check()
                res_out = r if with_res else x
                bad = (len(handed) != before) + (bits(q) != bits(wq)) + (not torch.equal(sf.view(torch.int32).cpu(), wsf)) + (bits(res_out) != bits(want_r))
                if bad:
                    fwrong += bad
                    failures.append(f"routed vLLM op NVFP4 {rows}x{hidden} residual={with_res} weight_bias={wbias}")
                h.update(bits(q) + bits(res_out))
                fcases += 1
    ca.close()
    rec.update(family_cases=fcases, family_wrong=fwrong)
    # A captured step: fused calls (7168 x 1 and x 3, bf16) and plain all-reduces alternating,
    # inside comm.capture(), replayed with fresh inputs copied in before each replay.
    dt, calls = torch.bfloat16, 6
    shapes = [(1 if k % 2 == 0 else 3, 7168) for k in range(calls)]
    xb = [torch.empty(s, dtype=dt, device=dev) for s in shapes]
    rb = [torch.empty(s, dtype=dt, device=dev) for s in shapes]
    wb = [torch.empty(s[1], dtype=dt, device=dev) for s in shapes]
    ob = [torch.empty(s, dtype=dt, device=dev) for s in shapes]
    rob = [torch.empty(s, dtype=dt, device=dev) for s in shapes]
    pb = [torch.empty(s, dtype=dt, device=dev) for s in shapes]  # plain all-reduce inputs/outputs
    po = [torch.empty(s, dtype=dt, device=dev) for s in shapes]
    for t in xb + rb + wb + pb:
        t.fill_(1.0)
    for k in range(calls):  # warm-up: every variant loaded before the capture
        comm.all_reduce_add_rmsnorm(xb[k], rb[k], wb[k], eps, out=ob[k], residual_out=rob[k])
        comm.all_reduce(pb[k], out=po[k])
    comm.check()
    g = torch.cuda.CUDAGraph()
    with comm.capture():
        with torch.cuda.graph(g):
            for k in range(calls):
                comm.all_reduce_add_rmsnorm(xb[k], rb[k], wb[k], eps, out=ob[k], residual_out=rob[k])
                comm.all_reduce(pb[k], out=po[k])
    rec["captured_calls"] = comm.captured_calls
    gwrong = 0
    replays = 3
    for rep in range(replays):
        wants = []
        for k, (rows, hidden) in enumerate(shapes):
            xs, res, w = make_fused_inputs(9000 + rep * calls + k, world, rows, hidden, dt)
            ps = make_inputs(19000 + rep * calls + k, world, rows * hidden, dt)
            xb[k].copy_(xs[rank])
            rb[k].copy_(res)
            wb[k].copy_(w)
            pb[k].copy_(ps[rank].reshape(rows, hidden))
            for t in (ob[k], rob[k], po[k]):
                t.fill_(float("nan"))
            wants.append((reference_add_rmsnorm(xs, res, w, eps), reference(ps, dt).reshape(rows, hidden)))
        g.replay()
        comm.check()
        for k, ((wo, wr), wp) in enumerate(wants):
            bad = (bits(ob[k]) != bits(wo)) + (bits(rob[k]) != bits(wr)) + (bits(po[k]) != bits(wp))
            if bad:
                gwrong += bad
                failures.append(f"graph replay {rep} call {k}")
            h.update(bits(ob[k]) + bits(rob[k]) + bits(po[k]))
    # The routes a captured call of these shapes takes (bf16; the plan's fused pick where no
    # algorithm is forced: plan::fused_kernel), as "path:algorithm".
    rec["graph_routes"] = {f"{r}x{hd}": ":".join(comm._native.fused_route("bfloat16", r, hd, True)) for r, hd in ((1, 7168), (3, 7168), (16, 7168), (32, 7168))}
    rec.update(graph_calls=calls * 2 * replays, graph_wrong=gwrong, digest=h.hexdigest(), failures=failures[:20])
    comm.close()
    rec["ok"] = True
    with open(out, "w") as f:
        json.dump(rec, f)
    os._exit(0)


def launch(world, outdir, deadline):
    tmp = tempfile.mkdtemp(prefix="tpar-fused-")
    procs = []
    for r in range(world):
        env = dict(os.environ, INIT_FILE=os.path.join(tmp, "init"), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), os.path.join(tmp, f"r{r}.json")], env=env))
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
    tag = f"{os.environ.get('TPAR_ALGO', 'auto')}-{os.environ.get('TPAR_TRANSPORT', 'p2p')}-fused{os.environ.get('TPAR_FUSED', 'auto')}"
    with open(os.path.join(outdir, f"fused-w{world}-{tag}.json"), "w") as f:
        json.dump(recs, f, indent=1)
    return recs


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    world = int(sys.argv[1])
    outdir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    recs = launch(world, outdir, deadline=float(os.environ.get("DEADLINE_S", "150")))
    ok = all(r.get("ok") for r in recs) and len({r.get("digest") for r in recs}) == 1
    ok = ok and all(r["eager_wrong"] == 0 and r["graph_wrong"] == 0 and r["family_wrong"] == 0 for r in recs)
    r0 = recs[0] if recs[0].get("ok") else {}
    expect = os.environ.get("EXPECT_PATH")
    paths = r0.get("paths") or {}
    if expect == "fused":
        ok = ok and paths.get("1x7168") == "fused"
    elif expect == "unfused":
        ok = ok and bool(paths) and all(p == "unfused" for p in paths.values())
    elif expect is not None:
        sys.exit(f"EXPECT_PATH={expect!r}: expected fused or unfused")
    routes = r0.get("graph_routes") or {}
    expect_graph = os.environ.get("EXPECT_GRAPH_ROUTES")  # e.g. "1x7168=fused:oneshot-pull,16x7168=fused:oneshot-pull"
    for item in filter(None, (expect_graph or "").split(",")):
        shape, want = item.split("=")
        ok = ok and routes.get(shape) == want
    fails = [f for r in recs for f in r.get("failures", [])]
    print(
        f"RESULT fused world={world} algo={os.environ.get('TPAR_ALGO')} TPAR_FUSED={os.environ.get('TPAR_FUSED', 'auto')} expect={expect} transport={os.environ.get('TPAR_TRANSPORT', 'p2p')} "
        f"eager_cases={r0.get('eager_cases')} eager_wrong={sum(r.get('eager_wrong', -1) for r in recs)} "
        f"family_cases={r0.get('family_cases')} family_wrong={sum(r.get('family_wrong', -1) for r in recs)} "
        f"graph_calls={r0.get('graph_calls')} graph_wrong={sum(r.get('graph_wrong', -1) for r in recs)} captured={r0.get('captured_calls')} "
        f"ranks_identical={len({r.get('digest') for r in recs}) == 1} paths={r0.get('paths')} graph_routes={routes} expect_graph={expect_graph} -> {'PASS' if ok else 'FAIL'}"
    )
    for f in fails[:10]:
        print(f"  FAIL {f}")
    sys.exit(0 if ok else 1)
