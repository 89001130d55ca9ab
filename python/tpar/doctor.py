"""``tpar doctor`` from Python: ``python -m tpar.doctor [--engine vllm|sglang] [--tp N] [--json]``.

Two halves, one source each:

- the engine part (this file): what this Python has installed (tpar, vLLM, SGLang, their
  plug-in entry points and allow-lists, FlashInfer, NVIDIA library wheels) and which engine
  settings would keep calls from tpar with ``TPAR_ENABLE=1``. Nothing is imported from the
  engines: installed distributions are read through ``importlib.metadata``, settings from the
  environment, and each rule below names the engine source it was read from (vLLM 0.33.0,
  SGLang 0.5.23).
- everything else (GPUs, links, islands, the plan per size class, libraries, the verify-step
  estimate, the lines to paste) is tpar's native ``doctor`` (Rust, ``tpar/src/doctor``): the
  ``tpar doctor`` command runs this file in the engine's Python (``--python``) with
  ``--engine-json`` and folds the answer into its report.

This file must run on any CPython >= 3.9 with nothing but the standard library (the ``tpar``
command runs it from its own copy when tpar is not installed in that Python).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

#: (name, distribution, plug-in group, allow-list variable)
ENGINES = (
    ("vLLM", "vllm", "vllm.general_plugins", "VLLM_PLUGINS"),
    ("SGLang", "sglang", "sglang.srt.plugins", "SGLANG_PLUGINS"),
)

#: The library files tpar loads, by kind (``tpar/src/doctor/libs.rs``).
LIBRARY_FILES = {"libnvrtc.so.13": "nvrtc", "libnccl.so.2": "nccl", "libcuda.so.1": "cuda"}

#: TP sizes FlashInfer's all-reduce takes per compute capability: vLLM 0.33.0,
#: vllm/compilation/passes/fusion/allreduce_rms_fusion.py FI_ALLREDUCE_FUSION_MAX_SIZE_MB
#: (FlashInferAllReduce.__init__ disables itself for any other world size).
VLLM_FI_AR_TP = {"sm_90": (2, 4, 8), "sm_100": (2, 4, 8, 16), "sm_103": (2, 4, 8, 16), "sm_107": (2, 4, 8)}


def _metadata():
    import importlib.metadata as md

    return md


def _version(dist: str):
    try:
        return _metadata().version(dist)
    except Exception:  # noqa: BLE001 - not installed (or broken metadata): not there
        return None


def _entry_points(group: str):
    md = _metadata()
    try:
        eps = md.entry_points()
        sel = eps.select(group=group) if hasattr(eps, "select") else eps.get(group, [])
    except Exception:  # noqa: BLE001
        return []
    return [(group, ep.name, ep.value) for ep in sel]


def _tpar_install() -> dict:
    out = {"installed": False, "version": None, "location": None, "importable": False, "error": None, "plugins": []}
    md = _metadata()
    try:
        dist = md.distribution("tpar")
    except Exception:  # noqa: BLE001
        dist = None
    if dist is not None:
        out["installed"] = True
        out["version"] = dist.version
        try:
            out["location"] = str(dist.locate_file(""))
        except Exception:  # noqa: BLE001
            pass
    for _, _, group, _ in ENGINES:
        for g, name, value in _entry_points(group):
            if value.startswith("tpar."):
                out["plugins"].append({"group": g, "name": name, "value": value})
    try:
        import tpar._tpar  # noqa: F401

        out["importable"] = True
    except Exception as e:  # noqa: BLE001 - reported, never raised
        out["error"] = "%s: %s" % (type(e).__name__, e)
    return out


def _pinned():
    try:
        from tpar.engines import SGLANG_VERSIONS, VLLM_VERSIONS

        return {"vllm": list(VLLM_VERSIONS), "sglang": list(SGLANG_VERSIONS)}
    except Exception:  # noqa: BLE001 - tpar not importable here: unknown
        return {}


def _allowed(var: str, name: str = "tpar") -> bool:
    raw = os.environ.get(var)
    if var == "VLLM_PLUGINS":  # vllm/plugins/__init__.py: unset = all; else the listed names
        return raw is None or name in raw.split(",")
    # sglang/srt/plugins/__init__.py: empty = all; else the listed names (stripped)
    return not raw or name in {x.strip() for x in raw.split(",")}


def _engines(pinned: dict) -> list:
    out = []
    for name, dist, group, _var in ENGINES:
        out.append(
            {
                "name": name,
                "distribution": dist,
                "version": _version(dist),
                "pinned": pinned.get(dist, []),
                "plugin_group": group,
                "plugin_registered": any(n == "tpar" and v.startswith("tpar.") for _, n, v in _entry_points(group)),
                "plugin_allowed": _allowed(_var),
            }
        )
    return out


def _flag(var: str, default: int) -> "tuple[str, bool | None]":
    """vLLM's boolean variables: ``bool(int(os.getenv(VAR, default)))`` (vllm/envs.py)."""
    raw = os.environ.get(var)
    if raw is None:
        return "unset (default %d)" % default, bool(default)
    try:
        return raw, bool(int(raw))
    except ValueError:
        return raw, None


