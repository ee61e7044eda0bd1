"""Plot what the dashboard shows, from a live run: the pictures in docs/dashboard.md.

    PYTHONPATH=tests .venv/bin/python tests/dashboard/snapshot.py docs/images

Starts the same stack and load as the dashboard test (live.py), runs every panel's PromQL over
the run through Prometheus' HTTP API, and draws one figure in the dashboard's layout:
stat panels as numbers, time series as lines, the batch-size heatmap as a heatmap.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from dashboard.live import RATE_INTERVAL, live_metrics
from dashboard.panels import CUDA_ONLY, Panel, load, panels, substitute

Series = list[dict[str, Any]]


def _label(legend: str, metric: dict[str, str]) -> str:
    for key, value in metric.items():
        legend = legend.replace("{{" + key + "}}", value)
    return legend


def _points(series: dict[str, Any], start: float) -> tuple[list[float], list[float]]:
    times = [float(t) - start for t, _ in series["values"]]
    values = [float(v) for _, v in series["values"]]
    return times, values


def _last_finite(series: dict[str, Any]) -> float | None:
    """The last value that is a number, as Grafana's "last not null" shows it."""
    finite = [float(v) for _, v in series["values"] if math.isfinite(float(v))]
    return finite[-1] if finite else None


def _draw_stat(axes: Any, panel: Panel, results: list[Series]) -> None:
    """One number per series, named by its legend when there are several (one per model)."""
    shown = [
        (_label(query.legend, one["metric"]), value)
        for query, result in zip(panel.queries, results, strict=True)
        for one in result
        if (value := _last_finite(one)) is not None
    ]
    unit = {"reqps": " req/s", "s": " s"}.get(panel.unit, "")
    lines = [
        (f"{value:,.0f}" if value >= 100 else f"{value:.3g}") + unit
        + (f"  {label}" if len(shown) > 1 else "")
        for label, value in shown
    ] or ["-"]  # fmt: skip
    size = 20 if len(lines) == 1 else 13
    axes.text(0.5, 0.45, "\n".join(lines), ha="center", va="center", fontsize=size, weight="bold")
    axes.set_axis_off()


def _draw_heatmap(axes: Any, results: list[Series], start: float, unit: str) -> None:
    series = [s for result in results for s in result if s["metric"].get("le") != "+Inf"]
    series.sort(key=lambda s: float(s["metric"]["le"]))
    if not series:
        return
    times, _ = _points(series[0], start)
    # Buckets are cumulative: the count in each bucket is the difference to the one below.
    grid: list[list[float]] = []
    below = [0.0] * len(times)
    for one in series:
        _, values = _points(one, start)
        pairs = zip(values, below, strict=True)
        grid.append([max(v - b, 0.0) if math.isfinite(v) else 0.0 for v, b in pairs])
        below = [v if math.isfinite(v) else 0.0 for v in values]
    labels = [one["metric"]["le"].removesuffix(".0") for one in series]
    image = axes.imshow(
        grid, aspect="auto", origin="lower", cmap="Oranges",
        extent=(times[0], times[-1], -0.5, len(labels) - 0.5),
    )  # fmt: skip
    axes.figure.colorbar(image, ax=axes, label=unit.removeprefix("suffix:").strip())
    axes.set_yticks(range(len(labels)), labels)
    axes.set_ylabel("items per batch (le)")


def _draw_lines(axes: Any, panel: Panel, results: list[Series], start: float) -> None:
    for query, result in zip(panel.queries, results, strict=True):
        for one in result:
            times, values = _points(one, start)
            axes.plot(times, values, label=_label(query.legend, one["metric"]))
    if panel.unit == "percentunit":
        axes.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    elif panel.unit:
        axes.set_ylabel(panel.unit)
    if axes.lines:
        axes.legend(fontsize=7, loc="upper left")
    else:
        axes.text(0.5, 0.5, "no data (CUDA only)", ha="center", va="center")


def snapshot(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    all_panels = panels(load())
    with tempfile.TemporaryDirectory() as tmp, live_metrics(Path(tmp), load_seconds=20) as run:
        results = {
            panel: [
                run.prometheus.query_range(
                    substitute(query.expr, rate=RATE_INTERVAL), run.start, run.end, step_s=1
                )
                for query in panel.queries
            ]
            for panel in all_panels  # by panel: a stat and a chart may share a title
        }
        start = run.start
    stats = [p for p in all_panels if p.kind == "stat"]
    charts = [p for p in all_panels if p.kind != "stat" and p.title not in CUDA_ONLY]
    rows = 1 + math.ceil(len(charts) / 2)
    figure = plt.figure(figsize=(14, 3.2 * rows), layout="constrained")
    grid = figure.add_gridspec(rows, 4, height_ratios=[0.5] + [1.0] * (rows - 1))
    for column, panel in enumerate(stats[:4]):
        axes = figure.add_subplot(grid[0, column])
        axes.set_title(panel.title, fontsize=10)
        _draw_stat(axes, panel, results[panel])
    for index, panel in enumerate(charts):
        row, half = divmod(index, 2)
        axes = figure.add_subplot(grid[1 + row, 2 * half : 2 * half + 2])
        axes.set_title(panel.title, fontsize=10)
        if panel.kind == "heatmap":
            _draw_heatmap(axes, results[panel], start, panel.unit)
        else:
            _draw_lines(axes, panel, results[panel], start)
        axes.set_xlabel("seconds into the run", fontsize=8)
    figure.suptitle(
        "carpool: dynamic batching (two toy models, CPU, local Prometheus, 1 s scrapes)"
    )
    path = out_dir / "dashboard.png"
    figure.savefig(path, dpi=80)
    return path


if __name__ == "__main__":
    print(snapshot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")))
