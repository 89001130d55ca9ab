#!/usr/bin/env python3
"""The first-use tune through tpar.torch, rank processes sharing one GPU (scripts/gpu-tune.sh
runs it).

    python3 scripts/gpu_tune_torch.py WORLD JOBS TAG [--out DIR]

Starts JOBS jobs of WORLD rank processes at once (each job its own gloo group and tpar
rendezvous), all on GPU 0, planning on a preset (TPAR_TOPOLOGY; one GPU's own topology has
no peers), tpar joining no NCCL of its own (join_nccl=False, as the engine drop-ins do). Each
rank builds a tpar.torch Communicator -- whose start runs the first-use tune or reads the tune
cache -- records how long the constructor took and the start's line
(``Communicator.tune_status``), then checks one 42 KiB bf16 all-reduce of fresh random inputs
bitwise against the rank-order float32 sum and against every other rank. Prints one RESULT
line per job; the caller sets TPAR_CACHE_DIR / TPAR_TUNE and judges the lines.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time


def rank_main(rank, world, out):
    import torch
    import torch.distributed as dist

    import tpar.torch as tt
    from tpar.testing import bits, make_inputs, reference

    dist.init_process_group("gloo", init_method="file://" + os.environ["INIT_FILE"], rank=rank, world_size=world)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    rec = {"rank": rank}
    try:
        t0 = time.monotonic()
        comm = tt.Communicator(device=dev, max_bytes=8 << 20, join_nccl=False)
        rec["init_s"] = time.monotonic() - t0
        rec["tune"] = comm.tune_status
        n, dt = 21504, torch.bfloat16
        xs = make_inputs(77, world, n, dt)
        o = torch.full((n,), float("nan"), dtype=dt, device=dev)
        comm.all_reduce(xs[rank].to(dev), out=o)
        comm.check()
        torch.cuda.synchronize()
        rec["algo"] = comm.plan(o)
        rec["wrong"] = int(bits(o) != bits(reference(xs, dt)))
        rec["digest"] = hashlib.sha256(bits(o)).hexdigest()[:16]
        comm.close()
        rec["ok"] = True
    except Exception as e:  # reported, not raised: the parent judges every rank
        rec["error"] = f"{type(e).__name__}: {e}"
    with open(out, "w") as f:
        json.dump(rec, f)
    os._exit(0)


def launch(world, jobs, deadline):
    procs = []
    for j in range(jobs):
        tmp = tempfile.mkdtemp(prefix=f"tpar-tune-j{j}-")
        for r in range(world):
            env = dict(os.environ, INIT_FILE=os.path.join(tmp, "init"), OMP_NUM_THREADS="1")
            path = os.path.join(tmp, f"r{r}.json")
            procs.append((j, r, path, subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), path], env=env)))
    end = time.monotonic() + deadline
    recs = [[] for _ in range(jobs)]
    for j, r, path, p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            recs[j].append({"rank": r, "hung": True})
            continue
        recs[j].append(json.load(open(path)) if os.path.exists(path) else {"rank": r, "returncode": p.returncode})
    return recs


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    world, jobs, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    outdir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    recs = launch(world, jobs, deadline=float(os.environ.get("DEADLINE_S", "120")))
    with open(os.path.join(outdir, f"tune-torch-{tag}.json"), "w") as f:
        json.dump(recs, f, indent=1)
    for j, job in enumerate(recs):
        ok = all(r.get("ok") and r.get("wrong") == 0 for r in job) and len({r.get("digest") for r in job}) == 1
        # Every rank of a job adopted the same start (the line is rank 0's words on every rank).
        same = len({r.get("tune") for r in job}) == 1
        r0 = job[0]
        kind = "tuned" if "tuned this machine in" in (r0.get("tune") or "") else "cached" if "read from the cache" in (r0.get("tune") or "") else "none"
        print(f"RESULT {tag} job={j} world={world} start={kind} init_s={max(r.get('init_s', -1) for r in job):.2f} algo={r0.get('algo')} "
              f"wrong={sum(r.get('wrong', 1) for r in job)} identical_lines={same} -> {'PASS' if ok and same else 'FAIL'}")
        print(f"LINE {tag} job={j}: {r0.get('tune') or r0.get('error') or r0}")
