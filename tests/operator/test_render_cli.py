"""`carpool render -f`: the operator's rendering, printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
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
    assert result.returncode == 2
    assert "odd: InvalidHandler" in result.stderr


def write(tmp_path: Path, spec: dict[str, Any], name: str = "bad") -> Path:
    body = {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": {"model": {"handler": "toy"}, **spec},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


WRONG = {
    "negative-replicas": ({"replicas": -3}, "spec.replicas: Invalid value: -3"),
    "two-weight-sources": (
        {"model": {"handler": "toy", "weights": {"pvc": {"claimName": "w"}, "image": {}}}},
        "weights needs exactly one of image, pvc, uri or storageUri",
    ),
    "huge-batch": ({"batching": {"maxBatchSize": 100000}}, "less than or equal to 1024"),
    "replicas-as-words": ({"replicas": "two"}, "spec.replicas in body must be of type integer"),
    "gpu-as-words": ({"resources": {"gpu": "one"}}, "must be of type integer"),
    "pull-secret-as-string": ({"imagePullSecrets": ["x"]}, "must be of type object"),
    "fp16-on-cpu": ({"model": {"handler": "toy", "dtype": "fp16", "device": "cpu"}}, "fp16 needs"),
    "env-named-twice": (
        {"model": {"handler": "toy", "env": [{"name": "A"}, {"name": "A", "value": "1"}]}},
        "bad: Rejected: the API server would refuse Deployment bad: "
        '.spec.template.spec.containers[name="model-server"].env: duplicate entries for key '
        '[name="A"]',
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_refuses_what_the_api_server_refuses(tmp_path: Path, case: str) -> None:
    spec, message = WRONG[case]
    result = carpool_render("-f", str(write(tmp_path, spec)))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert result.stdout == ""


def test_one_line_per_problem(tmp_path: Path) -> None:
    path = write(tmp_path, {"replicas": -3, "resources": {"gpu": "one"}}, name="odd")
    result = carpool_render("-f", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().split("\n")
    assert len(lines) == 2, lines
    assert all(line.startswith("odd: ") for line in lines)

    result = carpool_render("-f", str(write(tmp_path, {}, name="1model")))
    assert result.returncode == 2
    assert result.stderr.startswith("1model: metadata.name: ")
    assert "DNS-1035" in result.stderr


def test_output_has_no_yaml_anchors() -> None:
    result = carpool_render("-f", str(ROOT / "examples" / "minilm-gpu.yaml"))
    assert result.returncode == 0, result.stderr
    assert "&id" not in result.stdout and "*id" not in result.stdout
