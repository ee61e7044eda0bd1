"""A latency objective through the sidecar: what cannot be answered in time is refused at
once with 429 and Retry-After, and the metrics show goodput and the predicted drain.

The model takes 0.2 s per batch of one item, and the objective is 0.7 s: behind a running
batch, two queued requests can still make it, a third cannot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest
from support.model_server import SUPPORT_DIR
from support.sidecar import Pair, infer, metric, run_pair, until

SIDECAR_ARGS = (
    "--max-batch-size", "1", "--max-inflight-batches", "1", "--latency-objective-ms", "700",
)  # fmt: skip
SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.2"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("objective")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *SIDECAR_ARGS, env=SLOW) as both:
        yield both


async def test_what_would_answer_late_is_refused_at_once(
    pair: Pair, http: aiohttp.ClientSession
) -> None:
    sidecar = pair.sidecar
    assert metric(sidecar, "carpool_latency_objective_seconds") == 0.7
    # Batch times are learned from the first answers.
    for _ in range(2):
        assert (await infer(http, sidecar, [[1, 1, 1, 1]]))[0] == 200
    within_before = metric(sidecar, "carpool_requests_within_objective_total")
    assert within_before == 2
    blocker = asyncio.create_task(infer(http, sidecar, [[0, 0, 0, 0]]))
    await until(sidecar, "carpool_inflight_batches", 1)
    queued = []
    for index in range(2):
        queued.append(asyncio.create_task(infer(http, sidecar, [[2, 2, 2, 2]])))
        await until(sidecar, "carpool_queue_items", index + 1)
    # The batch running and the two queued: about 0.2 to 0.6 s to go.
    assert 0.3 < metric(sidecar, "carpool_queue_drain_seconds") < 0.9
    url = f"{sidecar.url}/v2/models/toy/infer"
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
    started = time.monotonic()
    async with http.post(url, json=body) as reply:
        took = time.monotonic() - started
        assert reply.status == 429
        assert int(reply.headers["Retry-After"]) >= 1
        assert "latency objective" in (await reply.json())["error"]
    # At once, not after the 0.8 s it would have taken.
    assert took < 0.2
    assert all(status == 200 for status, _ in await asyncio.gather(blocker, *queued))
    assert metric(sidecar, "carpool_rejected_total", reason="objective") == 1
    assert metric(sidecar, "carpool_requests_within_objective_total") == within_before + 3
    await until(sidecar, "carpool_queue_drain_seconds", 0)
