"""A GPU cluster's install, as docs/install.md shows it, against the test API server: the
chart with ci/gpu-values.yaml, then the GPU and autoscaled examples under its operator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from chart.chart_operator import run_chart_operator
from chart.rendering import CHART, NAMESPACE, RELEASE, REPO, render, run_helm
from support.kube_cluster import Cluster

GPU_VALUES = CHART / "ci" / "gpu-values.yaml"
CUDA_IMAGE = (
    "registry.example.com/ml/carpool"
    "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)


def example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    body["metadata"]["namespace"] = NAMESPACE
    return body


def conditions(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    found = cluster.get("bm", name) or {}
    return {item["type"]: item for item in found.get("status", {}).get("conditions", [])}


def test_gpu_install_runs_the_cuda_image_and_wires_autoscaling(
    cluster: Cluster, tmp_path: Path
) -> None:
    notes = run_helm(
        cluster, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
        "--values", str(GPU_VALUES),
    )  # fmt: skip
    assert "rules.existing=carpool-adapter-rules" in notes
    rules = cluster.kubectl("get", "configmap", "carpool-adapter-rules", "-n", "monitoring",
                            "-o", "yaml").stdout  # fmt: skip
    assert "carpool_queue_items" in rules

    with run_chart_operator(render(GPU_VALUES), cluster, tmp_path / "operator.log"):
        cluster.apply(example("minilm-gpu.yaml"))
        cluster.apply(example("autoscaled.yaml"))

        deployment = cluster.wait_for_object("deployment", "minilm")
        pod = deployment["spec"]["template"]["spec"]
        server, sidecar = pod["containers"]
        assert server["image"] == CUDA_IMAGE
        assert "--require-gpu" in server["command"]
        # The sidecar image: no torch, no CUDA.
        assert sidecar["image"].startswith("ghcr.io/carpool-dev/carpool-sidecar:")
        assert pod["runtimeClassName"] == "nvidia"
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {
            "maxSurge": 0,
            "maxUnavailable": 1,
        }

        # The autoscaled example: its HPA, and a PodMonitor this cluster cannot serve.
        cluster.wait_for_object("hpa", "toy")
        cluster.wait_for(
            "the Monitoring condition of toy",
            lambda: (
                conditions(cluster, "toy").get("Monitoring", {}).get("reason")
                == "PodMonitorApiMissing"
            ),
        )
        toy = cluster.wait_for_object("deployment", "toy")
        assert "runtimeClassName" not in toy["spec"]["template"]["spec"]  # CPU pods keep theirs
