"""What each rank process runs (see ranks.py). Every function is called on every rank with
(rank, world, **params) and returns a JSON-able record for the parent to assert on."""

from __future__ import annotations

import hashlib
import os
import time

import torch
import torch.distributed as dist

import tpar
import tpar.torch as tt
from tpar.testing import INT_VIEW, bits, make_inputs, reference
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def correctness(rank, world, sizes, dtypes, seed=1):
    """Every dtype x size, out of place (given out, and out=None) and in place; outputs
    poisoned with NaN first; compared bitwise with the reference."""
    comm = tt.Communicator(device="cpu")
    h = hashlib.sha256()
    wrong = cases = 0
    algos = set()
    for dname in dtypes:
        dt = DTYPES[dname]
        for n in sizes:
            for mode in ("out", "new", "inplace"):
                seed += 1
                xs = make_inputs(seed, world, n, dt)
                ref = reference(xs, dt)
                x = xs[rank].clone()
                if mode == "out":
                    out = torch.full((n,), float("nan"), dtype=dt)
                    got = comm.all_reduce(x, out=out)
                    assert got is out
                elif mode == "new":
                    got = comm.all_reduce(x)
                else:
                    got = comm.all_reduce_(x)
                    assert got is x
                if mode != "inplace" and bits(x) != bits(xs[rank]):
                    wrong += n  # the input must be left alone
                if bits(got) != bits(ref):
                    wrong += int((got.view(INT_VIEW[dt]) != ref.view(INT_VIEW[dt])).sum())
                algos.add(comm.plan(x))
                h.update(bits(got))
                cases += 1
    comm.close()
    return {"wrong": wrong, "cases": cases, "digest": h.hexdigest(), "algos": sorted(algos)}


def bad_input(rank, world, kind, who="all"):
    """`who` ranks pass a bad tensor (`kind`); the others a good one. Records what each rank
    raised and when; where every rank was bad, a good call must work afterwards.

    The bad calls are made one rank at a time, each while every other rank waits in a gloo
    barrier (the good ranks call only after every bad rank has raised): a bad call that
    entered the collective instead of raising at once would wait for peers that are not
    calling, and end in a timeout, which the tests tell from InvalidArgumentError."""
    comm = tt.Communicator(device="cpu")
    n = 1000
    good = make_inputs(5, world, n, torch.float32)
    bad_here = who == "all" or int(who) == rank
    x = good[rank].clone()
    out = None
    if bad_here:
        if kind == "noncontiguous":
            x = torch.stack([good[rank], good[rank]], 1)[:, 0]  # stride 2
        elif kind == "int32":
            x = torch.arange(n, dtype=torch.int32) + 1
        elif kind == "device":
            x = torch.empty(n, device="meta")
        elif kind == "out_size":
            out = torch.empty(n + 1)
    bad_ranks = range(world) if who == "all" else [int(who)]
    first = None

    def call():
        t0 = time.monotonic()
        try:
            comm.all_reduce(x, out=out)
            raise AssertionError(f"rank {rank}: all_reduce accepted {kind} (bad here: {bad_here})")
        except tpar.TparError as e:
            return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}

    for k in bad_ranks:
        if rank == k:
            first = call()
        dist.barrier()
    if first is None:
        first = call()  # a good rank, after every bad one raised
    after = None
    if who == "all":
        got = comm.all_reduce(good[rank].clone())
        after = bits(got) == bits(reference(good, torch.float32))
    return {"first": first, "good_call_after": after}


def mismatch(rank, world):
    """The last rank reduces one element more than the others."""
    comm = tt.Communicator(device="cpu")
    n = 1000 + (rank == world - 1)
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(n))
        raise AssertionError(f"rank {rank}: a call whose size differs across ranks returned")
    except tpar.TparError as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}


