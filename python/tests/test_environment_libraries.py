"""The first hour of an engine user: tpar finds NVRTC and NCCL in the Python environment
where the engine's torch finds its own, with no TPAR_NVRTC_LIB / TPAR_NCCL_LIB and nothing on
LD_LIBRARY_PATH; and `import tpar.torch` without torch says what to install.

Each case runs in a fresh interpreter whose environment has none of those variables (the
test command exports TPAR_NVRTC_LIB and LD_LIBRARY_PATH for the kernel compile test).
NVRTC comes from the pinned wheel that scripts/install-nvrtc.sh installs into .nvrtc/ (a
`pip --target` directory: a site-packages layout, nvidia/cu13/lib/libnvrtc.so.13), put on
the import path as an engine's venv would have it; NCCL from this venv's own
nvidia-nccl-cu13 (torch's dependency, scripts/install-python.sh)."""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVRTC_SITE = os.path.join(ROOT, ".nvrtc")
NVRTC_FILE = os.path.join(NVRTC_SITE, "nvidia", "cu13", "lib", "libnvrtc.so.13")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TPAR_NVRTC_LIB", "TPAR_NCCL_LIB", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    env.update(extra)
    return env


def run(code, **extra):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env(**extra), cwd=os.path.dirname(os.path.abspath(__file__)))
    return p.returncode, p.stdout, p.stderr


def test_nvrtc_is_found_in_the_environment_without_a_setting():
    if not os.path.isfile(NVRTC_FILE):
        if os.environ.get("TPAR_REQUIRE_NVRTC") == "1":
            pytest.fail(f"TPAR_REQUIRE_NVRTC=1 but {NVRTC_FILE} is missing (scripts/install-nvrtc.sh)")
        pytest.skip(f"{NVRTC_FILE} missing: scripts/install-nvrtc.sh installs the pinned nvidia-cuda-nvrtc there")
    code = (
        "import tpar._tpar as t, tpar\n"
        "print(repr([str(d) for d in t.library_dirs()]))\n"
        "path, origin, version = t.find_nvrtc()\n"
        "print('FOUND', path, '|', origin, '|', version)\n"
    )
    rc, out, err = run(code, PYTHONPATH=NVRTC_SITE)
    assert rc == 0, out + err
    line = next(l for l in out.splitlines() if l.startswith("FOUND "))
    path, origin, version = (s.strip() for s in line[len("FOUND "):].split("|"))
    assert os.path.realpath(path) == os.path.realpath(NVRTC_FILE), out
    assert origin == "the Python environment" and version == "13.0", out
    # The directory registered is the one holding the `nvidia` namespace package.
    assert os.path.realpath(NVRTC_SITE) in {os.path.realpath(d) for d in ast.literal_eval(out.splitlines()[0])}, out


def test_without_the_wheel_the_error_names_the_package():
    # The same interpreter, the wheel's directory not on the import path: unless this
    # machine has a CUDA 13 NVRTC on its loader path, the error says where it looked.
    code = (
        "import tpar._tpar as t, tpar\n"
        "try:\n"
        "    print('FOUND', t.find_nvrtc())\n"
        "except tpar.LibraryError as e:\n"
        "    print('ERROR', e)\n"
    )
    rc, out, err = run(code)
    assert rc == 0, out + err
    if out.startswith("FOUND"):
        assert "by name" in out or "the Python environment" in out, out
        pytest.skip(f"this machine has NVRTC without the test's wheel: {out.strip()}")
    assert "nvidia-cuda-nvrtc" in out and "TPAR_NVRTC_LIB" in out and "the Python environment" in out, out


def test_nccl_is_found_in_the_environment_without_a_setting():
    try:
        import nvidia.nccl  # noqa: F401  (torch's nvidia-nccl-cu13, in this venv)
    except ImportError:
        pytest.skip("no nvidia-nccl-cu13 in this Python (scripts/install-python.sh installs torch's)")
    want = None
    for d in __import__("nvidia").__path__:
        f = os.path.join(d, "nccl", "lib", "libnccl.so.2")
        if os.path.isfile(f):
            want = f
            break
    assert want, "nvidia.nccl imports but holds no lib/libnccl.so.2"
    rc, out, err = run("import tpar._tpar as t, tpar\nprint('FOUND', '|'.join(t.find_nccl()))\n")
    assert rc == 0, out + err
    path, origin = out.split("FOUND ", 1)[1].strip().split("|")
    assert os.path.realpath(path) == os.path.realpath(want) and origin == "the Python environment", out


def test_import_tpar_torch_without_torch_names_the_package_and_the_pip_line():
    # torch hidden: a None entry in sys.modules makes `import torch` raise ModuleNotFoundError.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import tpar\n"
        "try:\n"
        "    import tpar.torch\n"
        "except ImportError as e:\n"
        "    print('NAME', e.name)\n"
        "    print('MSG', e)\n"
        "else:\n"
        "    print('imported')\n"
    )
    rc, out, err = run(code)
    assert rc == 0, out + err
    assert "NAME torch" in out, out
    msg = out.split("MSG ", 1)[1]
    assert "PyTorch" in msg and f"{sys.executable} -m pip install torch" in msg and "import tpar" in msg, msg
