"""The Grafana dashboard: its structure, and every panel's PromQL against a live Prometheus."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from dashboard.live import RATE_INTERVAL, live_metrics
from dashboard.panels import CUDA_ONLY, REPO, load, panels, substitute

DASHBOARD = load()
PANELS = panels(DASHBOARD)
METRIC_NAME = re.compile(r"\b(carpool_[a-z_]+?)(?:_bucket|_sum|_count)?\{")


def documented_metrics() -> set[str]:
    """Metric names in the tables of docs/architecture.md, the contract with the sidecar."""
    text = (REPO / "docs" / "architecture.md").read_text()
    return set(re.findall(r"^\| `(carpool_[a-z_]+)` \|", text, re.MULTILINE))


def test_dashboard_has_the_variables_users_filter_by() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "model"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"


def test_panels_cover_the_batching_story() -> None:
    titles = {panel.title for panel in PANELS}
    for wanted in (
        "Request rate by code",
        "Request latency",
        "Queue wait p95",
        "Batch size distribution",
        "Mean items per batch",
        "Batches per second by dispatch reason",
        "Queue items and in-flight batches",
        "Rejections by reason",
        "Model batch duration",
        "Padding ratio",
        "GPU memory",
    ):
        assert wanted in titles
    assert next(p for p in PANELS if p.title == "Batch size distribution").kind == "heatmap"


def test_every_query_uses_documented_metrics_and_both_filters() -> None:
    known = documented_metrics()
    assert "carpool_batch_size" in known
    for panel in PANELS:
        for query in panel.queries:
            used = set(METRIC_NAME.findall(query.expr))
            assert used, f"{panel.title}: no carpool metric in {query.expr}"
            assert used <= known, f"{panel.title}: undocumented {used - known}"
            selectors = re.findall(r"carpool_\w+\{([^}]*)\}", query.expr)
            for selector in selectors:
                assert 'namespace=~"$namespace"' in selector, f"{panel.title}: {query.expr}"
                assert 'model=~"$model"' in selector, f"{panel.title}: {query.expr}"


def test_every_panel_uses_the_datasource_variable_and_has_a_place() -> None:
    ids: set[int] = set()
    for panel in DASHBOARD["panels"]:
        assert panel["id"] not in ids
        ids.add(panel["id"])
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def _has_data(series: list[dict[str, object]]) -> bool:
    """At least one finite sample: NaN is what quantiles of empty histograms return."""
    for one in series:
        values = one.get("values")
        assert isinstance(values, list)
        if any(math.isfinite(float(value)) for _, value in values):
            return True
    return False


@pytest.mark.slow
def test_every_panel_query_returns_data_from_a_live_stack(tmp_path: Path) -> None:
    empty: list[str] = []
    unfiltered: list[str] = []
    with live_metrics(tmp_path, load_seconds=12) as run:
        for panel in PANELS:
            for query in panel.queries:
                expr = substitute(query.expr, rate=RATE_INTERVAL)
                # Also proves the query parses: a PromQL error raises with the message.
                series = run.prometheus.query_range(expr, run.start, run.end, step_s=1)
                if panel.title not in CUDA_ONLY and not _has_data(series):
                    empty.append(f"{panel.title!r} [{query.legend}]: {expr}")
                # Picking another model or namespace must empty the panel.
                for other in ({"model": "other"}, {"namespace": "other"}):
                    expr = substitute(query.expr, rate=RATE_INTERVAL, **other)
                    if _has_data(run.prometheus.query_range(expr, run.start, run.end, step_s=1)):
                        unfiltered.append(f"{panel.title!r} [{query.legend}] {other}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not unfiltered, "panels that ignore a variable:\n" + "\n".join(unfiltered)


def test_cuda_only_panels_are_the_gpu_ones() -> None:
    """The live test skips these on CPU; they must read the CUDA-only gauges and nothing else."""
    for panel in PANELS:
        if panel.title in CUDA_ONLY:
            for query in panel.queries:
                assert "carpool_model_gpu_memory_" in query.expr
