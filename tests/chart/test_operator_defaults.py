"""Defaults set in the chart's values reach the pods the operator creates; a spec beats them.

The real operator runs with the env of the chart's Deployment against the test API server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart.chart_operator import run_chart_operator
from chart.rendering import REPO, render
from support.kube_api import ServedKubeApi
from support.kube_cluster import Cluster

CRD = REPO / "crds" / "batchedmodels.carpool.dev.yaml"
CHART_SETS = (
    "defaults.maxBatchSize=48",
    "defaults.maxWaitMs=12",
    "defaults.dispatch=fixed",
    "images.sidecar.repository=registry.example.com/carpool-sidecar",
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ServedKubeApi() as served:
        kubeconfig = served.write_kubeconfig(tmp_path / "kubeconfig")
        test_cluster = Cluster(kubeconfig, "default", served.api)
        test_cluster.kubectl("apply", "-f", str(CRD))
        yield test_cluster


def model(name: str, **batching: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"handler": "toy", "device": "cpu"}}
    if batching:
        spec["batching"] = batching
    return {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": spec,
    }


def settings(cluster: Cluster, name: str) -> dict[str, Any]:
    config = cluster.wait_for_object("configmap", f"{name}-batching")
    loaded: dict[str, Any] = json.loads(config["data"]["batching.json"])
    return loaded


def test_chart_defaults_reach_the_config_map_and_a_spec_overrides_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    with run_chart_operator(render(sets=CHART_SETS), cluster, tmp_path / "operator.log"):
        cluster.apply(model("plain"))
        cluster.apply(model("tuned", maxBatchSize=8, dispatch="adaptive"))

        plain = settings(cluster, "plain")
        assert (plain["maxBatchSize"], plain["maxWaitMs"], plain["dispatch"]) == (48, 12, "fixed")
        assert plain["timeoutMs"] == 30000  # the chart's default values, unchanged
        tuned = settings(cluster, "tuned")
        assert (tuned["maxBatchSize"], tuned["maxWaitMs"], tuned["dispatch"]) == (8, 12, "adaptive")

        # The values in use are in the status, and so in `kubectl get`'s columns.
        for name, expected in (("plain", plain), ("tuned", tuned)):
            cluster.wait_for_object(
                "bm", name, lambda found, e=expected: found.get("status", {}).get("batching") == e
            )
        table = cluster.kubectl("get", "bm", "plain", "tuned").stdout.splitlines()
        header = table[0].split()
        columns = [dict(zip(header, row.split(), strict=False)) for row in table[1:]]
        assert [(row["NAME"], row["MAXBATCH"], row["MAXWAIT"]) for row in columns] == [
            ("plain", "48", "12"),
            ("tuned", "8", "12"),
        ]

        deployment = cluster.wait_for_object("deployment", "plain")
        pod = deployment["spec"]["template"]["spec"]
        images = {container["name"]: container["image"] for container in pod["containers"]}
        assert images == {
            "model-server": "ghcr.io/carpool-dev/carpool-model-server:0.1.0",
            "sidecar": "registry.example.com/carpool-sidecar:0.1.0",
        }