def dead_rank(rank, world, fork_child=False):
    """One good call, then the last rank dies; the others' next call must raise. With
    ``fork_child`` the dying rank first forks a child that outlives it (as compile workers and
    engine helpers do): the rank's death must still be seen."""
    comm = tt.Communicator(device="cpu")
    xs = make_inputs(9, world, 4096, torch.bfloat16)
    assert bits(comm.all_reduce(xs[rank])) == bits(reference(xs, torch.bfloat16))
    dist.barrier()
    if rank == world - 1:
        if fork_child and os.fork() == 0:  # the child: lives on past its parent, then leaves quietly
            time.sleep(8)
            os._exit(0)
        os._exit(3)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        for _ in range(3):
            comm.all_reduce(xs[rank])
        raise AssertionError(f"rank {rank}: all_reduce returned with a dead peer")
    except tpar.TparError as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}


def custom_op(rank, world):
    """torch.ops.tpar.all_reduce, eager and inside torch.compile (aot_eager: traced with the
    fake implementation, run with the real one)."""
    comm = tt.Communicator(device="cpu")
    xs = make_inputs(11, world, 777, torch.bfloat16)
    ref = reference(xs, torch.bfloat16)
    eager = torch.ops.tpar.all_reduce(xs[rank], comm.handle)

    def f(x):
        return torch.ops.tpar.all_reduce(x * 1, comm.handle) + 0

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(xs[rank])
    comm.close()
    return {"eager": bits(eager) == bits(ref), "compiled": bits(compiled) == bits(ref)}


