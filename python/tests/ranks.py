"""Runs a scenario in N real rank processes (a gloo group over a file rendezvous) and collects
what each rank reports. Used by the tests; also runnable by hand:

    python python/tests/ranks.py WORLD SCENARIO [KEY=VALUE ...]

Each rank runs ``scenarios.<SCENARIO>(ctx)`` and writes one JSON record: its result, or the
exception it raised (class, message, seconds into the scenario). A rank that hangs past the
parent's deadline is killed and reported as such — a hang is a failure, never a pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(world: int, scenario: str, deadline_s: float = 120.0, env: Dict[str, str] = None, **params) -> List[dict]:
    """Starts ``world`` processes of this file's worker, waits for them (at most
    ``deadline_s``), returns each rank's record (rank order)."""
    tmp = tempfile.mkdtemp(prefix="tpar-test-")
    init = os.path.join(tmp, "init")
    procs = []
    for r in range(world):
        e = dict(os.environ)
        e.update(env or {})
        e.update({"RANK": str(r), "WORLD_SIZE": str(world), "TPAR_TEST_INIT": init, "TPAR_TEST_OUT": os.path.join(tmp, f"rank{r}.json")})
        e["TPAR_TEST_PARAMS"] = json.dumps(params)
        e.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", scenario], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    end = time.monotonic() + deadline_s
    records = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            records.append({"rank": r, "hung": True, "output": out.decode(errors="replace")[-4000:]})
            continue
        path = os.path.join(tmp, f"rank{r}.json")
        rec = {"rank": r, "returncode": p.returncode, "output": out.decode(errors="replace")[-4000:]}
        if os.path.exists(path):
            with open(path) as f:
                rec.update(json.load(f))
        records.append(rec)
    for p in procs:
        if p.poll() is None:
            p.kill()
    shutil.rmtree(tmp, ignore_errors=True)  # the suite leaves nothing in /tmp
    return records


def _worker(scenario: str) -> None:
    import torch.distributed as dist

    import scenarios

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    params = json.loads(os.environ["TPAR_TEST_PARAMS"])
    dist.init_process_group("gloo", init_method="file://" + os.environ["TPAR_TEST_INIT"], rank=rank, world_size=world)
    rec = {"rank": rank}
    t0 = time.monotonic()
    try:
        rec["result"] = getattr(scenarios, scenario)(rank, world, **params)
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported to the parent, which asserts on it
        rec["ok"] = False
        rec["error_type"] = type(e).__name__
        rec["error_mro"] = [c.__name__ for c in type(e).__mro__]
        rec["message"] = str(e)
    rec["seconds"] = time.monotonic() - t0
    with open(os.environ["TPAR_TEST_OUT"] + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(os.environ["TPAR_TEST_OUT"] + ".tmp", os.environ["TPAR_TEST_OUT"])
    sys.stdout.flush()
    # Skip interpreter teardown: a peer that raised may have left the gloo group mid-way.
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        world, scen = int(sys.argv[1]), sys.argv[2]
        kv = dict(a.split("=", 1) for a in sys.argv[3:])
        for rec in run_ranks(world, scen, **kv):
            print(json.dumps(rec, indent=1))
