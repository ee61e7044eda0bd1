"""A bench run's results as a text table, a JSON document and a PNG plot."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from carpool.loadgen.stats import BatchStats, LatencySummary

Mode = Literal["concurrency", "rate"]
SCHEMA = "carpool.bench/v1"


@dataclass(frozen=True, slots=True)
class CellResult:
    """One load level (a concurrency, or an offered rate) of a run."""

    mode: Mode
    level: float
    requests: int
    ok: int
    # Non-200 answers by status code; "connection" for requests that got no answer.
    errors: dict[str, int]
    wall_seconds: float
    throughput_rps: float
    items_per_second: float
    latency: LatencySummary
    # Percent of one core the load generator itself used during the cell.
    loadgen_cpu_percent: float
    batching: BatchStats | None = None


@dataclass(frozen=True, slots=True)
class BenchReport:
    # The settings of the run (target, payload, protocol, bounds), as given.
    settings: dict[str, Any]
    cells: list[CellResult] = field(default_factory=list)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _clean(value: Any) -> Any:
    """NaN and infinities become null, since JSON has no spelling for them."""
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, Mapping):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def to_json(report: BenchReport) -> dict[str, Any]:
    document = {
        "schema": SCHEMA,
        "settings": report.settings,
        "cells": [dataclasses.asdict(cell) for cell in report.cells],
    }
    cleaned: dict[str, Any] = _clean(document)
    return cleaned


def write_json(report: BenchReport, path: Path) -> None:
    path.write_bytes(orjson.dumps(to_json(report), option=orjson.OPT_INDENT_2))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}" if math.isfinite(seconds) else "-"


def level_label(mode: Mode, level: float) -> str:
    """A load level as the report names it: `c=8` clients, `50/s` requests."""
    return f"c={level:g}" if mode == "concurrency" else f"{level:g}/s"


def render_text(report: BenchReport) -> str:
    """A table per run: one row per cell, then its batching figures when the target has them."""
    header = (
        f"{'load':>8} {'requests':>8} {'req/s':>9} {'items/s':>9} {'p50 ms':>8} {'p90 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8} {'errors':>14} {'gen cpu':>7}"
    )
    lines = [header]
    for cell in report.cells:
        errors = ",".join(f"{code}:{count}" for code, count in sorted(cell.errors.items()))
        label = level_label(cell.mode, cell.level)
        lines.append(
            f"{label:>8} {cell.requests:>8} {cell.throughput_rps:>9.1f} "
            f"{cell.items_per_second:>9.1f} {_ms(cell.latency.p50):>8} {_ms(cell.latency.p90):>8} "
            f"{_ms(cell.latency.p99):>8} {_ms(cell.latency.max):>8} {errors or '0':>14} "
            f"{cell.loadgen_cpu_percent:>6.0f}%"
        )
    batched = [cell for cell in report.cells if cell.batching is not None]
    if batched:
        lines.append("")
        lines.append(
            f"{'load':>8} {'batches':>8} {'items/batch':>11} {'wait mean ms':>12} "
            f"{'wait p95 ms':>11}  by reason"
        )
        for cell in batched:
            stats = cell.batching
            assert stats is not None
            reasons = " ".join(
                f"{reason}={count:g}" for reason, count in sorted(stats.batches_by_reason.items())
            )
            items = stats.mean_items_per_batch
            lines.append(
                f"{level_label(cell.mode, cell.level):>8} {stats.batches:>8g} "
                f"{(f'{items:.2f}' if math.isfinite(items) else '-'):>11} "
                f"{_ms(stats.queue_wait_mean):>12} {_ms(stats.queue_wait_p95):>11}  {reasons}"
            )
    return "\n".join(lines)


def plot(series: Mapping[str, list[CellResult]], path: Path, title: str = "") -> None:
    """Throughput and p99 latency against load, one line per named series, as a PNG."""
    import matplotlib

    # No display is needed to write a file.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    mode: Mode = "concurrency"
    ticks = sorted({cell.level for cells in series.values() for cell in cells})
    for name, cells in series.items():
        if not cells:
            continue
        mode = cells[0].mode
        levels = [cell.level for cell in cells]
        left.plot(levels, [cell.throughput_rps for cell in cells], marker="o", label=name)
        right.plot(levels, [cell.latency.p99 * 1000 for cell in cells], marker="o", label=name)
    xlabel = "concurrent clients" if mode == "concurrency" else "offered requests/s"
    for axes, ylabel in ((left, "requests/s"), (right, "p99 latency (ms)")):
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        if mode == "concurrency":
            axes.set_xscale("log", base=2)
            axes.set_xticks(ticks, labels=[f"{tick:g}" for tick in ticks])
        axes.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
