"""BatchedModels for the operator's end-to-end scenarios, and ways to wait on what it reports."""

from __future__ import annotations

from typing import Any

from support.kube_cluster import Cluster
from support.operator_metrics import resyncs


def model(name: str, **spec: Any) -> dict[str, Any]:
    """A toy model on the CPU with half a core; `spec` keys replace or add top-level fields."""
    body: dict[str, Any] = {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": {"model": {"handler": "toy", "device": "cpu"}, "resources": {"cpu": "500m"}},
    }
    body["spec"].update(spec)
    return body


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type `kind`, or {} while there is none."""
    for item in body.get("status", {}).get("conditions", []):
        if item["type"] == kind:
            return dict(item)
    return {}


def applied(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    """Apply a BatchedModel and wait until the operator reported on it."""
    cluster.apply(body)
    name = body["metadata"]["name"]
    return cluster.wait_for_object("bm", name, lambda found: bool(condition(found, "Ready")))


def degraded(cluster: Cluster, name: str, reason: str, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until the BatchedModel reports Degraded with this reason."""

    def probe() -> dict[str, Any] | None:
        found = cluster.get("bm", name)
        if found is None:
            return None
        state = condition(found, "Degraded")
        return found if state.get("status") == "True" and state["reason"] == reason else None

    return cluster.wait_for(f"{name} Degraded with {reason}", probe, timeout=timeout)


def wait_resyncs(cluster: Cluster, count: int = 2) -> None:
    """Let the operator's periodic resync pass over every model `count` more times."""
    port = cluster.operator_metrics_port
    start = resyncs(port)
    # The pass under way now may have begun before the caller's change: it does not count.
    cluster.wait_for(f"{count} resyncs", lambda: resyncs(port) >= start + count + 1)
