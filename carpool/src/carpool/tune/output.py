"""What `carpool tune` shows and writes: a table of trials, the `spec.batching` snippet, a
JSON record and a plot of the measured frontier."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import orjson

from carpool.tune.search import Trial, frontier, meets
from carpool.tune.trial import Load


def _ms(seconds: float) -> str:
    return "-" if math.isinf(seconds) else f"{1000 * seconds:.0f}"


def _load(load: Load) -> str:
    if load.mode == "concurrency":
        return f"{load.level:g} clients"
    return f"{load.level:g} requests/s (Poisson)"


def table(trials: Sequence[Trial], winner: Trial, load: Load, objective_s: float) -> str:
    keys = list(trials[0].settings)
    header = [*keys, "req/s", f"p{load.percentile:g} ms", "answered", "meets"]
    rows = [
        [
            *(str(trial.settings[key]) for key in keys),
            f"{trial.throughput:.1f}",
            _ms(trial.latency_s),
            f"{trial.answered}/{trial.requests}",
            ("yes" if meets(trial, objective_s) else "no") + (" *" if trial is winner else ""),
        ]
        for trial in trials
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        f"{len(trials)} trials at {_load(load)}, objective p{load.percentile:g} <= "
        f"{1000 * objective_s:g} ms ({sum(t.seconds for t in trials):.0f} s)",
        "  ".join(cell.rjust(width) for cell, width in zip(header, widths, strict=True)),
    ]
    lines += [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(lines)


def snippet(winner: Trial, load: Load, objective_s: float) -> str:
    """The winner as a BatchedModel's `spec.batching`, its measurement in a comment."""
    lines = [
        f"# carpool tune: {winner.throughput:.1f} requests/s, p{load.percentile:g} "
        f"{_ms(winner.latency_s)} ms at {_load(load)} (objective {1000 * objective_s:g} ms)",
        "spec:",
        "  batching:",
    ]
    lines += [f"    {key}: {value}" for key, value in winner.settings.items()]
    return "\n".join(lines) + "\n"


def to_json(trials: Sequence[Trial], winner: Trial, load: Load, objective_s: float) -> bytes:
    def row(trial: Trial) -> dict[str, object]:
        latency = None if math.isinf(trial.latency_s) else trial.latency_s
        return {
            "settings": trial.settings,
            "requests_per_second": trial.throughput,
            "latency_seconds": latency,
            "requests": trial.requests,
            "answered": trial.answered,
            "seconds": trial.seconds,
        }

    return orjson.dumps(
        {
            "load": {"mode": load.mode, "level": load.level, "percentile": load.percentile},
            "objective_seconds": objective_s,
            "best": row(winner),
            "trials": [row(trial) for trial in trials],
        },
        option=orjson.OPT_INDENT_2,
    )


def plot(
    trials: Sequence[Trial], winner: Trial, load: Load, objective_s: float, path: Path
) -> None:
    """Throughput against latency at the percentile: every trial, the frontier, the
    objective and the winner, as a PNG (matplotlib: `carpool[bench]`)."""
    import matplotlib

    matplotlib.use("Agg")  # no display is needed to write a file
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    shown = [trial for trial in trials if not math.isinf(trial.latency_s)]
    axes.scatter(
        [1000 * t.latency_s for t in shown],
        [t.throughput for t in shown],
        color="0.6",
        label="trials",
    )
    edge = frontier(trials)
    axes.plot(
        [1000 * t.latency_s for t in edge],
        [t.throughput for t in edge],
        marker="o",
        label="frontier",
    )
    axes.axvline(1000 * objective_s, linestyle="--", color="red", label="objective")
    if not math.isinf(winner.latency_s):
        axes.scatter(
            [1000 * winner.latency_s], [winner.throughput], marker="*", s=200, label="chosen"
        )
    axes.set_xlabel(f"p{load.percentile:g} latency (ms)")
    axes.set_ylabel("requests/s")
    axes.set_title(f"carpool tune at {_load(load)}")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
