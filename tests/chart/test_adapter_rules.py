"""The chart's prometheus-adapter rule, evaluated as the adapter does for an HPA, on a real
Prometheus scraping the sidecar's own metrics."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.rendering import by_kind, render
from prometheus_client import CollectorRegistry, generate_latest
from support.prometheus import run_prometheus, static_exporter

from carpool.engine.metrics import SidecarMetrics

# (namespace, pod) -> items queued in that pod's sidecar
QUEUES = {("ml", "m-7d9f-a"): 6, ("ml", "m-7d9f-b"): 2, ("other", "m-5c2e-a"): 50}


# The predicted drain of a queue: seconds per queued item.
DRAIN_S = 0.25


def sidecar_metrics(queued: int) -> bytes:
    """A sidecar's metrics, `queued` items waiting, as its /metrics would serve them."""
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, model="m")
    metrics.queue_items.set(queued)
    metrics.queue_drain.set(queued * DRAIN_S)
    return generate_latest(registry)


def adapter_rule(metric: str = "carpool_queue_items") -> dict[str, Any]:
    manifests = render(sets=("customMetrics.adapterRules.enabled=true",))
    (rules,) = [m for m in by_kind(manifests, "ConfigMap") if "config.yaml" in m["data"]]
    (rule,) = [
        rule
        for rule in yaml.safe_load(rules["data"]["config.yaml"])["rules"]
        if rule["name"]["as"] == metric
    ]
    return dict(rule)


@pytest.mark.parametrize(
    "metric,per_item", [("carpool_queue_items", 1.0), ("carpool_queue_drain_seconds", DRAIN_S)]
)
def test_the_rule_gives_each_pod_its_queue(tmp_path: Path, metric: str, per_item: float) -> None:
    rule = adapter_rule(metric)
    with ExitStack() as stack:
        jobs, labels = {}, {}
        for (namespace, pod), queued in QUEUES.items():
            jobs[pod] = [stack.enter_context(static_exporter(sidecar_metrics(queued)))]
            # What the PodMonitor's scrape adds to every series of a pod.
            labels[pod] = {"namespace": namespace, "pod": pod}
        prometheus = stack.enter_context(run_prometheus(tmp_path, jobs, labels=labels))
        prometheus.wait_for_targets()

        # Discovery: the adapter lists the series its seriesQuery matches.
        series = prometheus.api("series", {"match[]": rule["seriesQuery"]})
        assert {(s["namespace"], s["pod"]) for s in series} == set(QUEUES)

        # The HPA of the model in `ml` asks for its pods: the adapter fills the template so.
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", rule["name"]["as"])
            .replace("<<.LabelMatchers>>", 'namespace="ml",pod=~"m-7d9f-a|m-7d9f-b"')
            .replace("<<.GroupBy>>", "pod")
        )
        found = {s["metric"]["pod"]: float(s["value"][1]) for s in prometheus.query(query)}
        assert found == {"m-7d9f-a": 6 * per_item, "m-7d9f-b": 2 * per_item}
