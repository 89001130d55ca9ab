"""``python -m tpar.doctor``: this Python's facts (standard library only), judged by the native
engine rules (``tpar/src/doctor/rules.rs``, the rules' one home), and the native report.

The facts read this Python's installed distributions: with tpar installed here (as the test
run installs it), tpar's own entry points must be seen in both engines' plug-in groups.
"""

import ast
import json
import os
import subprocess
import sys

from tpar import _tpar, doctor


def _by_setting(section, name):
    hits = [f for f in section["findings"] if f["setting"] == name]
    assert hits, [f["setting"] for f in section["findings"]]
    return hits[0]


def test_an_allow_list_without_tpar_is_named_with_its_fix(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "lora")
    monkeypatch.setenv("SGLANG_PLUGINS", " other ")
    v = _by_setting(doctor.engine_section(8, ["sm_90"], "vllm"), "VLLM_PLUGINS")
    assert (v["applies"], v["severity"], v["fix"]) == ("yes", "blocks", "export VLLM_PLUGINS=lora,tpar")
    s = _by_setting(doctor.engine_section(8, ["sm_90"], "sglang"), "SGLANG_PLUGINS")
    assert (s["applies"], s["fix"]) == ("yes", "export SGLANG_PLUGINS=other,tpar")
    monkeypatch.setenv("VLLM_PLUGINS", "tpar,lora")
    assert _by_setting(doctor.engine_section(8, ["sm_90"], "vllm"), "VLLM_PLUGINS")["applies"] == "no"


def test_flashinfer_on_sm120_or_at_an_unsupported_tp_does_not_apply(monkeypatch):
    monkeypatch.delenv("VLLM_ALLREDUCE_USE_FLASHINFER", raising=False)
    for tp, archs in ((8, ["sm_120"]), (3, ["sm_90"])):
        f = _by_setting(doctor.engine_section(tp, archs, "vllm"), "VLLM_ALLREDUCE_USE_FLASHINFER")
        assert f["applies"] == "no", (tp, archs, f)


def test_tpar_installed_here_is_seen_with_both_plugins():
    t = doctor.engine_section(2, [], "all")["tpar"]
    assert t["installed"] and t["importable"], t
    groups = {p["group"] for p in t["plugins"]}
    assert groups == {"vllm.general_plugins", "sglang.srt.plugins"}, t["plugins"]


def test_the_python_twin_prints_the_native_report():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPAR_", "VLLM_", "SGLANG_"))}
    out = subprocess.run(
        [sys.executable, "-m", "tpar.doctor", "--topology", "h200-nvswitch-8", "--engine", "vllm", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    r = json.loads(out.stdout)
    assert r["tp"] == 8 and len(r["size_classes"]) == 10, r["size_classes_note"]
    assert r["engine"]["tpar"]["installed"], r["engine"]
    assert any(p["line"] == "export TPAR_ENABLE=1" for p in r["paste"]), r["paste"]
    text = subprocess.run([sys.executable, "-m", "tpar.doctor", "--topology", "pcie-2"], capture_output=True, text=True, env=env, check=True).stdout
    assert "== Fabric ==" in text and "== Paste" in text, text


def test_the_facts_answer_exactly_what_the_native_rules_ask(monkeypatch):
    query = json.loads(_tpar.doctor_query())
    assert "VLLM_ALLREDUCE_USE_FLASHINFER" in query["variables"] and "vllm.general_plugins" in query["plugin_groups"], query
    monkeypatch.setenv("VLLM_USE_NCCL_SYMM_MEM", "1")
    f = doctor.facts(query)
    assert sorted(f["variables"]) == sorted(query["variables"]), f["variables"]
    assert sorted(f["versions"]) == sorted(query["distributions"]), f["versions"]
    assert sorted(f["entry_points"]) == sorted(query["plugin_groups"]), f["entry_points"]
    assert f["variables"]["VLLM_USE_NCCL_SYMM_MEM"] == "1"
    # Judged natively: the facts above decide the finding.
    judged = json.loads(_tpar.doctor_engine(json.dumps(f), "vllm", 8, ["sm_90"]))
    assert _by_setting(judged, "VLLM_USE_NCCL_SYMM_MEM")["applies"] == "yes", judged["findings"]
    assert _by_setting(doctor.engine_section(8, ["sm_90"], "vllm"), "VLLM_USE_NCCL_SYMM_MEM") == _by_setting(judged, "VLLM_USE_NCCL_SYMM_MEM")


def test_the_python_doctor_hard_codes_no_engine_rule():
    """The engine rules live once, in Rust: doctor.py names none of the variables, plug-in groups
    or GPU architectures they read (a rule copied back into Python would name them)."""
    query = json.loads(_tpar.doctor_query())
    names = set(query["variables"]) | set(query["plugin_groups"])
    # The repository's copy: the one `tpar doctor` carries (include_str!) and the wheel installs.
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tpar", "doctor.py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and not (n.value.startswith(("``", '"""')) or "\n" in n.value)]
    for c in consts:
        hits = [n for n in names if n in c] + (["sm_"] if "sm_" in c else [])
        assert not hits, "python/tpar/doctor.py names %s in %r: the engine rules belong in tpar/src/doctor/rules.rs" % (hits, c)
