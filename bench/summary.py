"""Medians over rounds, paired ratios, and the comparison's text, JSON and plot.

Ratios are paired: carpool's figure in round r is divided by the other variant's figure in
the same round r, and the median of those per-round ratios is reported with their range.
Pairing cancels most of the drift a shared machine has between rounds. Every variant is
also set against the model's in-process limit of the same round, twice: at the batch size
its load can form, min(clients, max batch size), a fair ceiling at every concurrency, and
at the model's best batch size, and against the accelerator's own ceiling (the forward pass
alone on batches prepared in advance) at the batch its load can form.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from carpool.loadgen.report import CellResult


@dataclass(frozen=True, slots=True)
class Measurement:
    """One variant at one concurrency in one round."""

    variant: str
    round: int
    concurrency: int
    cell: CellResult
    # CPU seconds during the cell: the HTTP front (sidecar, or the whole baseline server)
    # and the model server process, when it is a separate one.
    front_cpu_seconds: float
    model_cpu_seconds: float
    # The GPU's mean utilisation during the cell (NVML); None where it was not measured.
    gpu_utilisation_percent: float | None = None

    @property
    def requests_per_front_core(self) -> float:
        """Requests/s per core of the HTTP front: the cost of the front itself."""
        cores = self.front_cpu_seconds / self.cell.wall_seconds if self.cell.wall_seconds else 0
        return self.cell.throughput_rps / cores if cores > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Limit:
    """The model alone, in process, at one batch size, in one round."""

    round: int
    batch_size: int
    items_per_second: float
    # The forward pass alone, on batches preprocessed (onto the device) in advance.
    forward_items_per_second: float = math.nan


def formable(concurrency: int, max_batch_size: int) -> int:
    """The largest batch `concurrency` closed-loop clients can form: one request each."""
    return min(concurrency, max_batch_size)


def _whole(limit: Limit) -> float:
    return limit.items_per_second


def _forward(limit: Limit) -> float:
    return limit.forward_items_per_second


def _curves(
    limits: Iterable[Limit], figure: Callable[[Limit], float] = _whole
) -> dict[int, dict[int, float]]:
    """round -> batch size -> items/s (of `figure`: the whole step, or the forward pass)."""
    curves: dict[int, dict[int, float]] = {}
    for limit in limits:
        if math.isfinite(figure(limit)):
            curves.setdefault(limit.round, {})[limit.batch_size] = figure(limit)
    return curves


def limit_curve(
    limits: Sequence[Limit], figure: Callable[[Limit], float] = _whole
) -> dict[int, Spread]:
    """Batch size -> the spread of `figure` over rounds."""
    by_size: dict[int, list[float]] = {}
    for limit in limits:
        by_size.setdefault(limit.batch_size, []).append(figure(limit))
    return {size: Spread.of(values) for size, values in sorted(by_size.items())}


def forward_curve(limits: Sequence[Limit]) -> dict[int, Spread]:
    """Batch size -> the forward-only ceiling's spread over rounds; sizes without one left out."""
    curve = limit_curve(limits, _forward)
    return {size: spread for size, spread in curve.items() if math.isfinite(spread.median)}


def best_size(limits: Sequence[Limit]) -> int | None:
    """The batch size with the highest median limit."""
    curve = limit_curve(limits)
    return max(curve, key=lambda size: curve[size].median) if curve else None


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        finite = [value for value in values if math.isfinite(value)]
        if not finite:
            return cls(math.nan, math.nan, math.nan)
        return cls(statistics.median(finite), min(finite), max(finite))

    def text(self, digits: int = 1, scale: float = 1.0) -> str:
        if not math.isfinite(self.median):
            return "-"
        m, lo, hi = (value * scale for value in (self.median, self.low, self.high))
        return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


# Figures per measurement that the summary reports, by name.
FIGURES: dict[str, Callable[[Measurement], float]] = {
    "requests_per_second": lambda m: m.cell.throughput_rps,
    "items_per_second": lambda m: m.cell.items_per_second,
    "p50_seconds": lambda m: m.cell.latency.p50,
    "p99_seconds": lambda m: m.cell.latency.p99,
    "errors": lambda m: float(sum(m.cell.errors.values())),
    "loadgen_cpu_percent": lambda m: m.cell.loadgen_cpu_percent,
    "requests_per_front_core": lambda m: m.requests_per_front_core,
    "gpu_utilisation_percent": lambda m: (
        math.nan if m.gpu_utilisation_percent is None else m.gpu_utilisation_percent
    ),
}


