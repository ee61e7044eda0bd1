"""Conditions for what a BatchedModel depends on outside its pods: its HPA and its scraping.

An HPA that cannot read carpool_queue_items (no custom-metrics adapter, nothing scraped) never
scales and says so only in its own status; a PodMonitor asked for in a cluster without the
Prometheus Operator's CRDs is simply not created. Both would go unnoticed, so they surface as
the BatchedModel's `Autoscaling` and `Monitoring` conditions (and, when they flip, events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carpool_operator.kube import KubeClient
from carpool_operator.spec import ModelSpec
from carpool_operator.status import Condition


def _hpa_conditions(hpa: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(item.get("type")): item for item in hpa.get("status", {}).get("conditions", [])}


def autoscaling_condition(hpa: Mapping[str, Any] | None) -> Condition | None:
    """The HPA's health in one condition; None until the HPA has reported anything."""
    if hpa is None:
        return None
    found = _hpa_conditions(hpa)
    if not found:
        return None
    able, active, limited = (
        found.get("AbleToScale", {}),
        found.get("ScalingActive", {}),
        found.get("ScalingLimited", {}),
    )
    if able.get("status") == "False":
        return Condition("Autoscaling", False, "NotAbleToScale", str(able.get("message", "")))
    if active.get("status") == "False":
        # FailedGetPodsMetric and kin: the custom-metrics API or the series is missing.
        reason = str(active.get("reason", ""))
        metrics_missing = reason.startswith("FailedGet") or reason == "InvalidMetricSourceType"
        message = str(active.get("message", ""))
        if metrics_missing:
            message += " (is a custom-metrics adapter serving carpool_queue_items? docs/install.md)"
        return Condition(
            "Autoscaling", False, "MetricsUnavailable" if metrics_missing else reason, message
        )
    if limited.get("status") == "True":
        message = f"{limited.get('reason', '')}: {limited.get('message', '')}"
        return Condition("Autoscaling", True, "ScalingLimited", message)
    return Condition("Autoscaling", True, "ScalingActive", str(active.get("message", "")))


def monitoring_condition(podmonitor_api: bool) -> Condition:
    if podmonitor_api:
        return Condition("Monitoring", True, "PodMonitorCreated", "the pods are scraped")
    return Condition(
        "Monitoring",
        False,
        "PodMonitorApiMissing",
        "monitoring.coreos.com/v1 PodMonitor is not served in this cluster, so nothing scrapes "
        "the pods: install the Prometheus Operator (e.g. kube-prometheus-stack)",
    )


async def dependency_conditions(kube: KubeClient, spec: ModelSpec) -> tuple[Condition, ...]:
    """The Autoscaling and Monitoring conditions that apply to `spec`, read from the cluster."""
    conditions: list[Condition] = []
    if spec.autoscaling.enabled:
        hpa = await kube.get("HorizontalPodAutoscaler", spec.namespace, spec.name)
        if (autoscaling := autoscaling_condition(hpa)) is not None:
            conditions.append(autoscaling)
    if spec.pod_monitor:
        conditions.append(monitoring_condition(await kube.serves("PodMonitor")))
    return tuple(conditions)
