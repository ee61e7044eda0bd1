"""The model server as a process, with the toy model: batches, errors, probes, metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.model_server import (
    SUPPORT_DIR,
    ModelServer,
    http_get,
    post_batch,
    post_body,
    run_model_server,
    stop,
)

from carpool.contract import wire
from carpool.contract.wire import ItemResult, Tensor
from carpool_sidecar.client import ModelClient

HERE = Path(__file__).resolve().parent


def toy_item(*values: float) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.array(values, dtype=np.float32))}


def output_of(result: ItemResult) -> list[float]:
    assert result.error is None, result.error
    assert result.outputs is not None
    output: list[float] = result.outputs["output"].to_numpy().tolist()
    return output


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    # The max batch size comes from the environment, as in a pod spec. The device is pinned:
    # `auto` would pick a GPU where there is one, and the GPU gauges would appear.
    env = {"CARPOOL_MODEL_MAX_BATCH_SIZE": "8", "CARPOOL_MODEL_DEVICE": "cpu"}
    with run_model_server(
        tmp_path_factory.mktemp("toy"), "toy", env=env, metrics_port=True
    ) as running:
        yield running


def metric_samples(server: ModelServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = http_get(server, "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


async def test_results_come_back_in_order(server: ModelServer) -> None:
    items = [toy_item(i, i + 1, i + 2, i + 3) for i in range(5)]
    results = await post_batch(server, items)
    assert [output_of(r) for r in results] == [
        [2 * v + 1 for v in (i, i + 1, i + 2, i + 3)] for i in range(5)
    ]


async def test_invalid_items_fail_alone(server: ModelServer) -> None:
    items = [
        toy_item(1, 1, 1, 1),
        toy_item(1, 2),  # wrong shape
        toy_item(float("inf"), 0, 0, 0),  # not finite
        {"other": Tensor.from_numpy(np.zeros(4, dtype=np.float32))},  # missing input
        {"input": Tensor.from_numpy(np.zeros(4, dtype=np.int32))},  # wrong datatype
        toy_item(0, 0, 0, 0),
    ]
    results = await post_batch(server, items)
    assert output_of(results[0]) == [3, 3, 3, 3]
    assert output_of(results[5]) == [1, 1, 1, 1]
    for result, words in zip(results[1:5], ["shape", "finite", "missing", "FP32"], strict=True):
        assert result.status == 400
        assert result.error is not None and words in result.error


async def test_poison_item_is_isolated(server: ModelServer) -> None:
    nan = float("nan")
    items = [toy_item(i, i, i, i) for i in range(7)]
    items[2] = items[5] = toy_item(nan, 0, 0, 0)
    results = await post_batch(server, items)
    for poisoned in (results[2], results[5]):
        assert poisoned.status == 500
        assert poisoned.error is not None and "NaN" in poisoned.error
    for index in (0, 1, 3, 4, 6):
        assert output_of(results[index]) == [2 * index + 1] * 4
    assert http_get(server, "/healthz")[0] == 200


async def test_batches_larger_than_the_max_are_split(server: ModelServer) -> None:
    items = [toy_item(i, 0, 0, 0) for i in range(20)]
    results = await post_batch(server, items)
    assert [output_of(r)[0] for r in results] == [2 * i + 1 for i in range(20)]


async def test_concurrent_batches_are_all_answered(server: ModelServer) -> None:
    async def one(offset: int) -> list[ItemResult]:
        return await post_batch(server, [toy_item(offset, offset + k, 0, 0) for k in range(3)])

    answers = await asyncio.gather(*(one(offset * 10) for offset in range(40)))
    for offset, results in enumerate(answers):
        base = offset * 10
        assert [output_of(r)[:2] for r in results] == [
            [2 * base + 1, 2 * (base + k) + 1] for k in range(3)
        ]


async def test_the_framed_socket_serves_batches_as_post_does(server: ModelServer) -> None:
    items = [toy_item(1, 2, 3, 4), toy_item(float("inf"), 0, 0, 0), toy_item(5, 6, 7, 8)]
    client = ModelClient(f"unix://{server.socket}")
    try:
        framed, timing = await client.infer(items, 10.0)
    finally:
        await client.close()
    # The model server says where the batch's time went, for timed dispatch.
    assert timing is not None and timing.worker_s > 0 and timing.queued_s >= 0
    assert framed == await post_batch(server, items)
    assert [r.status for r in framed] == [200, 400, 200]


async def test_empty_batch_gets_empty_results(server: ModelServer) -> None:
    assert await post_batch(server, []) == []


@pytest.mark.parametrize(
    "body",
    [
        b"not msgpack at all \xff",
        msgpack.packb({"nothing": []}),
        msgpack.packb({"items": [{"inputs": {"input": {"datatype": "FP32", "shape": [4]}}}]}),
        msgpack.packb(
            {"items": [{"inputs": {"input": {"datatype": "FP32", "shape": [4], "data": b"ab"}}}]}
        ),
        msgpack.packb({"items": ["no map"]}),
    ],
)
async def test_malformed_body_is_400_json(server: ModelServer, body: bytes) -> None:
    status, answer = await post_body(server, body)
    assert status == 400
    assert "error" in orjson.loads(answer)


def test_metadata_describes_the_model(server: ModelServer) -> None:
    status, body = http_get(server, "/metadata")
    assert status == 200
    assert orjson.loads(body) == {
        "name": "toy",
        "platform": "carpool_toy",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [4]}],
        "max_batch_size": 8,
        "pads_variable_dims": False,
        "streams_tokens": False,
    }


async def test_metrics_count_batches_items_and_errors(server: ModelServer) -> None:
    before = metric_samples(server)
    model = (("model", "toy"),)
    items = [toy_item(1, 1, 1, 1), toy_item(1, 2), toy_item(float("nan"), 0, 0, 0)]
    await post_batch(server, items)
    after = metric_samples(server)

    def grew(name: str, labels: tuple[tuple[str, str], ...] = model) -> float:
        key = (name, tuple(sorted(labels)))
        return after[key] - before.get(key, 0.0)

    assert grew("carpool_model_batch_size_count") == 1
    assert grew("carpool_model_batch_size_sum") == 3
    assert grew("carpool_model_batch_size_bucket", (*model, ("le", "2.0"))) == 0
    assert grew("carpool_model_batch_size_bucket", (*model, ("le", "4.0"))) == 1
    assert grew("carpool_model_batch_duration_seconds_count") == 1
    assert grew("carpool_model_items_total") == 3
    assert grew("carpool_model_errors_total", (("kind", "invalid_item"), *model)) == 1
    assert grew("carpool_model_errors_total", (("kind", "infer"), *model)) == 1
    # On the CPU, no GPU samples (tests/model_server/test_gpu_gauges.py has the CUDA side).
    assert not any(name.startswith("carpool_model_gpu") for name, _ in after)


def test_probe_port_serves_probes_but_not_batches(server: ModelServer) -> None:
    import urllib.error
    import urllib.request

    assert server.metrics_url is not None
    for path in ("/healthz", "/readyz", "/metadata", "/metrics"):
        with urllib.request.urlopen(server.metrics_url + path, timeout=5) as response:
            assert response.status == 200
    request = urllib.request.Request(server.metrics_url + "/batch", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert raised.value.code in (404, 405)


def test_ready_only_after_load_and_sigterm_exits_zero(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_LOAD_S": "1.5"}
    with run_model_server(
        tmp_path, "model_handlers:SlowLoadHandler", env=env, wait_ready=False
    ) as server:
        _wait_for(lambda: _status(server, "/healthz") == 200)
        assert _status(server, "/readyz") == 503
        _wait_for(lambda: _status(server, "/readyz") == 200)
        assert stop(server) == 0


def test_sigterm_while_loading_exits_zero_at_once(tmp_path: Path) -> None:
    # A pod deleted, or a Ctrl-C, during a long load: nothing to drain, no load to wait for.
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_LOAD_S": "120"}
    with run_model_server(
        tmp_path, "model_handlers:SlowLoadHandler", env=env, wait_ready=False
    ) as server:
        _wait_for(lambda: _status(server, "/healthz") == 200)
        server.process.terminate()
        assert server.process.wait(20) == 0
        assert "stopped while the model was loading" in server.log()


def test_failed_load_exits_nonzero(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(SUPPORT_DIR)}
    with run_model_server(
        tmp_path, "model_handlers:FailingLoadHandler", env=env, wait_ready=False
    ) as server:
        assert server.process.wait(30) == 1
        assert "no weights here" in server.log()


async def test_wrong_length_result_fails_the_whole_batch(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(SUPPORT_DIR)}
    with run_model_server(tmp_path, "model_handlers:WrongLengthHandler", env=env) as server:
        results = await post_batch(server, [toy_item(i, 0, 0, 0) for i in range(3)])
    assert [r.status for r in results] == [500, 500, 500]
    assert all(r.error is not None and "2" in r.error and "3" in r.error for r in results)


async def test_sigterm_finishes_the_batch_in_flight(tmp_path: Path) -> None:
    started = tmp_path / "started"
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "1.0"}
    env["CARPOOL_TEST_INFER_STARTED"] = str(started)
    with run_model_server(
        tmp_path, "model_handlers:SlowInferHandler", "--warmup-sizes", "none", env=env
    ) as server:
        pending = asyncio.create_task(post_batch(server, [toy_item(1, 2, 3, 4)]))
        # The SIGTERM comes while the batch is on the model, however slow the machine.
        await asyncio.to_thread(_wait_for, started.exists)
        server.process.terminate()
        results = await pending
        assert output_of(results[0]) == [3, 5, 7, 9]
        assert await asyncio.to_thread(server.process.wait, 10) == 0


def test_config_error_exits_2_naming_key_and_value(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "carpool", "model-server", "--handler", "toy"]
    command += ["--socket", str(tmp_path / "s.sock"), "--max-batch-size", "zero"]
    done = subprocess.run(command, capture_output=True, timeout=60, text=True)
    assert done.returncode == 2
    assert "--max-batch-size" in done.stderr and "'zero'" in done.stderr, done.stderr


def _status(server: ModelServer, path: str) -> int | None:
    try:
        return http_get(server, path, timeout_s=2.0)[0]
    except OSError:
        return None


def _wait_for(condition: object, timeout_s: float = 30.0) -> None:
    import time

    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


async def test_tcp_data_listener(tmp_path: Path) -> None:
    with run_model_server(tmp_path, "toy", "--warmup-sizes", "1", tcp=True) as server:
        assert server.socket is None
        results = await post_batch(server, [toy_item(0, 1, 2, 3)])
    assert output_of(results[0]) == [1, 3, 5, 7]


def test_socket_left_by_a_killed_server_is_replaced(tmp_path: Path) -> None:
    with run_model_server(tmp_path, "toy", "--warmup-sizes", "1") as first:
        first.process.kill()
        first.process.wait(10)
        assert first.socket is not None and first.socket.is_socket()
        with run_model_server(tmp_path, "toy", "--warmup-sizes", "1") as second:
            assert http_get(second, "/readyz")[0] == 200


async def test_a_poisoned_device_fails_health_so_the_container_restarts(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(HERE)}  # for cuda_fault_handlers
    with run_model_server(
        tmp_path, "cuda_fault_handlers:PoisonedContextHandler", env=env, metrics_port=True
    ) as server:
        assert output_of((await post_batch(server, [toy_item(1, 1, 1, 1)]))[0]) == [3, 3, 3, 3]
        assert http_get(server, "/healthz")[0] == 200
        nan = float("nan")
        status, body = await post_body(
            server, wire.encode_request([toy_item(0, 0, 0, 0), toy_item(nan, 0, 0, 0)])
        )
        assert status == 503 and "device-side assert" in orjson.loads(body)["error"]
        # The device stays unusable: clean batches are refused, liveness fails, and the
        # sidecar sees the model server unready.
        status, body = await post_body(server, wire.encode_request([toy_item(1, 1, 1, 1)]))
        assert status == 503 and "restart" in orjson.loads(body)["error"]
        assert http_get(server, "/healthz")[0] == 500
        assert http_get(server, "/readyz")[0] == 503
        labels = (("kind", "infer"), ("model", "cuda_fault_handlers:PoisonedContextHandler"))
        assert metric_samples(server)[("carpool_model_errors_total", labels)] == 2
    assert server.log().count("device is unusable") == 1  # logged once, with its traceback
