"""`carpool tune`'s coordinate search against the full grid of the same space, on one server.

    python bench/tune_vs_grid.py                      # the slow stand-in, 8 clients, 200 ms
    python bench/tune_vs_grid.py --rate 100 --handler-options preset=slow

One `carpool serve` whose settings file both searches rewrite (`carpool.tune.trial`). The
grid measures every point, the coordinate search its own few, then the two winners are
measured again in turns (`--recheck` times each, alternating) so that their throughputs are
compared on the same footing rather than on one noisy trial each. Prints both searches'
trials and time, and the medians of the rechecks.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import click
import servers

from carpool.contract.batching import Batching
from carpool.loadgen import runner, workload
from carpool.tune import search
from carpool.tune.trial import Load, SettingsFile, Trials, until_applied

SPACE = search.Space(
    (
        search.Dimension("maxBatchSize", (4, 8, 16, 32, 64)),
        search.Dimension("maxWaitMs", (0, 2, 5, 10)),
        search.Dimension("dispatch", ("timed", "adaptive", "fixed")),
        search.Dimension("maxInflightBatches", (1, 2)),
    )
)


async def compare(
    url: str, file: SettingsFile, load: Load, objective_s: float, recheck: int
) -> None:
    prepared = workload.build(
        workload.WorkloadSpec(
            protocol="oip-json", payload="toy", model_name="stand-in", input_name="input"
        )
    )
    timeout = aiohttp.ClientTimeout(total=load.timeout_s)
    connector = aiohttp.TCPConnector(limit=1024)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        send = runner.make_sender(session, url, prepared)
        applied = functools.partial(until_applied, session, f"{url}/v2/models/stand-in/batching")
        trials = Trials(SPACE, file, send, load, applied, False, SPACE.size)
        began = time.monotonic()
        start = SPACE.nearest(Batching().as_file())
        tuned = await search.coordinate_search(SPACE, start, trials.measure, objective_s)
        tune_s = time.monotonic() - began
        began = time.monotonic()
        grid = await search.full_grid(SPACE, trials.measure)
        grid_s = time.monotonic() - began
        winners = {
            "tune": search.best(tuned, objective_s),
            "grid": search.best(grid, objective_s),
        }
        for name, trial, seconds, count in (
            ("tune", winners["tune"], tune_s, len(tuned)),
            ("grid", winners["grid"], grid_s, len(grid)),
        ):
            print(
                f"{name}: {count} trials in {seconds:.0f} s; best {trial.settings} "
                f"{trial.throughput:.1f} requests/s, p{load.percentile:g} "
                f"{1000 * trial.latency_s:.0f} ms, meets {search.meets(trial, objective_s)}"
            )
        print(f"time tune/grid {tune_s / grid_s:.3f}, trials {len(tuned) / len(grid):.3f}")
        again: dict[str, list[search.Trial]] = {name: [] for name in winners}
        points = {name: SPACE.nearest(trial.settings) for name, trial in winners.items()}
        for number in range(recheck):
            order = list(winners) if number % 2 == 0 else list(winners)[::-1]
            for name in order:
                again[name].append(await trials.measure(points[name]))
        med = statistics.median
        rates = {name: med(t.throughput for t in runs) for name, runs in again.items()}
        for name, runs in again.items():
            print(
                f"recheck {name}: {rates[name]:.1f} requests/s, p{load.percentile:g} "
                f"{1000 * med(t.latency_s for t in runs):.0f} ms, meets "
                f"{sum(search.meets(t, objective_s) for t in runs)}/{len(runs)}"
            )
        print(f"throughput tune/grid {rates['tune'] / rates['grid']:.3f}")


@click.command()
@click.option("--handler-options", default="preset=slow", show_default=True)
@click.option("--concurrency", default=8, show_default=True)
@click.option("--rate", type=float, default=None, help="Poisson instead of a closed loop.")
@click.option("--objective-ms", default=200.0, show_default=True)
@click.option("--percentile", default=99.0, show_default=True)
@click.option("--duration", default=1.5, show_default=True, help="seconds per trial")
@click.option("--warmup", default=0.3, show_default=True)
@click.option("--recheck", default=3, show_default=True)
def main(
    handler_options: str,
    concurrency: int,
    rate: float | None,
    objective_ms: float,
    percentile: float,
    duration: float,
    warmup: float,
    recheck: int,
) -> None:
    settings = servers.ModelSettings("stand-in", "stand-in", "cpu", 1, 64, 5.0, handler_options)
    load = Load(
        "rate" if rate is not None else "concurrency",
        rate if rate is not None else float(concurrency),
        duration,
        warmup,
        percentile,
    )
    with tempfile.TemporaryDirectory(prefix="carpool-tune-") as folder:
        path = Path(folder) / "batching.json"
        path.write_text("{}")
        variant = servers.carpool(settings)
        variant = servers.Variant("carpool", (*variant.command, "--config-file", str(path)))
        print(f"stand-in {handler_options}, load {load}, space of {SPACE.size()} points")
        with servers.started(variant, Path(folder) / "serve.log", timeout_s=120) as server:
            asyncio.run(compare(server.url, SettingsFile(path), load, objective_ms / 1000, recheck))


if __name__ == "__main__":
    main()
