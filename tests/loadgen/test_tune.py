"""`carpool tune`: its search on a made-up landscape, and a run against a real sidecar."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import orjson
from aiohttp import web
from support.http_app import serving
from support.sidecar import run_pair

from carpool.contract.batching import Batching
from carpool.tune import search
from carpool.tune.search import Dimension, Point, Space, Trial

SPACE = Space(
    (
        Dimension("maxBatchSize", (4, 8, 16, 32, 64)),
        Dimension("maxWaitMs", (0, 2, 5, 10)),
        Dimension("dispatch", ("timed", "adaptive", "fixed")),
        Dimension("maxInflightBatches", (1, 2, 4)),
    )
)
OBJECTIVE_S = 0.2


def landscape(point: Point) -> Trial:
    """A model taking 40 ms + 4 ms per item, served at 150 requests/s: larger batches serve
    more until a request waiting for one and running in the next misses 200 ms; waits add
    latency, fixed dispatch waits always, one batch in flight leaves the model idle."""
    settings = SPACE.settings(point)
    size = float(settings["maxBatchSize"])
    wait_s = float(settings["maxWaitMs"]) / 1000
    batch_s = 0.040 + 0.004 * size
    capacity = size / batch_s * (0.85 if settings["maxInflightBatches"] == 1 else 1.0)
    latency = 1.5 * batch_s + wait_s * (2 if settings["dispatch"] == "fixed" else 1)
    latency += 0.01 if settings["dispatch"] == "adaptive" else 0.0
    latency += 0.005 * float(settings["maxInflightBatches"])
    served = min(150.0, capacity)
    if capacity < 150:
        latency *= 4  # the queue grows
    return Trial(settings, served, latency, 100, 100, 1.0)


async def measure(point: Point) -> Trial:
    return landscape(point)


async def test_coordinate_search_finds_the_grids_best_in_a_fifth_of_its_trials() -> None:
    grid = await search.full_grid(SPACE, measure)
    start = SPACE.nearest(Batching().as_file())
    found = await search.coordinate_search(SPACE, start, measure, OBJECTIVE_S)
    assert len(found) <= len(grid) / 5
    ours, theirs = search.best(found, OBJECTIVE_S), search.best(grid, OBJECTIVE_S)
    assert search.meets(ours, OBJECTIVE_S)
    assert ours.throughput >= 0.9 * theirs.throughput
    assert ours.settings == theirs.settings


def test_the_frontier_keeps_only_settings_nothing_beats_on_both() -> None:
    trials = [
        Trial({"maxBatchSize": size}, served, latency, 1, 1, 1.0)
        for size, served, latency in [(1, 50, 0.05), (2, 40, 0.08), (4, 90, 0.1), (8, 95, 1.0)]
    ]
    assert [t.settings["maxBatchSize"] for t in search.frontier(trials)] == [1, 4, 8]


def tune(url: str, settings: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`carpool tune` of a toy sidecar at `url`: short closed-loop trials, timed dispatch."""
    command = [sys.executable, "-m", "carpool", "tune", "--url", url, "--objective-ms", "500"]
    command += ["--settings-file", str(settings), "--duration", "0.5", "--warmup", "0"]
    command += ["--dispatch", "timed", "--max-inflight-batches", "2", "--quiet", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_tune_rewrites_a_live_sidecars_settings_and_writes_the_best(tmp_path: Path) -> None:
    settings = tmp_path / "batching.json"
    settings.write_text('{"timeoutMs": 20000}')
    snippet, report = tmp_path / "batching.yaml", tmp_path / "tune.json"
    with run_pair(tmp_path, "toy", "--config-file", str(settings)) as pair:
        done = tune(
            pair.sidecar.url, settings, "--concurrency", "4", "--max-batch-size", "1,4",
            "--max-wait-ms", "0", "--snippet", str(snippet), "--json", str(report),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + pair.sidecar.log()
        log = pair.sidecar.log()
    document = orjson.loads(report.read_bytes())
    # Each trial's settings reached the sidecar, live.
    assert "'max_batch_size': 1" in log or "max_batch_size=1" in log, log
    assert len(document["trials"]) == 2
    best = document["best"]["settings"]
    assert orjson.loads(settings.read_bytes()) == {"timeoutMs": 20000, **best}
    assert f"    maxBatchSize: {best['maxBatchSize']}\n" in snippet.read_text()
    assert snippet.read_text().startswith("# carpool tune: ")
    assert "spec:\n  batching:\n" in done.stdout


def test_tune_stops_when_the_sidecar_does_not_take_its_settings(tmp_path: Path) -> None:
    read, other = tmp_path / "batching.json", tmp_path / "other.json"
    read.write_text("{}")
    other.write_text("{}")
    with run_pair(tmp_path, "toy", "--config-file", str(read)) as pair:
        done = tune(
            pair.sidecar.url, other, "--concurrency", "1", "--max-batch-size", "4",
            "--max-wait-ms", "3",
        )  # fmt: skip
    # Rather than measuring the settings in use as if they were the ones written.
    assert done.returncode != 0
    assert "did not take" in done.stderr and "--config-file" in done.stderr, done.stderr


async def test_a_trial_against_a_sidecar_that_never_answers_ends_at_the_timeout(
    tmp_path: Path,
) -> None:
    settings = tmp_path / "batching.json"
    settings.write_text("{}")
    release = asyncio.Event()

    async def batching(request: web.Request) -> web.Response:
        return web.json_response({"batching": orjson.loads(settings.read_bytes())})

    async def never(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/v2/models/toy/batching", batching)
    app.router.add_post("/v2/models/toy/infer", never)
    async with serving(app) as url:
        started = time.monotonic()
        try:
            done = await asyncio.to_thread(
                tune, url, settings, "--concurrency", "1", "--grid", "--max-batch-size", "4",
                "--max-wait-ms", "0", "--duration", "0.2", "--timeout", "1",
            )  # fmt: skip
        finally:
            release.set()
        took = time.monotonic() - started
    # The nearest is reported and left in the file, and the exit says it is no winner.
    assert done.returncode == 1, done.stderr
    assert "no setting met the objective" in done.stderr
    assert "spec:\n  batching:\n" in done.stdout
    # One trial: its request failed at the timeout rather than holding the trial for minutes.
    assert took < 10
