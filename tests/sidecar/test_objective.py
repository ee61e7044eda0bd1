"""A latency objective through the sidecar: what cannot be answered in time is refused at
once with 429 and Retry-After, and the metrics show goodput and the predicted drain.

The model takes 0.6 s per batch of one item, and the objective is 2 s: behind a batch that
runs, two queued requests can still make it, a third cannot while the running batch has more
than 0.2 s to go. Requests come 0.05 s after it started: a loaded machine has 0.35 s to spare.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator

import aiohttp
import pytest
from support.model_server import SUPPORT_DIR
from support.sidecar import Pair, infer, metric, run_pair, until, v2_body, wait_for

from carpool.engine.batcher import DRAIN_GAUGE_S

SIDECAR_ARGS = (
    "--max-batch-size", "1", "--max-inflight-batches", "1", "--latency-objective-ms", "2000",
)  # fmt: skip
BATCH_S = 0.6
SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(BATCH_S)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("objective")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *SIDECAR_ARGS, env=SLOW) as both:
        yield both


async def test_what_would_answer_late_is_refused_at_once(
    pair: Pair, http: aiohttp.ClientSession
) -> None:
    sidecar = pair.sidecar
    assert metric(sidecar, "carpool_latency_objective_seconds") == 2.0
    # Batch times are learned from the first answers.
    for _ in range(2):
        assert (await infer(http, sidecar, [[1, 1, 1, 1]]))[0] == 200
    within_before = metric(sidecar, "carpool_requests_within_objective_total")
    assert within_before == 2
    blocker = asyncio.create_task(infer(http, sidecar, [[0, 0, 0, 0]]))
    await asyncio.sleep(0.05)  # it reaches the idle model first; the three come at once

    async def timed() -> tuple[int, dict[str, object], str | None, float]:
        started = time.monotonic()
        url = f"{sidecar.url}/v2/models/toy/infer"
        async with http.post(url, json=v2_body([[2, 2, 2, 2]])) as reply:
            body = await reply.json()
            took = time.monotonic() - started
            return reply.status, body, reply.headers.get("Retry-After"), took

    behind = await asyncio.gather(*(timed() for _ in range(3)))
    assert (await blocker)[0] == 200
    assert sorted(status for status, *_ in behind) == [200, 200, 429]
    ((_, body, retry_after, took),) = [one for one in behind if one[0] == 429]
    assert retry_after is not None and int(retry_after) >= 1
    assert "latency objective" in str(body["error"])
    # At once, not after the 2.4 s it would have taken.
    assert took < 1.0
    assert metric(sidecar, "carpool_rejected_total", reason="objective") == 1
    # The sidecar times its refusals too: within what the client saw.
    assert metric(sidecar, "carpool_refusal_seconds_count", protocol="rest") == 1
    assert 0 < metric(sidecar, "carpool_refusal_seconds_sum", protocol="rest") < took
    assert metric(sidecar, "carpool_requests_within_objective_total") == within_before + 3
    await until(sidecar, "carpool_queue_drain_seconds", 0)


async def test_the_drain_gauge_reads_the_work_ahead(
    pair: Pair, http: aiohttp.ClientSession
) -> None:
    sidecar = pair.sidecar
    assert (await infer(http, sidecar, [[1, 1, 1, 1]]))[0] == 200
    blocker = asyncio.create_task(infer(http, sidecar, [[0, 0, 0, 0]]))
    # The gauge is written at most every DRAIN_GAUGE_S while work runs: the arrival that
    # long after it showed the blocker writes it (sooner, it would still read the blocker's
    # rest alone; the blocker's launch is no mark: the sidecar may write the gauge later).
    drain = functools.partial(metric, sidecar, "carpool_queue_drain_seconds")
    await asyncio.to_thread(wait_for, lambda: drain() > 0, 10.0, "the blocker's drain shown")
    await asyncio.sleep(DRAIN_GAUGE_S)
    queued = asyncio.create_task(infer(http, sidecar, [[2, 2, 2, 2]]))
    await until(sidecar, "carpool_queue_items", 1)
    # The running batch's rest and the queued one's time.
    assert BATCH_S < drain() < 2 * BATCH_S + 0.05
    assert [status for status, _ in await asyncio.gather(blocker, queued)] == [200, 200]