def _index(measurements: Iterable[Measurement]) -> dict[tuple[str, int, int], Measurement]:
    return {(m.variant, m.concurrency, m.round): m for m in measurements}


def medians(measurements: Sequence[Measurement]) -> dict[str, dict[int, dict[str, Spread]]]:
    """variant -> concurrency -> figure -> spread over rounds."""
    grouped: dict[str, dict[int, list[Measurement]]] = {}
    for m in measurements:
        grouped.setdefault(m.variant, {}).setdefault(m.concurrency, []).append(m)
    return {
        variant: {
            level: {name: Spread.of(figure(m) for m in group) for name, figure in FIGURES.items()}
            for level, group in sorted(levels.items())
        }
        for variant, levels in grouped.items()
    }


def variants(measurements: Iterable[Measurement]) -> list[str]:
    """Variant names in the order they ran."""
    return list(dict.fromkeys(m.variant for m in measurements))


def paired_ratios(
    measurements: Sequence[Measurement], limits: Sequence[Limit], max_batch_size: int
) -> dict[str, dict[int, Spread]]:
    """Per concurrency, paired round by round: carpool over every other variant (throughput,
    and p50 latency, which at one client is the price of the batching window when there is
    nothing to batch), then every variant's items/s over the limit at the batch size its
    load can form and over the best limit of the round.
    """
    index = _index(measurements)
    curves, forward = _curves(limits), _curves(limits, _forward)
    ratios: dict[str, dict[int, list[float]]] = {}

    def add(name: str, level: int, value: float) -> None:
        ratios.setdefault(name, {}).setdefault(level, []).append(value)

    names = variants(measurements)
    for ours in (m for m in measurements if m.variant == "carpool"):
        for other in names:
            theirs = index.get((other, ours.concurrency, ours.round))
            if other == "carpool" or theirs is None:
                continue
            level = ours.concurrency
            if theirs.cell.throughput_rps > 0:
                add(
                    f"throughput carpool/{other}",
                    level,
                    ours.cell.throughput_rps / theirs.cell.throughput_rps,
                )
            if theirs.cell.latency.p50 > 0:
                add(f"p50 carpool/{other}", level, ours.cell.latency.p50 / theirs.cell.latency.p50)
    for name in names:
        for m in (m for m in measurements if m.variant == name):
            curve = curves.get(m.round, {})
            at_batch = curve.get(formable(m.concurrency, max_batch_size))
            if at_batch:
                add(
                    f"items/s {name}/limit at batch",
                    m.concurrency,
                    m.cell.items_per_second / at_batch,
                )
            if curve:
                best = max(curve.values())
                add(f"items/s {name}/best limit", m.concurrency, m.cell.items_per_second / best)
            ceiling = forward.get(m.round, {}).get(formable(m.concurrency, max_batch_size))
            if ceiling:
                add(
                    f"items/s {name}/forward at batch",
                    m.concurrency,
                    m.cell.items_per_second / ceiling,
                )
    return {
        name: {level: Spread.of(values) for level, values in sorted(levels.items())}
        for name, levels in ratios.items()
    }


