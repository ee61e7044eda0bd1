"""The Grafana dashboard: its structure, and every panel's PromQL against a live Prometheus."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard.gpu_exporters import RESERVED_PER_ALLOCATED, gpu_exporters
from dashboard.live import (
    IDLE_RATE_INTERVAL,
    MODEL,
    QUIET_MODEL,
    RATE_INTERVAL,
    LiveRun,
    live_metrics,
)
from dashboard.panels import (
    CUDA_ONLY,
    GENERATION,
    REPO,
    Panel,
    Query,
    load,
    panels,
    substitute,
)
from support.prometheus import Prometheus, Series, run_prometheus

DASHBOARD = load()
PANELS = panels(DASHBOARD)
METRIC_NAME = re.compile(r"\b(carpool_[a-z_]+?)(?:_bucket|_sum|_count)?\{")
QUANTILE_GROUPING = re.compile(r"histogram_quantile\([^,]+, sum by \(([^)]*)\)")
# A divisor that is filtered to positive values: no traffic gives no data rather than NaN.
GUARDED_RATIO = re.compile(r"\) / \(sum(?: by \([^)]*\) )?\(rate\([^)]*\)\) > 0\)$")
# The unit a panel must have when every metric it shows ends with this base unit.
UNIT_BY_SUFFIX = {"_seconds": "s", "_bytes": "bytes", "_ratio": "percentunit"}


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


def _metrics(panel: Panel) -> set[str]:
    return {name for query in panel.queries for name in METRIC_NAME.findall(query.expr)}


def test_every_panel_has_a_unit_and_a_description() -> None:
    for panel in DASHBOARD["panels"]:
        if panel["type"] == "row":
            continue
        assert len(panel.get("description", "")) > 20, panel["title"]
    for panel in PANELS:
        assert panel.unit, panel.title
        for suffix, unit in UNIT_BY_SUFFIX.items():
            if all(name.endswith(suffix) for name in _metrics(panel)):
                assert panel.unit == unit, f"{panel.title}: {panel.unit}, want {unit}"
        if _metrics(panel) <= {"carpool_requests_total", "carpool_rejected_total"}:
            assert panel.unit == "reqps", panel.title


def _quantile_queries(leaving: frozenset[str] = frozenset()) -> Iterator[tuple[Panel, Query]]:
    """The quantile queries of every panel but those titled in `leaving`."""
    for panel in PANELS:
        for query in panel.queries:
            if panel.title in leaving:
                continue
            if "histogram_quantile" in query.expr:
                yield panel, query


def test_quantiles_are_computed_per_model_and_named_by_it() -> None:
    """Buckets of different models summed together give a quantile of no model at all."""
    found = list(_quantile_queries())
    assert len(found) >= 10
    for panel, query in found:
        groupings = QUANTILE_GROUPING.findall(query.expr)
        assert groupings, f"{panel.title}: {query.expr}"
        for grouping in groupings:
            assert {label.strip() for label in grouping.split(",")} == {"le", "model"}, query.expr
        assert "{{model}}" in query.legend, f"{panel.title}: {query.legend}"


def test_ratios_and_quantiles_drop_nan() -> None:
    """0/0 and the quantile of empty buckets are NaN, which Grafana prints as "NaN"."""
    ratios = [(p, q) for p in PANELS for q in p.queries if " / " in q.expr]
    assert len(ratios) >= 3
    for panel, query in ratios:
        assert GUARDED_RATIO.search(query.expr), f"{panel.title}: {query.expr}"
    for panel, query in _quantile_queries():
        # NaN compares false: the filter keeps every quantile and drops NaN.
        assert query.expr.endswith(") >= 0"), f"{panel.title}: {query.expr}"


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


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """One live stack and load for every live check of this file."""
    with live_metrics(tmp_path_factory.mktemp("live"), load_seconds=12) as run:
        yield run


def _over_run(run: LiveRun, expr: str) -> list[Series]:
    return run.prometheus.query_range(expr, run.start, run.end, step_s=1)


@pytest.mark.slow
def test_every_panel_query_returns_data_from_a_live_stack(live: LiveRun) -> None:
    empty: list[str] = []
    unfiltered: list[str] = []
    for panel in PANELS:
        for query in panel.queries:
            expr = substitute(query.expr, rate=RATE_INTERVAL)
            # Also proves the query parses: a PromQL error raises with the message.
            shown_here = panel.title not in CUDA_ONLY | GENERATION
            if shown_here and not _has_data(_over_run(live, expr)):
                empty.append(f"{panel.title!r} [{query.legend}]: {expr}")
            # Picking another model or namespace must empty the panel.
            for other in ({"model": "other"}, {"namespace": "other"}):
                expr = substitute(query.expr, rate=RATE_INTERVAL, **other)
                if _has_data(_over_run(live, expr)):
                    unfiltered.append(f"{panel.title!r} [{query.legend}] {other}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not unfiltered, "panels that ignore a variable:\n" + "\n".join(unfiltered)


@pytest.mark.slow
def test_quantile_panels_draw_one_line_per_model(live: LiveRun) -> None:
    for panel, query in _quantile_queries(GENERATION):
        expr = substitute(query.expr, rate=RATE_INTERVAL)
        models = [str(one["metric"]["model"]) for one in _over_run(live, expr)]
        assert sorted(models) == sorted([MODEL, QUIET_MODEL]), f"{panel.title}: {expr}"
        expr = substitute(query.expr, rate=RATE_INTERVAL, model=QUIET_MODEL)
        models = [str(one["metric"]["model"]) for one in _over_run(live, expr)]
        assert models == [QUIET_MODEL], f"{panel.title}: {expr}"


@pytest.mark.slow
def test_no_panel_shows_nan_without_traffic(live: LiveRun) -> None:
    idle_rate = IDLE_RATE_INTERVAL
    for idle in ("carpool_request_duration_seconds_count", "carpool_batch_size_count"):
        shown = live.prometheus.query(f"sum(rate({idle}[{idle_rate}]))", at=live.end)
        assert [float(one["value"][1]) for one in shown] == [0.0], idle
    for panel in PANELS:
        for query in panel.queries:
            expr = substitute(query.expr, rate=idle_rate)
            for one in live.prometheus.query(expr, at=live.end):
                value = float(one["value"][1])
                assert not math.isnan(value), f"{panel.title} [{query.legend}]: {expr}"


def _per_step(series: list[Series]) -> dict[float, float]:
    """Values of several series added up at each timestamp."""
    total: dict[float, float] = {}
    for one in series:
        for at, value in one["values"]:
            total[float(at)] = total.get(float(at), 0.0) + float(value)
    return total


@pytest.mark.slow
def test_heatmap_cells_add_up_to_the_batches_per_second_panel(live: LiveRun) -> None:
    """A column of the heatmap, all buckets together (le="+Inf"), is every batch of that time."""
    heatmap = next(p for p in PANELS if p.title == "Batch size distribution")
    dispatch = next(p for p in PANELS if p.title == "Batches per second by dispatch reason")
    cells = _over_run(live, substitute(heatmap.queries[0].expr, rate=RATE_INTERVAL))
    every_size = _per_step([one for one in cells if one["metric"]["le"] == "+Inf"])
    reasons = _per_step(_over_run(live, substitute(dispatch.queries[0].expr, rate=RATE_INTERVAL)))
    busy = [at for at, value in reasons.items() if value > 0]
    assert len(busy) >= 5
    for at in busy:
        assert every_size[at] == pytest.approx(reasons[at], rel=0.05), (
            f"at {at}: heatmap {every_size[at]} batches/s, dispatch panel {reasons[at]}"
        )


@pytest.mark.slow
def test_gpu_memory_panel_draws_each_pod_rather_than_their_sum(tmp_path: Path) -> None:
    """Two model servers, each with its own cuda:0: two lines at their own values.

    A CPU machine has no CUDA gauges, so two small exporters stand in for the model servers.
    """
    panel = next(p for p in PANELS if p.title == "GPU memory")
    allocated = [1e9, 3e9]
    wanted = {"allocated": allocated, "reserved": [v * RESERVED_PER_ALLOCATED for v in allocated]}
    with (
        gpu_exporters(MODEL, "cuda:0", allocated) as targets,
        run_prometheus(tmp_path, {"model-server": targets}) as prometheus,
    ):
        prometheus.wait_for_targets(timeout_s=30)
        for query in panel.queries:
            shown = _lines(prometheus, substitute(query.expr), count=len(targets))
            values = sorted(float(one["value"][1]) for one in shown)
            assert values == wanted[query.legend.split()[0]], f"{query.expr}: {shown}"
            assert {one["metric"]["instance"] for one in shown} == set(targets)
            assert {one["metric"]["device"] for one in shown} == {"cuda:0"}


def _lines(prometheus: Prometheus, expr: str, count: int, timeout_s: float = 10.0) -> list[Series]:
    """The query's series now, once there are at least `count` (each target scraped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        shown = prometheus.query(expr)
        if len(shown) >= count or time.monotonic() > deadline:
            return shown
        time.sleep(0.2)


def test_cuda_only_panels_are_the_gpu_ones() -> None:
    """The live test skips these on CPU; they must read the CUDA-only gauges and nothing else."""
    for panel in PANELS:
        if panel.title in CUDA_ONLY:
            for query in panel.queries:
                assert "carpool_model_gpu_memory_" in query.expr
