"""`carpool render -f`: the operator's rendering, printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def carpool_render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "carpool", "render", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_prints_a_yaml_stream_of_children() -> None:
    result = carpool_render("-f", str(ROOT / "examples" / "minilm-gpu.yaml"))
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["ConfigMap", "Deployment", "Service"]

    result = carpool_render("-f", str(ROOT / "examples" / "minilm-gpu.yaml"), "--podmonitor")
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds[-1] == "PodMonitor"


def test_reports_an_unrealisable_spec(tmp_path: Path) -> None:
    body = {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": "odd"},
        "spec": {"model": {"handler": "no such handler"}},
    }
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(body))
    result = carpool_render("-f", str(path))
    assert result.returncode == 1
    assert "odd: InvalidHandler" in result.stderr