def render_text(
    measurements: Sequence[Measurement], limits: Sequence[Limit], settings: dict[str, Any]
) -> str:
    table = medians(measurements)
    lines = [
        f"model {settings['handler']} ({settings.get('dtype', 'fp32')}) on "
        f"{settings['device']}, torch threads "
        f"{settings['torch_threads']}, max batch {settings['max_batch_size']}, "
        f"max wait {settings['max_wait_ms']:g} ms; {settings['rounds']} rounds of "
        f"{settings['duration_seconds']:g} s per cell; median (min-max) over rounds",
        "",
        f"{'variant':>10} {'clients':>7} {'req/s':>22} {'p50 ms':>20} {'p99 ms':>20} "
        f"{'errors':>7} {'gen cpu%':>9} {'req/s per front core':>22} {'gpu %':>16}",
    ]
    for variant, levels in table.items():
        for level, figures in levels.items():
            lines.append(
                f"{variant:>10} {level:>7} {figures['requests_per_second'].text():>22} "
                f"{figures['p50_seconds'].text(2, 1000):>20} "
                f"{figures['p99_seconds'].text(2, 1000):>20} "
                f"{figures['errors'].high:>7.0f} {figures['loadgen_cpu_percent'].median:>9.0f} "
                f"{figures['requests_per_front_core'].text(0):>22} "
                f"{figures['gpu_utilisation_percent'].text(0):>16}"
            )
    if limits:
        forward = forward_curve(limits)
        lines += [
            "",
            f"model limit (in process), items/s by batch size; best {best_size(limits)}; "
            "forward: the forward pass alone, batches prepared in advance:",
        ]
        lines += [
            f"  batch {size:>3}: {spread.text()}"
            + (f"  forward {forward[size].text()}" if size in forward else "")
            for size, spread in limit_curve(limits).items()
        ]
    ratios = paired_ratios(measurements, limits, settings["max_batch_size"])
    if ratios:
        lines += [
            "",
            "paired ratios, median (min-max) over rounds; the limit at batch min(clients, "
            f"{settings['max_batch_size']}):",
        ]
        for name, by_level in ratios.items():
            cells = "  ".join(f"c={level}: {spread.text(2)}" for level, spread in by_level.items())
            lines.append(f"  {name:<36} {cells}")
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def to_json(
    measurements: Sequence[Measurement], limits: Sequence[Limit], settings: dict[str, Any]
) -> dict[str, Any]:
    def spreads(table: Spread | dict[Any, Any]) -> Any:
        if isinstance(table, Spread):
            return dataclasses.asdict(table)
        return {key: spreads(value) for key, value in table.items()}

    document = {
        "schema": "carpool.compare/v1",
        "settings": settings,
        "medians": spreads(medians(measurements)),
        "ratios": spreads(paired_ratios(measurements, limits, settings["max_batch_size"])),
        "limits": [dataclasses.asdict(limit) for limit in limits],
        "limit_curve": spreads(limit_curve(limits)),
        "forward_curve": spreads(forward_curve(limits)),
        "best_batch_size": best_size(limits),
        "measurements": [
            {**dataclasses.asdict(m), "requests_per_front_core": m.requests_per_front_core}
            for m in measurements
        ],
    }
    cleaned: dict[str, Any] = _clean(document)
    return cleaned


def write(
    folder: Path,
    measurements: Sequence[Measurement],
    limits: Sequence[Limit],
    settings: dict[str, Any],
) -> str:
    """results.json and summary.txt for what has been measured so far; returns the text.

    Called after every cell, so a run that is stopped keeps what it measured. Each file is
    replaced whole (written beside, then renamed): a stop mid-write leaves the previous one.
    """
    text = render_text(measurements, limits, settings)
    document = to_json(measurements, limits, settings)
    for name, data in (
        ("summary.txt", (text + "\n").encode()),
        ("results.json", orjson.dumps(document, option=orjson.OPT_INDENT_2)),
    ):
        partial = folder / f".{name}.partial"
        partial.write_bytes(data)
        os.replace(partial, folder / name)
    return text


def plot(
    measurements: Sequence[Measurement],
    limits: Sequence[Limit],
    max_batch_size: int,
    path: Path,
    title: str,
) -> None:
    """Median throughput and p99 against concurrency, with ranges; beside the throughput,
    the model's limit at the batch each concurrency can form and at its best batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    ticks = sorted({m.concurrency for m in measurements})
    for variant, levels in medians(measurements).items():
        xs = list(levels)
        for axes, name, scale in (
            (left, "items_per_second", 1.0),
            (right, "p99_seconds", 1000.0),
        ):
            spreads = [levels[x][name] for x in xs]
            ys = [s.median * scale for s in spreads]
            below = [(s.median - s.low) * scale for s in spreads]
            above = [(s.high - s.median) * scale for s in spreads]
            axes.errorbar(xs, ys, yerr=[below, above], marker="o", capsize=3, label=variant)
    curve = limit_curve(limits)
    formed = [x for x in ticks if formable(x, max_batch_size) in curve]
    if formed:
        ys = [curve[formable(x, max_batch_size)].median for x in formed]
        left.plot(formed, ys, linestyle="--", marker="x", color="grey", label="limit at batch")
    best = best_size(limits)
    if best is not None:
        left.axhline(curve[best].median, linestyle=":", color="grey", label=f"best limit ({best})")
    for axes, ylabel in ((left, "items/s"), (right, "p99 latency (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, labels=[str(tick) for tick in ticks])
        axes.set_xlabel("concurrent clients")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