def _finding(engine, setting, now, applies, why, effect, source, severity, fix=None, fix_kind="env") -> dict:
    return {
        "engine": engine,
        "setting": setting,
        "now": now,
        "applies": applies,
        "why_applies": why,
        "effect": effect,
        "source": source,
        "severity": severity,
        "fix": fix,
        "fix_kind": fix_kind if fix else None,
    }


def _arch_rule(archs: list, match) -> "tuple[str, str]":
    if not archs:
        return "unknown", "on sm_90 and sm_10x GPUs; the GPUs here are unknown"
    hit = [a for a in archs if match(a)]
    if hit:
        return "yes", "the GPUs here are %s" % ", ".join(archs)
    return "no", "the GPUs here are %s" % ", ".join(archs)


def _unless_here(applies: str, why: str, here: bool) -> "tuple[str, str]":
    """Without the engine in this Python, whether FlashInfer comes with it is unknown."""
    if here or applies != "yes":
        return applies, why
    return "unknown", why + "; vLLM is not installed in this Python, so whether FlashInfer is cannot be told"


def vllm_findings(tp: int, archs: list) -> list:
    """Settings of vLLM 0.33.0 that decide whether its tensor-parallel all-reduces reach tpar."""
    v, out = "vLLM", []
    fi = _version("flashinfer-python") or _version("flashinfer")
    here = _version("vllm") is not None
    _, invariant = _flag("VLLM_BATCH_INVARIANT", 0)
    now, on = _flag("VLLM_ALLREDUCE_USE_FLASHINFER", 1)
    if on is False:
        applies, why = "no", "switched off"
    elif invariant:
        applies, why = "no", "VLLM_BATCH_INVARIANT=1 switches it off"
    elif fi is None and here:
        applies, why = "no", "FlashInfer is not installed in this Python"
    else:
        applies, why = _arch_rule(archs, lambda a: tp in VLLM_FI_AR_TP.get(a, ()))
        why += " (FlashInfer's all-reduce runs on sm_90/100/103/107 at TP 2, 4, 8; 16 on sm_100/103)"
        applies, why = _unless_here(applies, why, here)
    out.append(
        _finding(
            v,
            "VLLM_ALLREDUCE_USE_FLASHINFER",
            now,
            applies,
            why,
            "FlashInfer's all-reduce takes every call under its size limit before tpar's class is asked: TPAR_ENABLE=1 alone changes nothing for those calls",
            "vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.all_reduce (fi_ar_comm before ca_comm), flashinfer_all_reduce.py FlashInferAllReduce.__init__",
            "pre-empts",
            "export VLLM_ALLREDUCE_USE_FLASHINFER=0",
        )
    )
    if invariant:
        applies, why = "no", "VLLM_BATCH_INVARIANT=1 switches it off"
    elif fi is None and here:
        applies, why = "no", "FlashInfer is not installed in this Python"
    elif tp < 2:
        applies, why = "no", "TP %d" % tp
    else:
        applies, why = _arch_rule(archs, lambda a: a == "sm_90" or a.startswith("sm_10"))
        why += " (on by default at -O2 and -O3 for TP > 1 on sm_90 and sm_10x with FlashInfer installed)"
        applies, why = _unless_here(applies, why, here)
    out.append(
        _finding(
            v,
            "compilation pass_config.fuse_allreduce_rms",
            "the optimisation level's default (a server option: not visible from here)",
            applies,
            why,
            "the compiler fuses all-reduce + RMSNorm (+ FP8/NVFP4 quant) into FlashInfer's kernel; with TPAR_ENABLE=1 tpar's plug-in runs its own fusion pass before it, "
            "so the token ranges tpar's plan takes go to tpar's fused kernels and FlashInfer keeps larger ranges and NVFP4: leave it on",
            "vllm/config/vllm.py enable_allreduce_rms_fusion, OPTIMIZATION_LEVEL_02/03; vllm/compilation/passes/pass_manager.py PostGradPassManager.configure",
            "note",
        )
    )
    now, on = _flag("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", 0)
    out.append(
        _finding(
            v,
            "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
            now,
            "yes" if on else "no",
            "switched on" if on else "off (vLLM's default)",
            "FlashInfer's PCIe IPC all-reduce is asked before tpar's class",
            "vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.all_reduce",
            "pre-empts",
            "export VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=0",
        )
    )
    now, on = _flag("VLLM_USE_NCCL_SYMM_MEM", 0)
    out.append(
        _finding(
            v,
            "VLLM_USE_NCCL_SYMM_MEM",
            now,
            "yes" if on and not invariant else "no",
            "switched on" if on else "off (vLLM's default)",
            "NCCL's symmetric-memory all-reduce takes the small and the large sizes before tpar's class is asked",
            "vllm/distributed/device_communicators/all_reduce_utils.py should_nccl_symm_mem_allreduce, asked first in CudaCommunicator.all_reduce",
            "pre-empts",
            "export VLLM_USE_NCCL_SYMM_MEM=0",
        )
    )
    raw = os.environ.get("VLLM_PLUGINS")
    ok = _allowed("VLLM_PLUGINS")
    out.append(
        _finding(
            v,
            "VLLM_PLUGINS",
            "unset (every plug-in loads)" if raw is None else raw,
            "no" if ok else "yes",
            "tpar is allowed" if ok else "the allow-list omits tpar",
            "vLLM loads only the plug-ins this list names: without `tpar`, TPAR_ENABLE=1 does nothing",
            "vllm/plugins/__init__.py load_plugins_by_group",
            "blocks",
            None if ok else "export VLLM_PLUGINS=%s" % ",".join([p for p in (raw or "").split(",") if p] + ["tpar"]),
        )
    )
    prefixes = [p.strip() for p in os.environ.get("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY", "").split(",") if p.strip()]
    ray_ok = any("TPAR_".startswith(p) for p in prefixes)
    out.append(
        _finding(
            v,
            "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY",
            ",".join(prefixes) if prefixes else "unset",
            "no" if ray_ok else "unknown",
            "TPAR_ variables are copied" if ray_ok else "only with --distributed-executor-backend ray",
            "Ray workers get only the variables vLLM copies (VLLM_, NCCL_, ...): TPAR_ENABLE never reaches them",
            "vllm/envs.py VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY",
            "blocks",
            None if ray_ok else "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=%s" % ",".join(prefixes + ["TPAR_"]),
        )
    )
    now, inv = _flag("VLLM_BATCH_INVARIANT", 0)
    out.append(
        _finding(
            v,
            "VLLM_BATCH_INVARIANT",
            now,
            "yes" if inv else "no",
            "switched on" if inv else "off (vLLM's default)",
            "vLLM's own custom all-reduce would take every size; tpar gives the sizes its plan sends to NCCL to the engine's NCCL, so the reduction order can change with the batch size",
            "vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.__init__",
            "note",
        )
    )
    return out


