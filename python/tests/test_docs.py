"""The examples of docs/python.md run as written: each ```python block whose first line is
`# NAME.py -- run: torchrun ...` is written to NAME.py and run with that torchrun command's
process count; the CPU one everywhere, the CUDA one where there are GPUs for it."""

import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "python.md")


def examples():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    found = {}
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        m = re.match(r"# (\w+\.py) -- run: torchrun --standalone --nproc-per-node (\d+) \1\n", block)
        if m:
            found[m.group(1)] = (block, int(m.group(2)))
    return found


def run(name, tmp_path, nproc):
    src, _ = examples()[name]
    path = tmp_path / name
    path.write_text(src)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(path)]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_the_docs_hold_both_examples():
    ex = examples()
    assert set(ex) == {"cpu_example.py", "cuda_example.py"}, sorted(ex)
    for name, (src, _) in ex.items():
        compile(src, name, "exec")  # at least valid Python, wherever it cannot run
    assert "LOCAL_RANK" in ex["cuda_example.py"][0]


def test_the_cpu_example_runs_on_two_cpu_ranks(tmp_path):
    out = run("cpu_example.py", tmp_path, 2)
    for r in (0, 1):
        assert f"rank {r} of 2: 3.0" in out, out


def test_the_cuda_example_runs_where_there_are_gpus(tmp_path):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        pytest.skip(f"skipped: the CUDA example needs 2 or more GPUs, this machine has {gpus}")
    run("cuda_example.py", tmp_path, min(gpus, 8))
