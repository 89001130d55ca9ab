"""``python -m tpar.doctor``: the engine part (standard library only) and the native report.

The engine part reads this Python's installed distributions: with tpar installed here (as the
test run installs it), tpar's own entry points must be seen in both engines' plug-in groups.
"""

import json
import os
import subprocess
import sys

from tpar import doctor


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
