"""The sidecar around its model server's failures, its own shutdown, and live settings."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from support.model_server import SUPPORT_DIR, run_model_server
from support.sidecar import Sidecar, get, infer, metric, run_pair, run_sidecar, v2_body, wait_for

from carpool import processes
from carpool.processes import free_port

SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "2"}


async def test_model_server_killed_mid_batch_then_back(tmp_path: Path) -> None:
    slow = ("model_handlers:SlowInferHandler", "--model-name", "toy")
    with (
        run_model_server(tmp_path, *slow, env=SLOW) as server,
        run_sidecar(tmp_path, f"unix://{server.socket}") as sidecar,
    ):
        async with aiohttp.ClientSession() as http:
            caught = asyncio.create_task(infer(http, sidecar, [[1, 2, 3, 4]]))
            await asyncio.to_thread(
                wait_for, lambda: metric(sidecar, "carpool_inflight_batches") == 1
            )
            started = time.monotonic()
            server.process.kill()
            status, body = await caught
            assert status == 503, body
            assert time.monotonic() - started < 1.5  # the 30 s timeout is not waited out
            await asyncio.to_thread(wait_for, lambda: get(sidecar, "/v2/health/ready")[0] == 503)
            status, body = await infer(http, sidecar, [[1, 2, 3, 4]])
            assert status == 503, body
            with run_model_server(tmp_path, "toy", "--model-name", "toy"):
                await asyncio.to_thread(
                    wait_for, lambda: get(sidecar, "/v2/health/ready")[0] == 200, 30.0
                )
                status, body = await infer(http, sidecar, [[1, 2, 3, 4]])
                assert status == 200, body
                assert body["outputs"][0]["data"] == [3, 5, 7, 9]


async def test_sigterm_drains_everything_accepted(tmp_path: Path) -> None:
    slow = {**SLOW, "CARPOOL_TEST_INFER_S": "0.3"}
    args = ("--max-batch-size", "2", "--max-inflight-batches", "1", "--drain-seconds", "20")
    args += ("--drain-delay-seconds", "0.5")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *args, env=slow) as pair:
        sidecar = pair.sidecar
        url = f"{sidecar.url}/v2/models/toy/infer"

        async def call(http: aiohttp.ClientSession, i: int) -> tuple[int, Any, str | None]:
            async with http.post(url, json=v2_body([[i, i, i, i]])) as reply:
                return reply.status, await reply.json(), reply.headers.get("Connection")

        async with aiohttp.ClientSession() as http:
            calls = [asyncio.create_task(call(http, i)) for i in range(10)]
            await asyncio.to_thread(wait_for, lambda: metric(sidecar, "carpool_queue_items") >= 6)
            sidecar.process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(wait_for, lambda: get(sidecar, "/v2/health/ready")[0] == 503)
            # Not ready, but still serving through the drain delay, closing each connection.
            async with http.post(url, json=v2_body([[1, 1, 1, 1]])) as reply:
                assert reply.status == 200
                assert reply.headers["Connection"] == "close"
            results = await asyncio.gather(*calls)
        for i, (status, body, _) in enumerate(results):
            assert status == 200, body
            assert body["outputs"][0]["data"] == [2 * i + 1] * 4
        # Those still queued at the SIGTERM were answered after it: they close too.
        assert sum(connection == "close" for *_, connection in results) >= 6
        assert sidecar.process.wait(15) == 0, sidecar.log()
        assert "drain" in sidecar.log()


async def test_settings_file_changes_the_batch_size_live(tmp_path: Path) -> None:
    settings = tmp_path / "batching.json"
    settings.write_bytes(orjson.dumps({"maxBatchSize": 2}))
    with run_pair(tmp_path, "toy", "--config-file", str(settings)) as pair:
        sidecar = pair.sidecar
        rows = [[float(i)] * 4 for i in range(8)]

        async def batches_for_eight() -> float:
            before = metric(sidecar, "carpool_batch_size_count")
            status, body = await infer(http, sidecar, rows)
            assert status == 200, body
            return metric(sidecar, "carpool_batch_size_count") - before

        async with aiohttp.ClientSession() as http:
            assert await batches_for_eight() == 4
            settings.write_bytes(orjson.dumps({"maxBatchSize": 8, "maxWaitMs": 5}))
            deadline = time.monotonic() + 10
            while await batches_for_eight() != 1:
                assert time.monotonic() < deadline, "new maxBatchSize not applied"
                await asyncio.sleep(0.2)
            # The sidecar says which settings it uses.
            assert in_use(sidecar)["maxBatchSize"] == 8
            assert in_use(sidecar)["maxWaitMs"] == 5
            # A bad file is ignored: the last good settings stay, the sidecar lives on.
            settings.write_bytes(b'{"maxBatchSize": -1}')
            await asyncio.sleep(1.5)
            assert await batches_for_eight() == 1
            assert in_use(sidecar)["maxBatchSize"] == 8
        assert "maxBatchSize" in sidecar.log()
        assert sidecar.process.poll() is None


def in_use(sidecar: Sidecar) -> dict[str, Any]:
    """The batching settings the sidecar says it uses."""
    status, body = get(sidecar, f"/v2/models/{sidecar.model}/batching")
    assert status == 200, body
    settings: dict[str, Any] = orjson.loads(body)["batching"]
    return settings


async def infer_binary(
    http: aiohttp.ClientSession, sidecar: Sidecar, row: list[float]
) -> tuple[int, Any]:
    """One toy item as binary data: JSON cannot carry an infinite value."""
    values = np.array(row, dtype="<f4")
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4]}
    header = orjson.dumps(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": values.nbytes}}]}
    )
    url = f"{sidecar.url}/v2/models/{sidecar.model}/infer"
    headers = {"Inference-Header-Content-Length": str(len(header))}
    async with http.post(url, data=header + values.tobytes(), headers=headers) as reply:
        return reply.status, await reply.json(content_type=None)


async def test_bad_item_fails_alone_within_a_shared_batch(tmp_path: Path) -> None:
    args = ("--max-batch-size", "8", "--max-inflight-batches", "1")
    slow = {**SLOW, "CARPOOL_TEST_INFER_S": "0.5"}
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *args, env=slow) as pair:
        sidecar = pair.sidecar
        async with aiohttp.ClientSession() as http:
            blocker = asyncio.create_task(infer(http, sidecar, [[0, 0, 0, 0]]))
            await asyncio.to_thread(
                wait_for, lambda: metric(sidecar, "carpool_inflight_batches") == 1
            )
            # Queued while the blocker runs, so they leave together as the next batch.
            calls = [
                asyncio.create_task(infer(http, sidecar, [[1, 1, 1, 1]])),
                asyncio.create_task(infer_binary(http, sidecar, [2, np.inf, 2, 2])),
                asyncio.create_task(infer(http, sidecar, [[3, 3, 3, 3]])),
            ]
            await asyncio.to_thread(wait_for, lambda: metric(sidecar, "carpool_queue_items") == 3)
            (good1, body1), (bad, bad_body), (good3, body3) = await asyncio.gather(*calls)
            await blocker
        assert bad == 400 and "finite" in bad_body["error"], bad_body
        assert (good1, good3) == (200, 200)
        assert body1["outputs"][0]["data"] == [3] * 4 and body3["outputs"][0]["data"] == [7] * 4
        # Two batches: the blocker, then all three requests at once.
        assert metric(sidecar, "carpool_batch_size_count") == 2
        assert metric(sidecar, "carpool_batch_size_sum") == 4


async def test_drain_grace_over_answers_waiting_callers_503(tmp_path: Path) -> None:
    # A batch outlasts the drain grace, but not the test's patience when teardown awaits it.
    slow = {**SLOW, "CARPOOL_TEST_INFER_S": "4"}
    args = ("--max-inflight-batches", "1", "--drain-seconds", "0.5", "--drain-delay-seconds", "0")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *args, env=slow) as pair:
        sidecar = pair.sidecar
        async with aiohttp.ClientSession() as http:
            running = asyncio.create_task(infer(http, sidecar, [[1, 1, 1, 1]]))
            await asyncio.to_thread(
                wait_for, lambda: metric(sidecar, "carpool_inflight_batches") == 1
            )
            queued = asyncio.create_task(infer(http, sidecar, [[2, 2, 2, 2]]))
            await asyncio.to_thread(wait_for, lambda: metric(sidecar, "carpool_queue_items") == 1)
            sidecar.process.send_signal(signal.SIGTERM)
            for status, body in await asyncio.gather(running, queued):
                assert status == 503, body
        # Long before the drain grace plus the 5 s shutdown timeout.
        assert sidecar.process.wait(5.0) == 0, sidecar.log()


@pytest.mark.parametrize("taken", ["http", "grpc"])
def test_a_taken_port_is_one_clear_line_and_exit_1(taken: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = str(holder.getsockname()[1])
        ports = {"http": str(free_port()), "grpc": str(free_port()), taken: held}
        command = processes.carpool_command("sidecar", "--model-name", "m")
        command += ["--model-server", "unix:///nonexistent.sock"]
        command += ["--port", ports["http"], "--grpc-port", ports["grpc"]]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"Error: cannot listen on 127.0.0.1:{held}" in done.stderr
    # Not a crash: no traceback, and the app's background tasks ended cleanly.
    assert "Traceback" not in done.stderr, done.stderr
