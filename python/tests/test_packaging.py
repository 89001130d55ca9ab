"""The installed wheel says what its license is and carries both license texts (pyproject's
PEP 639 `license` and `license-files`), the same texts as the repository's."""

import importlib.metadata as md
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_wheel_carries_its_license():
    dist = md.distribution("tpar")
    assert dist.metadata["License-Expression"] == "MIT OR Apache-2.0", dict(dist.metadata)
    carried = {os.path.basename(str(f)): f for f in dist.files or [] if "licenses" in str(f)}
    for name in ("LICENSE-MIT", "LICENSE-APACHE"):
        assert name in carried, f"{name} not in the wheel: {sorted(carried)}"
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            assert carried[name].read_text(encoding="utf-8") == f.read(), name
