"""Medians over rounds, paired ratios, and the comparison's text, JSON and plot.

Ratios are paired: carpool's figure in round r is divided by the other variant's figure in
the same round r, and the median of those per-round ratios is reported with their range.
Pairing cancels most of the drift a shared machine has between rounds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    @property
    def requests_per_front_core(self) -> float:
        """Requests/s per core of the HTTP front: the cost of the front itself."""
        cores = self.front_cpu_seconds / self.cell.wall_seconds if self.cell.wall_seconds else 0
        return self.cell.throughput_rps / cores if cores > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Limit:
    """The model alone, in process, at its best batch size, in one round."""

    round: int
    batch_size: int
    items_per_second: float


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


def paired_ratios(
    measurements: Sequence[Measurement], limits: Sequence[Limit]
) -> dict[str, dict[int, Spread]]:
    """Per concurrency: carpool's throughput over each other variant's, round by round.

    Also `p50 carpool/unbatched`: carpool's median latency over the baseline's, which at
    concurrency 1 is the price of the batching window when there is nothing to batch.
    """
    index = _index(measurements)
    limit_by_round = {limit.round: limit.items_per_second for limit in limits}
    carpool = [m for m in measurements if m.variant == "carpool"]
    ratios: dict[str, dict[int, list[float]]] = {}

    def add(name: str, level: int, value: float) -> None:
        ratios.setdefault(name, {}).setdefault(level, []).append(value)

    for ours in carpool:
        for other in ("unbatched", "ray"):
            theirs = index.get((other, ours.concurrency, ours.round))
            if theirs is not None and theirs.cell.throughput_rps > 0:
                add(
                    f"throughput carpool/{other}",
                    ours.concurrency,
                    ours.cell.throughput_rps / theirs.cell.throughput_rps,
                )
            if other == "unbatched" and theirs is not None and theirs.cell.latency.p50 > 0:
                add(
                    "p50 carpool/unbatched",
                    ours.concurrency,
                    ours.cell.latency.p50 / theirs.cell.latency.p50,
                )
        limit = limit_by_round.get(ours.round)
        if limit:
            add("items/s carpool/limit", ours.concurrency, ours.cell.items_per_second / limit)
    return {
        name: {level: Spread.of(values) for level, values in sorted(levels.items())}
        for name, levels in ratios.items()
    }


def render_text(
    measurements: Sequence[Measurement], limits: Sequence[Limit], settings: dict[str, Any]
) -> str:
    table = medians(measurements)
    lines = [
        f"model {settings['handler']} on {settings['device']}, torch threads "
        f"{settings['torch_threads']}, max batch {settings['max_batch_size']}, "
        f"max wait {settings['max_wait_ms']:g} ms; {settings['rounds']} rounds of "
        f"{settings['duration_seconds']:g} s per cell; median (min-max) over rounds",
        "",
        f"{'variant':>10} {'clients':>7} {'req/s':>22} {'p50 ms':>20} {'p99 ms':>20} "
        f"{'errors':>7} {'gen cpu%':>9} {'req/s per front core':>22}",
    ]
    for variant, levels in table.items():
        for level, figures in levels.items():
            lines.append(
                f"{variant:>10} {level:>7} {figures['requests_per_second'].text():>22} "
                f"{figures['p50_seconds'].text(2, 1000):>20} "
                f"{figures['p99_seconds'].text(2, 1000):>20} "
                f"{figures['errors'].high:>7.0f} {figures['loadgen_cpu_percent'].median:>9.0f} "
                f"{figures['requests_per_front_core'].text(0):>22}"
            )
    if limits:
        spread = Spread.of(limit.items_per_second for limit in limits)
        sizes = sorted({limit.batch_size for limit in limits})
        lines += ["", f"model limit (in process, batch {sizes}): {spread.text()} items/s"]
    ratios = paired_ratios(measurements, limits)
    if ratios:
        lines += ["", "paired ratios, median (min-max) over rounds:"]
        for name, by_level in ratios.items():
            cells = "  ".join(f"c={level}: {spread.text(2)}" for level, spread in by_level.items())
            lines.append(f"  {name:<28} {cells}")
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
        "ratios": spreads(paired_ratios(measurements, limits)),
        "limits": [dataclasses.asdict(limit) for limit in limits],
        "measurements": [
            {**dataclasses.asdict(m), "requests_per_front_core": m.requests_per_front_core}
            for m in measurements
        ],
    }
    cleaned: dict[str, Any] = _clean(document)
    return cleaned


def plot(
    measurements: Sequence[Measurement], limits: Sequence[Limit], path: Path, title: str
) -> None:
    """Median throughput (with the model's limit) and p99 against concurrency, with ranges."""
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
    if limits:
        best = statistics.median(limit.items_per_second for limit in limits)
        left.axhline(best, linestyle="--", color="grey", label="model limit")
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
