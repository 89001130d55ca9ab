"""``tpar doctor`` from Python: ``python -m tpar.doctor [--engine vllm|sglang] [--tp N] [--json]``.

Two halves, one source each:

- the facts of this Python (this file): what it has installed (tpar, vLLM, SGLang, their
  plug-in entry points, FlashInfer, NVIDIA library wheels) and the raw values of the engine
  variables, for what the engine rules ask (their query). Nothing is imported from the
  engines: installed distributions are read through ``importlib.metadata``, variables from
  the environment. Nothing is judged here.
- everything else, the engine rules included (which engine settings keep calls from tpar
  with ``TPAR_ENABLE=1``, read in the engines' own source), is tpar's native ``doctor``
  (Rust, ``tpar/src/doctor``, the rules in ``rules.rs``): the ``tpar doctor`` command runs
  this file in the engine's Python (``--python``) with ``--facts QUERY`` and judges the
  answer; ``python -m tpar.doctor`` hands the facts to the native module.

This file must run on any CPython >= 3.9 with nothing but the standard library (the ``tpar``
command runs it from its own copy when tpar is not installed in that Python).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys


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
    out = {"installed": False, "version": None, "location": None, "importable": False, "error": None}
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
    try:
        import tpar._tpar  # noqa: F401

        out["importable"] = True
    except Exception as e:  # noqa: BLE001 - reported, never raised
        out["error"] = "%s: %s" % (type(e).__name__, e)
    return out


def _pinned(distributions) -> dict:
    """The versions tpar's contract test checks (``tpar.engines.VLLM_VERSIONS``, ...), for each
    distribution that has them; empty where tpar is not importable here."""
    try:
        from tpar import engines
    except Exception:  # noqa: BLE001 - tpar not importable here: unknown
        return {}
    out = {}
    for d in distributions:
        pins = getattr(engines, d.upper().replace("-", "_") + "_VERSIONS", None)
        if pins is not None:
            out[d] = list(pins)
    return out


def _libraries(files: dict) -> list:
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
            kind = files.get(f.name)
            if kind:
                out.append({"library": kind, "path": str(d.locate_file(f)), "distribution": "%s %s" % (name, d.version)})
    return out


def facts(query: dict) -> dict:
    """This Python's answer to the engine rules' query (``tpar/src/doctor/rules.rs`` Facts)."""
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "tpar": _tpar_install(),
        "versions": {d: _version(d) for d in query.get("distributions", ())},
        "entry_points": {g: [{"group": g, "name": n, "value": v} for _, n, v in _entry_points(g)] for g in query.get("plugin_groups", ())},
        "variables": {v: os.environ.get(v) for v in query.get("variables", ())},
        "pinned": _pinned(query.get("distributions", ())),
        "libraries": _libraries(query.get("library_files", {})),
    }


def engine_section(tp: int, archs: list, engine: str = "all") -> dict:
    """The engine part of the report: this Python's facts, judged by the native engine rules."""
    from tpar import _tpar

    answer = json.dumps(facts(json.loads(_tpar.doctor_query())))
    return json.loads(_tpar.doctor_engine(answer, engine, tp, list(archs)))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tpar.doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("all", "vllm", "sglang"), default="all", help="the engine to judge (default: those installed)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: one rank per GPU)")
    p.add_argument("--topology", default=None, help="a preset, `cpu`, or a topology JSON file (default: this machine)")
    p.add_argument("--hidden", type=int, default=None, help="elements per token of each all-reduce (default: 7168)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--facts", metavar="QUERY", default=None, help="print only this Python's facts for the engine rules' query (JSON), as JSON: what `tpar doctor` reads")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.facts is not None:
        print(json.dumps(facts(json.loads(args.facts))))
        return 0
    from tpar._tpar import doctor

    def inspect(query):
        return json.dumps(facts(json.loads(query)))

    print(doctor(inspect, args.topology, args.tp, args.hidden, args.json, args.engine), end="")
    return 0


if __name__ == "__main__":
    if "--facts" in sys.argv and sys.path and sys.path[0] in ("", os.getcwd()):
        # Run by `tpar doctor` with `python -c`: the working directory is not the engine's
        # (a `tpar/` folder there would shadow the installed package).
        sys.path.pop(0)
    sys.exit(main())
