"""REST and gRPC callers of one model share the batcher, and each gets its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from support.sidecar import Pair, infer, metric, run_pair

tritonaio = pytest.importorskip("tritonclient.grpc.aio")

CALLERS = 16  # per protocol
CALLS = 15  # per caller


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("mixed")
    # A long window, so that items arriving together always share a batch.
    with run_pair(tmp_path, "toy", "--dispatch", "fixed", "--max-wait-ms", "20") as both:
        yield both


def grpc_input(rows: np.ndarray[Any, Any]) -> Any:
    tensor = tritonaio.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


async def test_rest_and_grpc_ride_in_one_batch(tmp_path: Any) -> None:
    args = ("--dispatch", "fixed", "--max-wait-ms", "2000", "--max-batch-size", "2")
    with run_pair(tmp_path, "toy", *args) as pair:
        sidecar = pair.sidecar
        client = tritonaio.InferenceServerClient(sidecar.grpc)
        rows = np.array([[1, 2, 3, 4]], dtype=np.float32)
        try:
            async with aiohttp.ClientSession() as http:
                (status, body), result = await asyncio.gather(
                    infer(http, sidecar, [[5, 6, 7, 8]]),
                    client.infer("toy", [grpc_input(rows)]),
                )
        finally:
            await client.close()
        assert status == 200
        assert body["outputs"][0]["data"] == [11, 13, 15, 17]
        np.testing.assert_array_equal(result.as_numpy("output"), 2 * rows + 1)
        # One batch of both items, sent full long before its 2 s window closed.
        assert metric(sidecar, "carpool_batches_total", reason="full") == 1
        assert metric(sidecar, "carpool_batch_size_sum") == 2
        for protocol in ("rest", "grpc"):
            assert metric(sidecar, "carpool_requests_total", protocol=protocol, code="200") == 1


async def test_mixed_load_each_caller_gets_its_own_answer(pair: Pair) -> None:
    sidecar = pair.sidecar
    batches_before = metric(sidecar, "carpool_batch_size_count")

    async def rest_caller(http: aiohttp.ClientSession, caller: int) -> None:
        for call in range(CALLS):
            row = [caller, call, -caller, 0.5]
            status, body = await infer(http, sidecar, [row], id=f"rest-{caller}-{call}")
            assert status == 200, body
            assert body["id"] == f"rest-{caller}-{call}"
            assert body["outputs"][0]["data"] == [2 * value + 1 for value in row]

    async def grpc_caller(client: Any, caller: int) -> None:
        for call in range(CALLS):
            rows = np.array([[caller, call, caller + 1000, -call]] * (1 + call % 3), np.float32)
            request_id = f"grpc-{caller}-{call}"
            result = await client.infer("toy", [grpc_input(rows)], request_id=request_id)
            assert result.get_response().id == request_id
            np.testing.assert_array_equal(result.as_numpy("output"), 2 * rows + 1)

    client = tritonaio.InferenceServerClient(sidecar.grpc)
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(
                *(rest_caller(http, caller) for caller in range(CALLERS)),
                *(grpc_caller(client, caller) for caller in range(CALLERS)),
            )
    finally:
        await client.close()
    calls = CALLERS * CALLS
    for protocol in ("rest", "grpc"):
        assert metric(sidecar, "carpool_requests_total", protocol=protocol, code="200") == calls
    # Batching happened: far fewer batches than requests.
    assert metric(sidecar, "carpool_batch_size_count") - batches_before < calls
