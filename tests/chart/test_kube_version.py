"""The chart's oldest Kubernetes (Chart.yaml kubeVersion) serves what the pods it makes use.

Schemas cannot tell: an alpha field is in the schema of the release that brings it, behind a
feature gate that is off there, and the API server drops it without a word. The model server's
preStop hook is the kubelet's own sleep (PodLifecycleSleepAction, KEP-3960: alpha in 1.29,
beta and on by default from 1.30); a sleep of 0 s would need 1.33 (PodLifecycleSleepActionAllowZero,
KEP-4818), so none is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from carpool_operator.render import render

ROOT = Path(__file__).resolve().parents[2]
CHART = yaml.safe_load((ROOT / "charts" / "carpool" / "Chart.yaml").read_text())
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SLEEP_ACTION_ON = (1, 30)


def oldest() -> tuple[int, int]:
    floor = re.fullmatch(r">=(\d+)\.(\d+)\.\d+-0", CHART["kubeVersion"])
    assert floor is not None, CHART["kubeVersion"]
    return int(floor.group(1)), int(floor.group(2))


def sleeps(body: dict[str, Any]) -> Iterator[int]:
    """The preStop sleeps of the pods `body` makes."""
    for manifest in render(body):
        if manifest["kind"] != "Deployment":
            continue
        pod = manifest["spec"]["template"]["spec"]
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            sleep = container.get("lifecycle", {}).get("preStop", {}).get("sleep")
            if sleep is not None:
                yield int(sleep["seconds"])


def shutdown(seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": "m"},
        "spec": {"model": {"handler": "toy"}, "shutdown": {"drainDelaySeconds": seconds}},
    }


@pytest.mark.parametrize(
    "body",
    [*(yaml.safe_load(path.read_text()) for path in EXAMPLES), shutdown(1), shutdown(0)],
    ids=[*(path.name for path in EXAMPLES), "one-second-delay", "no-delay"],
)
def test_the_oldest_kubernetes_runs_the_prestop_sleep(body: dict[str, Any]) -> None:
    found = list(sleeps(body))
    if found:
        assert oldest() >= SLEEP_ACTION_ON
    assert all(seconds >= 1 for seconds in found)


def test_the_pods_use_the_sleep_action() -> None:
    """Else the floor above would guard nothing."""
    assert list(sleeps(shutdown(10))) == [10]