def dropin(rank, world):
    """The engines' contract, driven as the engines drive it, on CPU tensors."""
    from tpar.engines import TparCustomAllreduce

    ca = TparCustomAllreduce(group=dist.group.WORLD, device="cpu", max_size=1 << 20)
    rec = {"disabled": ca.disabled, "original_disabled": ca.original_disabled}
    xs = make_inputs(13, world, 4096, torch.float16)
    ref = reference(xs, torch.float16)
    rec["should_fp16"] = ca.should_custom_ar(xs[rank])
    rec["should_int32"] = ca.should_custom_ar(torch.ones(4096, dtype=torch.int32))
    rec["should_strided"] = ca.should_custom_ar(torch.ones(4096, 2)[:, 0])
    rec["should_too_big"] = ca.should_custom_ar(torch.ones((1 << 20) // 4 + 4))
    out = ca.custom_all_reduce(xs[rank])
    rec["custom_all_reduce"] = out is not None and bits(out) == bits(ref)
    rec["input_untouched"] = bits(xs[rank]) == bits(make_inputs(13, world, 4096, torch.float16)[rank])
    with ca.capture():
        out2 = ca.custom_all_reduce(xs[rank])
    rec["in_capture"] = bits(out2) == bits(ref)
    o = torch.full((4096,), float("nan"), dtype=torch.float16)
    rec["all_reduce_out"] = ca.all_reduce(xs[rank], out=o, registered=False) is o and bits(o) == bits(ref)
    ca.close()
    rec["closed_disabled"] = ca.disabled and not ca.should_custom_ar(xs[rank])
    return rec


def fused_cpu(rank, world, shapes, dtypes, seed=3):
    """all_reduce_add_rmsnorm on CPU ranks: out of place, in place (vLLM's form) and through
    the custom op, eager and inside torch.compile (aot_eager: traced with the fake
    implementation, run with the real one); every output bit for bit against
    tpar.testing.reference_add_rmsnorm, inputs left alone where they should be."""
    from tpar.testing import make_fused_inputs, reference_add_rmsnorm

    comm = tt.Communicator(device="cpu")
    h = hashlib.sha256()
    wrong = cases = 0
    for dname in dtypes:
        dt = DTYPES[dname]
        for rows, hidden in shapes:
            seed += 1
            xs, res, w = make_fused_inputs(seed, world, rows, hidden, dt)
            want_o, want_r = reference_add_rmsnorm(xs, res, w, 1e-6)
            x, r = xs[rank].clone(), res.clone()
            o, ro = comm.all_reduce_add_rmsnorm(x, r, w, 1e-6)
            wrong += (bits(o) != bits(want_o)) + (bits(ro) != bits(want_r))
            wrong += (bits(x) != bits(xs[rank])) + (bits(r) != bits(res))  # out of place: inputs untouched
            o2, ro2 = comm.all_reduce_add_rmsnorm_(x, r, w, 1e-6)
            wrong += (o2 is not x) + (ro2 is not r) + (bits(x) != bits(want_o)) + (bits(r) != bits(want_r))
            o3, ro3 = torch.ops.tpar.all_reduce_add_rmsnorm(xs[rank], res, w, 1e-6, comm.handle)
            wrong += (bits(o3) != bits(want_o)) + (bits(ro3) != bits(want_r))
            h.update(bits(o) + bits(ro))
            cases += 1

    def f(x, r, w):
        o, ro = torch.ops.tpar.all_reduce_add_rmsnorm(x * 1, r, w, 1e-6, comm.handle)
        return o + 0, ro

    xs, res, w = make_fused_inputs(99, world, 3, 512, torch.bfloat16)
    want_o, want_r = reference_add_rmsnorm(xs, res, w, 1e-6)
    co, cr = torch.compile(f, backend="aot_eager", fullgraph=True)(xs[rank], res, w)
    comm.close()
    return {"wrong": int(wrong), "cases": cases, "digest": h.hexdigest(), "compiled": bits(co) == bits(want_o) and bits(cr) == bits(want_r)}


def fusion_routing(rank, world):
    """tpar.engines.fusion's side of the engines' fused calls (see test_fusion_contract):
    CPU tensors, tpar's drop-in object as the group's custom all-reduce, the engines'
    originals replaced by recorders (their FlashInfer kernels need GPUs)."""
    from tpar.engines import TparCustomAllreduce, fusion
    from tpar.testing import make_fused_inputs, reference_add_rmsnorm

    ca = TparCustomAllreduce(group=dist.group.WORLD, device="cpu", max_size=1 << 20)
    handed = []
    # FlashInfer's AllReduceFusionPattern codes (kARResidualRMSNorm, ...FP8Quant,
    # ...FP4Quant, ...OutFP8Quant), which install_vllm reads from flashinfer.comm.
    PLAIN, FP8, FP4, OUT_FP8 = 1, 2, 3, 4
    fusion._vllm["code"], fusion._vllm["fp8_code"], fusion._vllm["fp4_code"] = PLAIN, FP8, FP4

    def recorder(*a, **k):
        handed.append(f"code{a[8]}-wb{k.get('weight_bias')}-q{None if k.get('quant_out') is None else k['quant_out'].dtype}-s{k.get('scale_factor') is not None}-so{k.get('scale_out') is not None}-w{a[2].dtype}")

    fusion._vllm["original"] = recorder
    fusion._sglang["original"] = lambda *a: handed.append("sglang-declined") or (None, None)
    xs, res, w = make_fused_inputs(21, world, 3, 1024, torch.bfloat16)
    want_o, want_r = reference_add_rmsnorm(xs, res, w, 1e-6)
    rec = {}
    # vLLM, norm_out None: allreduce_in becomes the norm, residual the updated residual.
    x, r = xs[rank].clone(), res.clone()
    fusion.vllm_fused_allreduce_norm(x, r, w, 1e-6, world, True, True, 64, PLAIN, _group_ca=lambda: ca)
    rec["vllm_inplace"] = bits(x) == bits(want_o) and bits(r) == bits(want_r)
    # vLLM, norm_out given: the norm there, the updated residual into allreduce_in.
    x, r, n = xs[rank].clone(), res.clone(), torch.full_like(xs[rank], float("nan"))
    fusion.vllm_fused_allreduce_norm(x, r, w, 1e-6, world, True, True, 64, PLAIN, norm_out=n, _group_ca=lambda: ca)
    rec["vllm_norm_out"] = bits(n) == bits(want_o) and bits(x) == bits(want_r) and bits(r) == bits(res)
    # SGLang: new tensors; GemmaRMSNorm passes its gemma_weight (w + 1 in w's dtype).
    decide = lambda x, r, w, g: ca if fusion.takes(ca, x, r, w) else None  # noqa: E731
    o, ro = fusion.sglang_allreduce_residual_rmsnorm(xs[rank], res, w, 1e-6, _decide=decide)
    rec["sglang"] = bits(o) == bits(want_o) and bits(ro) == bits(want_r)
    gw = w.clone().add_(1.0)
    gw_o, gw_r = reference_add_rmsnorm(xs, res, gw, 1e-6)
    o, ro = fusion.sglang_allreduce_residual_rmsnorm(xs[rank], res, gw, 1e-6, _decide=decide)
    rec["sglang_gemma"] = bits(o) == bits(gw_o) and bits(ro) == bits(gw_r) and bits(gw_o) != bits(want_o)
    # vLLM's op, every pattern its pass emits but NVFP4 (the no-residual ones pass a zeroed
    # residual and a norm_out), taken by tpar's family kernel: bit for bit the reference of
    # that residual, the outputs poisoned first, the norm_out of the FP8 pattern untouched.
    from tpar.testing import reference_rmsnorm

    scale = torch.tensor([0.004], dtype=torch.float32)
    forms = {}
    for with_res in (True, False):
        for wb in (0.0, 1.0):
            for fp8 in (False, True):
                r0 = res.clone() if with_res else torch.zeros_like(res)
                want_o, want_r = reference_rmsnorm(xs, w, 1e-6, residual=r0, gemma=wb == 1.0, fp8_scale=scale if fp8 else None)
                x, r = xs[rank].clone(), r0.clone()
                n = None if with_res else torch.full_like(x, float("nan"))
                q = torch.full(x.shape, 7.0).to(torch.float8_e4m3fn) if fp8 else None
                before = len(handed)
                fusion.vllm_fused_allreduce_norm(
                    x, r, w, 1e-6, world, True, True, 64, FP8 if fp8 else PLAIN, norm_out=n, quant_out=q,
                    scale_factor=scale if fp8 else None, weight_bias=wb, _group_ca=lambda: ca,
                )
                out = q if fp8 else (x if with_res else n)
                res_out = r if with_res else x
                ok = len(handed) == before and bits(out) == bits(want_o) and bits(res_out) == bits(want_r)
                if not with_res:
                    ok = ok and bits(r) == bits(r0) and (not fp8 or bool(torch.isnan(n).all()))
                elif fp8:
                    ok = ok and bits(x) == bits(xs[rank])  # the FP8 pattern writes no norm
                forms[f"res{int(with_res)}-gemma{int(wb)}-fp8{int(fp8)}"] = ok
    # The NVFP4 pattern (as vLLM's pass emits it: uint8 quant_out, its int32 scales viewed as
    # float8_e4m3fn, the global scale [1, 1]), outputs poisoned: codes and the whole scale
    # tensor (padding zeroed, as vLLM's kernel) bit for bit the reference, norm_out untouched.
    from tpar.testing import nvfp4_scale_shape

    gs = torch.tensor([[448.0 * 6.0 / 4.5]], dtype=torch.float32)
    sshape = nvfp4_scale_shape(3, 1024)
    for with_res in (True, False):
        for wb in (0.0, 1.0):
            r0 = res.clone() if with_res else torch.zeros_like(res)
            (want_q, want_sf), want_r = reference_rmsnorm(xs, w, 1e-6, residual=r0, gemma=wb == 1.0, nvfp4_scale=gs)
            x, r = xs[rank].clone(), r0.clone()
            n = None if with_res else torch.full_like(x, float("nan"))
            q = torch.full((3, 512), 0xA5, dtype=torch.uint8)
            sf = torch.full(sshape, 0x7FA57FA5, dtype=torch.int32).view(torch.float8_e4m3fn)
            before = len(handed)
            fusion.vllm_fused_allreduce_norm(
                x, r, w, 1e-6, world, True, True, 64, FP4, norm_out=n, quant_out=q, scale_out=sf,
                scale_factor=gs, weight_bias=wb, _group_ca=lambda: ca,
            )
            res_out = r if with_res else x
            ok = len(handed) == before and bits(q) == bits(want_q) and bits(res_out) == bits(want_r)
            ok = ok and torch.equal(sf.view(torch.int32), want_sf)
            if not with_res:
                ok = ok and bits(r) == bits(r0) and bool(torch.isnan(n).all())
            else:
                ok = ok and bits(x) == bits(xs[rank])  # the NVFP4 pattern writes no norm
            forms[f"res{int(with_res)}-gemma{int(wb)}-nvfp4"] = ok
    rec["vllm_forms"] = forms
    # Handed back: NVFP4 forms tpar does not write, the Out-FP8 pattern, another weight offset, a weight of another
    # dtype, an FP8 pattern without a scale (dynamic) or with a quant_out tpar does not write,
    # a plain pattern with a quant_out.
    w32 = w.float()
    fp4_out = torch.empty(3, 512, dtype=torch.uint8)
    back = [
        dict(code=FP4, quant_out=fp4_out, scale_out=torch.empty(64, dtype=torch.uint8), scale_factor=scale),
        dict(code=FP4, quant_out=fp4_out, scale_out=torch.empty(sshape, dtype=torch.int32).view(torch.float8_e4m3fn)),
        dict(code=FP4, quant_out=torch.empty(3, 1024, dtype=torch.uint8), scale_out=torch.empty(sshape, dtype=torch.int32).view(torch.float8_e4m3fn), scale_factor=scale),
        dict(code=OUT_FP8, norm_out=torch.empty_like(xs[rank]), quant_out=torch.empty(3, 1024, dtype=torch.float8_e4m3fn), scale_factor=scale),
        dict(code=PLAIN, weight_bias=0.5),
        dict(code=PLAIN, gamma=w32),
        dict(code=FP8, quant_out=torch.empty(3, 1024, dtype=torch.float8_e4m3fn)),
        dict(code=FP8, quant_out=torch.empty(3, 1024, dtype=torch.bfloat16), scale_factor=scale),
        dict(code=FP8, quant_out=torch.empty(3, 1024, dtype=torch.float8_e4m3fn), scale_factor=scale.double()),
        dict(code=PLAIN, quant_out=torch.empty(3, 1024, dtype=torch.float8_e4m3fn), scale_factor=scale),
    ]
    for b in back:
        code, gamma = b.pop("code"), b.pop("gamma", w)
        fusion.vllm_fused_allreduce_norm(xs[rank].clone(), res.clone(), gamma, 1e-6, world, True, True, 64, code, _group_ca=lambda: ca, **b)
    rec["handed_back"] = handed
    # tpar's own vLLM pass's op: every pattern of the family through the communicator's
    # all_reduce_rmsnorm (takes() accepts the no-residual form), bit for bit the reference;
    # without a residual the second output is the all-reduced sum.
    from tpar.engines import vllm_pass
    from tpar.testing import reference, reference_rmsnorm

    scale = torch.tensor([0.004], dtype=torch.float32)

    def expected(r0, gemma, sc):
        want_o, want_r = reference_rmsnorm(xs, w, 1e-6, residual=r0, gemma=gemma, fp8_scale=sc)
        if want_r is None:  # no residual: the second output is the all-reduced sum
            want_r = reference([t.reshape(-1) for t in xs], torch.bfloat16).reshape(xs[0].shape)
        return want_o, want_r

    total = vllm_pass._stats["fused"]
    fam = []
    for residual in (True, False):
        for gemma in (False, True):
            for fp8 in (False, True):
                r0 = res.clone() if residual else None
                sc = scale if fp8 else None
                want_o, want_r = expected(r0, gemma, sc)
                o, ro = vllm_pass.vllm_all_reduce_rmsnorm(xs[rank].clone(), r0, w, 1e-6, gemma, sc, _group_ca=lambda: ca)
                fam.append(bits(o) == bits(want_o) and bits(ro) == bits(want_r) and (o.dtype == torch.float8_e4m3fn) == fp8)
    rec["vllm_pass_family"] = all(fam) and vllm_pass._stats["fused"] - total == 8 and fusion.takes(ca, xs[rank], None, w)
    # out= / residual_out= of the communicator's family call, poisoned first.
    comm = ca._comm
    outs = []
    for residual in (True, False):
        for fp8 in (False, True):
            r0 = res.clone() if residual else None
            sc = scale if fp8 else None
            want_o, want_r = expected(r0, True, sc)
            out = torch.full(xs[rank].shape, 7.0).to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
            ro_buf = torch.full_like(xs[rank], float("nan"))
            o, ro = comm.all_reduce_rmsnorm(xs[rank].clone(), w, 1e-6, residual=r0, gemma=True, fp8_scale=sc, out=out, residual_out=ro_buf)
            outs.append(o is out and ro is ro_buf and bits(out) == bits(want_o) and bits(ro_buf) == bits(want_r))
    try:
        x8 = xs[rank].clone()
        comm.all_reduce_rmsnorm(x8, w, 1e-6, fp8_scale=scale, out=x8)
        outs.append(False)
    except tpar.InvalidArgumentError:
        outs.append(True)
    rec["family_out_args"] = all(outs)
    ca.close()
    return rec


def gather_scatter(rank, world, sizes, dtypes, seed=21):
    """all_gather_into_tensor and reduce_scatter_tensor on every dtype x per-rank size, the
    outputs poisoned with NaN first: the all-gather against the concatenation, bit for bit;
    the reduce-scatter against slice `rank` of the all-reduce's reference and of tpar's own
    all-reduce of the same inputs; then both torch ops, eager and compiled."""
    comm = tt.Communicator(device="cpu")
    wrong = cases = 0
    served0 = comm.served_calls
    for dname in dtypes:
        dt = DTYPES[dname]
        for n in sizes:
            seed += 1
            xs = make_inputs(seed, world, n, dt)
            out = torch.full((world * n,), float("nan"), dtype=dt)
            got = comm.all_gather_into_tensor(out, xs[rank])
            assert got is out
            wrong += int((out.view(INT_VIEW[dt]) != torch.cat(xs).view(INT_VIEW[dt])).sum())
            big = make_inputs(seed + 7, world, world * n, dt)
            part = torch.full((n,), float("nan"), dtype=dt)
            comm.reduce_scatter_tensor(part, big[rank])
            want = reference(big, dt)[rank * n:(rank + 1) * n]
            wrong += int((part.view(INT_VIEW[dt]) != want.view(INT_VIEW[dt])).sum())
            ar = comm.all_reduce(big[rank])[rank * n:(rank + 1) * n]
            wrong += int((part.view(INT_VIEW[dt]) != ar.view(INT_VIEW[dt])).sum())
            cases += 2
    xs = make_inputs(5, world, 24, torch.bfloat16)
    x2 = xs[rank].reshape(3, 8)
    ag = torch.ops.tpar.all_gather(x2, world, comm.handle)
    compiled = torch.compile(lambda x: torch.ops.tpar.all_gather(x * 1, world, comm.handle) + 0, backend="aot_eager", fullgraph=True)(x2)
    big = make_inputs(6, world, 8 * world, torch.bfloat16)
    rs = torch.ops.tpar.reduce_scatter(big[rank].reshape(world, 8), world, comm.handle)
    ops = {
        "all_gather_shape": list(ag.shape),
        "all_gather": bits(ag) == bits(torch.cat(xs)),
        "compiled": bits(compiled) == bits(torch.cat(xs)),
        "reduce_scatter": bits(rs) == bits(reference(big, torch.bfloat16)[rank * 8:(rank + 1) * 8]),
    }
    served = comm.served_calls - served0
    plan = comm.plan_collective("all-gather", xs[rank])
    comm.close()
    return {"wrong": wrong, "cases": cases, "served": served, "ops": ops, "plan": plan}


def collective_mismatch(rank, world):
    """Rank 0 all-gathers while the others all-reduce the same number of elements."""
    comm = tt.Communicator(device="cpu")
    x = torch.ones(64)
    t0 = time.monotonic()
    try:
        if rank == 0:
            comm.all_gather_into_tensor(torch.empty(64 * world), x)
        else:
            comm.all_reduce(x)
        raise AssertionError(f"rank {rank}: calls of different collectives returned")
    except tpar.TparError as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}

def fused_nvfp4_cpu(rank, world, shapes, seed=17):
    """Communicator.all_reduce_rmsnorm(..., nvfp4_scale=) on CPU ranks, every NVFP4 pattern
    (residual or not, Gemma or not), eager and through tpar::all_reduce_rmsnorm_nvfp4: codes,
    swizzled scales and the residual bit for bit tpar.testing.reference_rmsnorm; a given
    scale_out is written whole (the padding 0); bad arguments raise with tpar's message."""
    from tpar.testing import make_fused_inputs, nvfp4_scale_shape, reference_rmsnorm
    comm = tt.Communicator(device="cpu")
    h = hashlib.sha256()
    wrong = cases = 0
    gs = torch.tensor([448.0 * 6.0 / 4.5], dtype=torch.float32)
    padding_zeroed = True
    for rows, hidden in shapes:
        seed += 1
        xs, res, w = make_fused_inputs(seed, world, rows, hidden, torch.bfloat16)
        for residual in (True, False):
            for gemma in (False, True):
                r = res.clone() if residual else None
                (want_q, want_sf), want_r = reference_rmsnorm(xs, w, 1e-6, residual=r, gemma=gemma, nvfp4_scale=gs)
                x = xs[rank].clone()
                q, sf, ro = comm.all_reduce_rmsnorm(x, w, 1e-6, residual=r, gemma=gemma, nvfp4_scale=gs)
                wrong += bits(q) != bits(want_q) or not torch.equal(sf, want_sf)
                wrong += (ro is None) != (want_r is None) or (ro is not None and bits(ro) != bits(want_r))
                wrong += bits(x) != bits(xs[rank]) or (r is not None and bits(r) != bits(res))
                q3, sf3, ro3 = torch.ops.tpar.all_reduce_rmsnorm_nvfp4(xs[rank], w, 1e-6, r, gemma, gs, comm.handle)
                wrong += bits(q3) != bits(want_q) or not torch.equal(sf3, want_sf)
                wrong += (ro3.numel() == 0) != (want_r is None) or (want_r is not None and bits(ro3) != bits(want_r))
                # A given scale_out, poisoned: written whole, the padding 0.
                given = torch.full(nvfp4_scale_shape(rows, hidden), 0x7FA57FA5, dtype=torch.int32)
                out = torch.empty_like(want_q)
                comm.all_reduce_rmsnorm(xs[rank].clone(), w, 1e-6, residual=r, gemma=gemma, nvfp4_scale=gs, out=out, scale_out=given)
                wrong += bits(out) != bits(want_q) or not torch.equal(given, want_sf)
                padding_zeroed &= int(want_sf.view(torch.uint8).eq(0).sum()) >= (nvfp4_scale_shape(rows, hidden)[0] - rows) * hidden // 16
                h.update(bits(q) + sf.view(torch.uint8).numpy().tobytes() + (bits(ro) if ro is not None else b""))
                cases += 1
    xs, res, w = make_fused_inputs(99, world, 3, 1024, torch.bfloat16)
    bad = 0
    for kwargs in (
        dict(nvfp4_scale=torch.tensor([1.0, 2.0])),
        dict(nvfp4_scale=gs, fp8_scale=gs),
        dict(nvfp4_scale=gs, out=torch.empty(3, 1024, dtype=torch.uint8)),
        dict(nvfp4_scale=gs, scale_out=torch.empty(128, 4, dtype=torch.int32)),
        dict(scale_out=torch.empty(nvfp4_scale_shape(3, 1024), dtype=torch.int32)),
    ):
        try:
            comm.all_reduce_rmsnorm(xs[rank], w, 1e-6, **kwargs)
        except tt.InvalidArgumentError as e:
            bad += "invalid argument" in str(e)
    try:
        comm.all_reduce_rmsnorm(xs[rank][:, :1000].contiguous(), w[:1000].contiguous(), 1e-6, nvfp4_scale=gs)
    except tt.InvalidArgumentError as e:
        bad += "multiple of 16" in str(e)
    comm.close()
    return {"wrong": int(wrong), "cases": cases, "digest": h.hexdigest(), "bad_args_raise": bad == 6, "padding_zeroed": padding_zeroed}


def fused_family_cpu(rank, world, shapes, dtypes, seed=5):
    """Communicator.all_reduce_rmsnorm on CPU ranks, every pattern (residual or not, Gemma or
    not, FP8 or not), eager and through tpar::all_reduce_rmsnorm, and one pattern inside
    torch.compile (aot_eager: traced with the fake implementation): every output bit for bit
    against tpar.testing.reference_rmsnorm, inputs untouched; bad arguments raise."""
    from tpar.testing import make_fused_inputs, reference_rmsnorm

    comm = tt.Communicator(device="cpu")
    h = hashlib.sha256()
    wrong = cases = 0
    scale = torch.tensor([0.004], dtype=torch.float32)
    for dname in dtypes:
        dt = DTYPES[dname]
        for rows, hidden in shapes:
            seed += 1
            xs, res, w = make_fused_inputs(seed, world, rows, hidden, dt)
            for residual in (True, False):
                for gemma in (False, True):
                    for fp8 in (False, True):
                        r = res.clone() if residual else None
                        sc = scale if fp8 else None
                        want_o, want_r = reference_rmsnorm(xs, w, 1e-6, residual=r, gemma=gemma, fp8_scale=sc)
                        x = xs[rank].clone()
                        o, ro = comm.all_reduce_rmsnorm(x, w, 1e-6, residual=r, gemma=gemma, fp8_scale=sc)
                        wrong += bits(o) != bits(want_o)
                        wrong += (ro is None) != (want_r is None) or (ro is not None and bits(ro) != bits(want_r))
                        wrong += bits(x) != bits(xs[rank]) or (r is not None and bits(r) != bits(res))
                        o3, ro3 = torch.ops.tpar.all_reduce_rmsnorm(xs[rank], w, 1e-6, r, gemma, sc, comm.handle)
                        wrong += bits(o3) != bits(want_o)
                        wrong += (ro3.numel() == 0) != (want_r is None) or (want_r is not None and bits(ro3) != bits(want_r))
                        h.update(bits(o) + (bits(ro) if ro is not None else b""))
                        cases += 1

    def f(x, w, s):
        o, _ = torch.ops.tpar.all_reduce_rmsnorm(x * 1, w, 1e-6, None, True, s, comm.handle)
        return o

    xs, res, w = make_fused_inputs(99, world, 3, 512, torch.bfloat16)
    want_o, _ = reference_rmsnorm(xs, w, 1e-6, gemma=True, fp8_scale=scale)
    co = torch.compile(f, backend="aot_eager", fullgraph=True)(xs[rank], w, scale)
    bad = 0
    for kwargs in (dict(fp8_scale=torch.tensor([1.0, 2.0])), dict(fp8_scale=torch.tensor([1.0], dtype=torch.float64)), dict(residual=res[:1])):
        try:
            comm.all_reduce_rmsnorm(xs[rank], w, 1e-6, **kwargs)
        except tt.InvalidArgumentError:
            bad += 1
    comm.close()
    return {"wrong": int(wrong), "cases": cases, "digest": h.hexdigest(), "compiled": co.dtype == torch.float8_e4m3fn and bits(co) == bits(want_o), "bad_args_raise": bad == 3}
