"""examples/tp_decode.py in its CPU mode (gloo + tpar's CPU backend) under torchrun: tpar's run
must match the gloo run bitwise here (two ranks: a two-term sum has one rounding whatever the
order), be identical across ranks and reproducible."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "tp_decode.py")


def torchrun(*args, tmp):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE,
           "--device", "cpu", "--preset", "tiny", "--layers", "2", "--iters", "2", *args]
    p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_tp_decode_cpu_tpar_matches_gloo(tmp_path):
    ref = str(tmp_path / "gloo.pt")
    out = torchrun("--allreduce", "gloo", "--save", ref, tmp=tmp_path)
    assert "ranks' outputs bitwise identical: True" in out, out
    out = torchrun("--allreduce", "tpar", "--compare", ref, tmp=tmp_path)
    assert "tpar on cpu" in out and "ranks' outputs bitwise identical: True; a second replay bitwise identical: True" in out, out
    assert "bitwise equal True" in out and "within bfloat16 tolerance" in out, out
