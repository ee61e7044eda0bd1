"""bench/hop.py model-cpu: the stand-in's model server CPU per item, two trees side by side."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_model_cpu_measures_this_tree_beside_a_baseline(tmp_path: Path) -> None:
    # The baseline: a checkout without a .venv of its own (run through its sources on the
    # path), here this tree's sources again, so the ratio is about 1; a baseline is named
    # by its folder.
    baseline = tmp_path / "baseline"
    for part in ("carpool", "model_server", "sidecar"):
        (baseline / part).mkdir(parents=True)
        (baseline / part / "src").symlink_to(REPO / part / "src")
    command = [sys.executable, str(REPO / "bench" / "hop.py"), "model-cpu", "--rounds", "2"]
    command += ["--seconds", "0.5", "--batch", "8", "--baseline", str(baseline)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for tree in ("baseline", "this"):
        line = re.search(rf"{tree}: items/s +(\d+) +model server us/item +([\d.]+)", done.stdout)
        assert line is not None, done.stdout
        assert int(line.group(1)) > 0 and float(line.group(2)) > 0
    ratio = re.search(r"model server CPU per item ([\d.]+)x", done.stdout)
    assert ratio is not None and 0.2 < float(ratio.group(1)) < 5, done.stdout