def sglang_findings(tp: int, archs: list) -> list:
    """Settings of SGLang 0.5.23 that decide whether its all-reduces reach tpar."""
    s, out = "SGLang", []
    if tp < 2:
        applies, why = "no", "TP %d" % tp
    else:
        applies, why = _arch_rule(archs, lambda a: a in ("sm_90", "sm_100", "sm_103"))
        if applies == "yes":
            applies = "unknown"
        why += " (auto-enabled on sm_90/sm_100 at TP > 1 for some MoE architectures, e.g. Kimi-K2.5, Qwen3.5-MoE, Nemotron-H, without attention DP)"
    out.append(
        _finding(
            s,
            "flashinfer_allreduce_fusion_backend",
            "the model's default (a server option: not visible from here)",
            applies,
            why,
            "FlashInfer's fused all-reduce + RMSNorm takes those all-reduces: they never reach tpar's class",
            "sglang/srt/arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable",
            "pre-empts",
            "--enforce-disable-flashinfer-allreduce-fusion",
            "flag",
        )
    )
    raw = os.environ.get("SGLANG_PLUGINS", "")
    ok = _allowed("SGLANG_PLUGINS")
    out.append(
        _finding(
            s,
            "SGLANG_PLUGINS",
            raw or "unset (every plug-in loads)",
            "no" if ok else "yes",
            "tpar is allowed" if ok else "the allow-list omits tpar",
            "SGLang loads only the plug-ins this list names: without `tpar`, TPAR_ENABLE=1 does nothing",
            "sglang/srt/plugins/__init__.py",
            "blocks",
            None if ok else "export SGLANG_PLUGINS=%s" % ",".join([p.strip() for p in raw.split(",") if p.strip()] + ["tpar"]),
        )
    )
    return out


