"""The HPA's health and a missing monitoring API show in the BatchedModel's conditions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.kube_api import Kind
from support.kube_cluster import Cluster
from support.kube_models import condition, model

from carpool_operator.autoscaling_status import autoscaling_condition


def waits_for(cluster: Cluster, name: str, kind: str, status: str, reason: str) -> dict[str, Any]:
    def reached(found: dict[str, Any]) -> bool:
        current = condition(found, kind)
        return (current.get("status"), current.get("reason")) == (status, reason)

    return condition(cluster.wait_for_object("bm", name, reached), kind)


def hpa_reports(cluster: Cluster, name: str, *conditions: dict[str, str]) -> None:
    """What the HPA controller would write (no controller runs on the test API server)."""
    status = {"currentReplicas": 2, "desiredReplicas": 2, "conditions": list(conditions)}
    cluster.kubectl(
        "patch", "hpa", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


ABLE = {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": "ok"}


def test_hpa_without_metrics_is_reported(cluster: Cluster) -> None:
    if cluster.api is None:
        pytest.skip("a real cluster's HPA controller writes its own status")
    autoscaling = {"enabled": True, "minReplicas": 2, "maxReplicas": 3}
    cluster.apply(model("dep-scaled", autoscaling=autoscaling))
    cluster.wait_for_object("hpa", "dep-scaled")
    failed = {
        "type": "ScalingActive",
        "status": "False",
        "reason": "FailedGetPodsMetric",
        "message": "unable to get metric carpool_queue_items: no custom metrics API registered",
    }
    hpa_reports(cluster, "dep-scaled", ABLE, failed)
    found = waits_for(cluster, "dep-scaled", "Autoscaling", "False", "MetricsUnavailable")
    assert "carpool_queue_items" in found["message"] and "adapter" in found["message"]

    active = {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}
    limited = {
        "type": "ScalingLimited",
        "status": "True",
        "reason": "TooManyReplicas",
        "message": "the desired replica count is more than the maximum replica count",
    }
    hpa_reports(cluster, "dep-scaled", ABLE, {**active, "message": "ok"}, limited)
    found = waits_for(cluster, "dep-scaled", "Autoscaling", "True", "ScalingLimited")
    assert found["message"].startswith("TooManyReplicas")


def test_missing_monitoring_api_is_a_condition(cluster: Cluster) -> None:
    if cluster.api is None:
        pytest.skip("whether a real cluster serves monitoring.coreos.com is not ours to change")
    cluster.apply(model("dep-monitored", monitoring={"podMonitor": True}))
    found = waits_for(cluster, "dep-monitored", "Monitoring", "False", "PodMonitorApiMissing")
    assert "kube-prometheus-stack" in found["message"]

    cluster.api.serve_kind(Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"))
    waits_for(cluster, "dep-monitored", "Monitoring", "True", "PodMonitorCreated")


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], None),
        (
            [{"type": "AbleToScale", "status": "False", "reason": "FailedGetScale"}],
            ("Autoscaling", False, "NotAbleToScale"),
        ),
        (
            [ABLE, {"type": "ScalingActive", "status": "False", "reason": "ScalingDisabled"}],
            ("Autoscaling", False, "ScalingDisabled"),
        ),
        (
            [ABLE, {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}],
            ("Autoscaling", True, "ScalingActive"),
        ),
    ],
)
def test_hpa_conditions_become_one_condition(
    conditions: list[dict[str, str]], expected: tuple[str, bool, str] | None
) -> None:
    found = autoscaling_condition({"status": {"conditions": conditions}})
    summary = None if found is None else (found.type, found.status, found.reason)
    assert summary == expected
