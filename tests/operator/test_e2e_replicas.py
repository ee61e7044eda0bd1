"""End to end: who sets a model's replica count, and how it changes hands without a dip.

carpool applies `spec.replicas` (server-side, forced) until an autoscaler takes the count: its
own HPA (`spec.autoscaling.enabled`) or another controller (`spec.autoscaling.external`, e.g. a
KEDA ScaledObject). An autoscaler writes through the Deployment's `/scale` subresource, as
`kubectl scale` does here; what it writes stays.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.kube_cluster import OPERATOR_AGENT, Cluster
from support.kube_models import applied, model, wait_resyncs

AUTOSCALED = {"enabled": True, "minReplicas": 2, "maxReplicas": 8}


def scale(cluster: Cluster, name: str, replicas: int) -> None:
    """What an HPA does: write the Deployment's /scale."""
    cluster.kubectl("scale", "deployment", name, f"--replicas={replicas}")


def running(cluster: Cluster, name: str, count: int) -> None:
    """A model whose `count` replicas carpool set."""
    applied(cluster, model(name, replicas=count))
    wait_replicas(cluster, name, count)


def wait_replicas(cluster: Cluster, name: str, count: int) -> None:
    cluster.wait_for_object("deployment", name, lambda found: found["spec"]["replicas"] == count)


def replicas(cluster: Cluster, name: str) -> int:
    found = cluster.get("deployment", name)
    assert found is not None
    return int(found["spec"]["replicas"])


def replicas_owners(cluster: Cluster, name: str) -> set[str]:
    """The field managers of the Deployment's spec.replicas."""
    shown = cluster.kubectl("get", "deployment", name, "-o", "json", "--show-managed-fields")
    entries: list[dict[str, Any]] = json.loads(shown.stdout)["metadata"]["managedFields"]
    return {e["manager"] for e in entries if "f:replicas" in e["fieldsV1"].get("f:spec", {})}


def operator_requests(cluster: Cluster, kind: str, name: str) -> list[tuple[int, str]]:
    """(position in the request log, method) of the operator's writes to one child."""
    assert cluster.api is not None
    group = {"deployments": "apis/apps/v1", "horizontalpodautoscalers": "apis/autoscaling/v2"}
    path = f"/{group[kind]}/namespaces/{cluster.namespace}/{kind}/{name}"
    return [
        (index, record.method)
        for index, record in enumerate(list(cluster.api.records))
        if record.path == path and OPERATOR_AGENT in record.agent and record.method != "GET"
    ]


@pytest.mark.parametrize(("count", "kept"), [(4, 4), (0, 1)])
def test_turning_autoscaling_on_keeps_the_running_replicas(
    cluster: Cluster, count: int, kept: int
) -> None:
    """Kept, not the API server's default of one, until the HPA decides; but a model at zero
    starts at one, as an HPA leaves a target at zero alone."""
    name = f"e2e-scale-on-{count}"
    running(cluster, name, count)

    cluster.apply(model(name, replicas=count, autoscaling=AUTOSCALED))
    cluster.wait_for_object("hpa", name)
    wait_resyncs(cluster)
    assert replicas(cluster, name) == kept
    assert "carpool" not in replicas_owners(cluster, name)

    scale(cluster, name, 6)
    wait_resyncs(cluster)
    assert replicas(cluster, name) == 6


def test_an_external_scaler_sets_replicas_without_a_fight(cluster: Cluster) -> None:
    name = "e2e-external"
    running(cluster, name, 3)

    cluster.apply(model(name, replicas=3, autoscaling={"external": True}))
    wait_resyncs(cluster)
    assert replicas(cluster, name) == 3
    assert cluster.get("hpa", name) is None  # the external scaler brings its own
    cluster.wait_for_object("pdb", name)  # its count may grow at any time

    before = operator_requests(cluster, "deployments", name) if cluster.api is not None else []
    for wanted in (5, 2, 4):
        scale(cluster, name, wanted)
        wait_resyncs(cluster)
        assert replicas(cluster, name) == wanted
    if cluster.api is not None:
        # Watch events and resyncs came and went; the operator wrote nothing to the Deployment.
        assert operator_requests(cluster, "deployments", name) == before

    # Off again: spec.replicas, forced, taken from the scaler.
    cluster.apply(model(name, replicas=3))
    wait_replicas(cluster, name, 3)
    assert replicas_owners(cluster, name) == {"carpool"}


def test_turning_autoscaling_off_takes_replicas_back(cluster: Cluster) -> None:
    name = "e2e-scale-off"
    applied(cluster, model(name, replicas=3, autoscaling=AUTOSCALED))
    cluster.wait_for_object("hpa", name)
    scale(cluster, name, 6)
    wait_resyncs(cluster)
    assert replicas(cluster, name) == 6

    cluster.apply(model(name, replicas=3))
    cluster.wait_gone("hpa", name)
    wait_replicas(cluster, name, 3)
    wait_resyncs(cluster)
    assert replicas(cluster, name) == 3
    assert replicas_owners(cluster, name) == {"carpool"}
    if cluster.api is not None:
        # The HPA went first: it cannot scale the Deployment after carpool took replicas back.
        hpa = operator_requests(cluster, "horizontalpodautoscalers", name)
        (deleted,) = [index for index, method in hpa if method == "DELETE"]
        took_back = operator_requests(cluster, "deployments", name)[-1][0]
        assert deleted < took_back