def _libraries() -> list:
    """Files of tpar's run-time libraries that this Python's installed distributions hold
    (e.g. ``nvidia-cuda-nvrtc``'s libnvrtc.so.13, ``nvidia-nccl-cu13``'s libnccl.so.2)."""
    out = []
    try:
        dists = list(_metadata().distributions())
    except Exception:  # noqa: BLE001
        return out
    for d in dists:
        name = (d.metadata.get("Name") or "").lower()
        if not (name.startswith("nvidia") or name == "torch"):
            continue
        for f in d.files or ():
            kind = LIBRARY_FILES.get(f.name)
            if kind:
                out.append({"library": kind, "path": str(d.locate_file(f)), "distribution": "%s %s" % (name, d.version)})
    return out


def engine_section(tp: int, archs: list, engine: str = "all") -> dict:
    """The engine part of the report (``tpar/src/doctor/engine.rs`` EngineSection)."""
    pinned = _pinned()
    engines = _engines(pinned)
    findings, notes = [], []
    for e in engines:
        wanted = engine in ("all", e["distribution"])
        if not wanted or (engine == "all" and e["version"] is None):
            continue
        rules = vllm_findings if e["distribution"] == "vllm" else sglang_findings
        findings.extend(rules(tp, archs))
    if engine != "all":
        engines = [e for e in engines if e["distribution"] == engine]
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "tpar": _tpar_install(),
        "engines": engines,
        "findings": findings,
        "libraries": _libraries(),
        "notes": notes,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tpar.doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("all", "vllm", "sglang"), default="all", help="the engine to judge (default: those installed)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: one rank per GPU)")
    p.add_argument("--topology", default=None, help="a preset, `cpu`, or a topology JSON file (default: this machine)")
    p.add_argument("--hidden", type=int, default=None, help="elements per token of each all-reduce (default: 7168)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--engine-json", action="store_true", help="print only the engine part as JSON (what `tpar doctor` reads)")
    p.add_argument("--arch", default="", help="with --engine-json: the GPUs' architectures, e.g. sm_90")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.engine_json:
        archs = [a for a in args.arch.split(",") if a]
        print(json.dumps(engine_section(args.tp or 0, archs, args.engine)))
        return 0
    from tpar._tpar import doctor

    def inspect(tp, archs):
        return json.dumps(engine_section(tp, list(archs), args.engine))

    print(doctor(inspect, args.topology, args.tp, args.hidden, args.json), end="")
    return 0


if __name__ == "__main__":
    if "--engine-json" in sys.argv and sys.path and sys.path[0] in ("", os.getcwd()):
        # Run by `tpar doctor` with `python -c`: the working directory is not the engine's
        # (a `tpar/` folder there would shadow the installed package).
        sys.path.pop(0)
    sys.exit(main())
