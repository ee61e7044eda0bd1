"""Queueing under a slow model: priorities, a full queue, deadlines and callers who leave.

The model takes 0.3 s per batch and the sidecar sends one item at a time, so a first
"blocker" request keeps the model busy while the test arranges the queue behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest
from support.model_server import SUPPORT_DIR
from support.sidecar import Pair, Sidecar, infer, metric, model_items, run_pair, until

SIDECAR_ARGS = ("--max-batch-size", "1", "--max-inflight-batches", "1", "--max-queue-items", "3")
SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.3"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("overload")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *SIDECAR_ARGS, env=SLOW) as both:
        yield both


async def start_blocker(http: aiohttp.ClientSession, sidecar: Sidecar) -> asyncio.Task[object]:
    await until(sidecar, "carpool_inflight_batches", 0)
    blocker = asyncio.create_task(infer(http, sidecar, [[0, 0, 0, 0]]))
    await until(sidecar, "carpool_inflight_batches", 1)
    return blocker


async def test_priority_level_1_is_served_first(pair: Pair, http: aiohttp.ClientSession) -> None:
    sidecar = pair.sidecar
    done: list[str] = []

    async def caller(name: str, priority: int) -> None:
        status, _ = await infer(http, sidecar, [[1, 2, 3, 4]], parameters={"priority": priority})
        assert status == 200
        done.append(name)

    blocker = await start_blocker(http, sidecar)
    low = []
    for index in range(2):
        # One at a time: two requests sent together may reach the sidecar in either order.
        low.append(asyncio.create_task(caller(f"low{index}", 0)))
        await until(sidecar, "carpool_queue_items", index + 1)
    high = asyncio.create_task(caller("high", 1))  # Triton: 1 is the highest level
    await until(sidecar, "carpool_queue_items", 3)
    await asyncio.gather(blocker, high, *low)
    assert done == ["high", "low0", "low1"]


async def test_full_queue_answers_429_with_retry_after(
    pair: Pair, http: aiohttp.ClientSession
) -> None:
    sidecar = pair.sidecar
    refused_before = metric(sidecar, "carpool_rejected_total", reason="queue_full")
    blocker = await start_blocker(http, sidecar)
    queued = [asyncio.create_task(infer(http, sidecar, [[1, 1, 1, 1]])) for _ in range(3)]
    await until(sidecar, "carpool_queue_items", 3)
    url = f"{sidecar.url}/v2/models/toy/infer"
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
    async with http.post(url, json=body) as reply:
        assert reply.status == 429
        assert int(reply.headers["Retry-After"]) >= 1
        assert "queue full" in (await reply.json())["error"]
    assert all(status == 200 for status, _ in await asyncio.gather(blocker, *queued))
    assert metric(sidecar, "carpool_rejected_total", reason="queue_full") == refused_before + 1


@pytest.mark.parametrize("how", ["parameter", "header"])
async def test_expired_deadline_is_504_and_skips_the_model(
    pair: Pair, http: aiohttp.ClientSession, how: str
) -> None:
    sidecar = pair.sidecar
    items_before = model_items(pair.model_server)
    blocker = await start_blocker(http, sidecar)
    if how == "parameter":  # microseconds, as Triton clients send it
        status, body = await infer(http, sidecar, [[1, 1, 1, 1]], parameters={"timeout": 100_000})
    else:
        headers = {"X-Carpool-Timeout-Ms": "100"}
        status, body = await infer(http, sidecar, [[1, 1, 1, 1]], headers=headers)
    assert status == 504, body
    assert "deadline" in body["error"]
    await blocker
    await until(sidecar, "carpool_inflight_batches", 0)
    assert model_items(pair.model_server) == items_before + 1  # the blocker alone


async def test_caller_who_leaves_is_never_sent(pair: Pair, http: aiohttp.ClientSession) -> None:
    sidecar = pair.sidecar
    gone_before = metric(sidecar, "carpool_requests_total", code="499")
    items_before = model_items(pair.model_server)
    blocker = await start_blocker(http, sidecar)
    leaving = asyncio.create_task(infer(http, sidecar, [[5, 5, 5, 5]]))
    await until(sidecar, "carpool_queue_items", 1)
    leaving.cancel()  # closes the connection: the sidecar cancels the handler
    await until(sidecar, "carpool_queue_items", 0)
    await blocker
    await until(sidecar, "carpool_inflight_batches", 0)
    assert model_items(pair.model_server) == items_before + 1  # the blocker alone
    assert metric(sidecar, "carpool_requests_total", code="499") == gone_before + 1
