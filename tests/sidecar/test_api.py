"""The HTTP API through a real sidecar and a real toy model server (output = 2 * input + 1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import yarl
from support.sidecar import Pair, Sidecar, get, infer, metric, run_pair, v2_body

# A long window: only dispatch that sends to an idle model at once (timed, adaptive) keeps a
# lone request from waiting for it.
SIDECAR_ARGS = (
    *("--max-batch-size", "8", "--max-wait-ms", "2000", "--max-body-bytes", "4096"),
    *("--max-answer-bytes", "2048"),  # 32 toy items as JSON, 128 as binary
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with run_pair(tmp_path_factory.mktemp("api"), "toy", *SIDECAR_ARGS) as both:
        yield both


@pytest.fixture
def sidecar(pair: Pair) -> Sidecar:
    return pair.sidecar


def expected(rows: list[list[float]]) -> list[float]:
    return [2 * value + 1 for row in rows for value in row]


def batches(sidecar: Sidecar) -> dict[str, float]:
    names = ("full", "timeout", "idle", "model_ready", "drain")
    return {reason: metric(sidecar, "carpool_batches_total", reason=reason) for reason in names}


async def test_health_and_metadata(sidecar: Sidecar) -> None:
    assert get(sidecar, "/v2/health/live")[0] == 200
    assert get(sidecar, "/v2/health/ready")[0] == 200
    assert get(sidecar, "/v2/models/toy/ready")[0] == 200
    status, body = get(sidecar, "/v2/models/toy")
    assert status == 200
    metadata = orjson.loads(body)
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["outputs"][0]["name"] == "output"
    server = orjson.loads(get(sidecar, "/v2")[1])
    assert "binary_tensor_data" in server["extensions"]
    assert get(sidecar, "/v2/models/other")[0] == 404


async def test_json_request_echoes_id_and_counts_items(sidecar: Sidecar) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [0.5, 0.0, -1.0, 8.0]]
    async with aiohttp.ClientSession() as http:
        status, body = await infer(http, sidecar, rows, id="req-7")
    assert status == 200, body
    assert body["id"] == "req-7" and body["model_name"] == "toy" and body["model_version"] == "1"
    [output] = body["outputs"]
    assert output["shape"] == [2, 4] and output["datatype"] == "FP32"
    assert output["data"] == expected(rows)


async def test_binary_request_and_response(sidecar: Sidecar) -> None:
    values = np.arange(12, dtype="<f4")
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [3, 4],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    )
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{sidecar.url}/v2/models/toy/infer", data=header + values.tobytes(), headers=headers
        ) as reply,
    ):
        body = await reply.read()
        assert reply.status == 200, body
        assert reply.headers["Content-Type"] == "application/octet-stream"
        length = int(reply.headers["Inference-Header-Content-Length"])
    [output] = orjson.loads(body[:length])["outputs"]
    assert output["shape"] == [3, 4]
    assert output["parameters"]["binary_data_size"] == values.nbytes
    assert np.frombuffer(body[length:], "<f4").tolist() == (values * 2 + 1).tolist()


async def test_requested_outputs_filter(sidecar: Sidecar) -> None:
    async with aiohttp.ClientSession() as http:
        status, body = await infer(http, sidecar, [[1, 1, 1, 1]], outputs=[{"name": "output"}])
        assert status == 200 and [o["name"] for o in body["outputs"]] == ["output"]
        status, body = await infer(http, sidecar, [[1, 1, 1, 1]], outputs=[{"name": "nope"}])
        assert status == 400 and "nope" in body["error"]
        twice = [{"name": "output"}, {"name": "output"}]
        status, body = await infer(http, sidecar, [[1, 1, 1, 1]], outputs=twice)
        assert status == 400 and "'output' already requested" in body["error"]


async def test_an_answer_over_the_limit_is_refused_before_the_model_runs(sidecar: Sidecar) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0]] * 40  # a 1 KB request for up to 2,560 bytes of JSON
    items_before = metric(sidecar, "carpool_batch_size_sum")
    async with aiohttp.ClientSession() as http:
        status, body = await infer(http, sidecar, rows)
    assert status == 413 and "up to 2560 bytes, more than the limit of 2048" in body["error"]
    assert metric(sidecar, "carpool_batch_size_sum") == items_before


async def test_kserve_v1_predict(sidecar: Sidecar) -> None:
    instances = [[1, 2, 3, 4], [0, 0, 0, 0], [-1, -1, -1, -1]]
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.url}/v1/models/toy:predict", json={"instances": instances}) as reply,
    ):
        assert reply.status == 200
        body = await reply.json()
    assert body == {"predictions": [[3, 5, 7, 9], [1, 1, 1, 1], [-1, -1, -1, -1]]}


async def test_lone_request_does_not_wait_for_the_window(sidecar: Sidecar) -> None:
    before = batches(sidecar)
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        status, _ = await infer(http, sidecar, [[1, 2, 3, 4]])
    elapsed = time.monotonic() - started
    after = batches(sidecar)
    assert status == 200
    assert after["idle"] - before["idle"] == 1
    assert after["timeout"] == before["timeout"]
    # The window is 2 s; an idle dispatch answers long before it closes.
    assert elapsed < 1.5


async def test_request_larger_than_a_batch_is_split_and_stitched(sidecar: Sidecar) -> None:
    count_before = metric(sidecar, "carpool_batch_size_count")
    rows = [[float(i), float(i + 1), float(i + 2), float(i + 3)] for i in range(20)]
    async with aiohttp.ClientSession() as http:
        status, body = await infer(http, sidecar, rows)
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [20, 4]
    assert body["outputs"][0]["data"] == expected(rows)
    # 20 items with batches of at most 8: at least 3 batches.
    assert metric(sidecar, "carpool_batch_size_count") - count_before >= 3


async def test_64_concurrent_clients_get_their_own_results_in_batches(sidecar: Sidecar) -> None:
    count_before = metric(sidecar, "carpool_batch_size_count")
    sum_before = metric(sidecar, "carpool_batch_size_sum")

    async def client(http: aiohttp.ClientSession, index: int) -> None:
        for round_ in range(4):
            rows = [[index, round_, index * round_, -index]] * (1 + index % 3)
            status, body = await infer(http, sidecar, rows, id=f"{index}-{round_}")
            assert status == 200, body
            assert body["id"] == f"{index}-{round_}"
            assert body["outputs"][0]["data"] == expected(rows)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        await asyncio.gather(*(client(http, index) for index in range(64)))
    batches_sent = metric(sidecar, "carpool_batch_size_count") - count_before
    items_sent = metric(sidecar, "carpool_batch_size_sum") - sum_before
    assert items_sent == sum(4 * (1 + index % 3) for index in range(64))
    assert items_sent / batches_sent > 1, "no batching happened"


def tensor_body(name: str, datatype: str, shape: list[int], data: list[int]) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"inputs": [{"name": "\xff"}]}', 400, "not valid JSON"),  # not UTF-8
        (b'{"id": "\xff", ' + tensor_body("input", "FP32", [1, 4], [1, 2, 3, 4])[1:], 400, "id"),
        (tensor_body("input", "FP32", [1, 3], [1, 2, 3]), 400, "shape"),
        (tensor_body("input", "INT32", [1, 4], [1, 2, 3, 4]), 400, "datatype"),
        (tensor_body("other", "FP32", [1, 4], [1, 2, 3, 4]), 400, "input"),
        (orjson.dumps({"inputs": []}), 400, "inputs"),
        (b"x" * 5000, 413, "limit"),
    ],
)
async def test_bad_requests_fail_alone(
    sidecar: Sidecar, body: bytes, status: int, message: str
) -> None:
    rejected_before = metric(sidecar, "carpool_rejected_total", reason="bad_request")

    async def good(http: aiohttp.ClientSession, index: int) -> tuple[int, Any]:
        return await infer(http, sidecar, [[index, 0, 0, 0]])

    async def bad(http: aiohttp.ClientSession) -> tuple[int, Any]:
        async with http.post(f"{sidecar.url}/v2/models/toy/infer", data=body) as reply:
            return reply.status, await reply.json()

    async with aiohttp.ClientSession() as http:
        outcomes = await asyncio.gather(bad(http), *(good(http, index) for index in range(16)))
    (bad_status, bad_body), *goods = outcomes
    assert bad_status == status and message in bad_body["error"]
    assert all(code == 200 for code, _ in goods)
    if status == 400:
        assert (
            metric(sidecar, "carpool_rejected_total", reason="bad_request") == rejected_before + 1
        )


async def test_unknown_model_is_404(sidecar: Sidecar) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.url}/v2/models/resnet/infer", json={"inputs": []}) as reply,
    ):
        assert reply.status == 404
        assert "resnet" in (await reply.json())["error"]


@pytest.mark.parametrize(("poison", "status"), [(np.inf, 400), (np.nan, 500)])
async def test_item_error_reaches_only_its_caller(
    sidecar: Sidecar, poison: float, status: int
) -> None:
    values = np.array([1, poison, 3, 4], dtype="<f4")
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(header))}

    async def bad(http: aiohttp.ClientSession) -> tuple[int, Any]:
        url = f"{sidecar.url}/v2/models/toy/infer"
        async with http.post(url, data=header + values.tobytes(), headers=headers) as reply:
            return reply.status, await reply.json()

    async with aiohttp.ClientSession() as http:
        goods = [infer(http, sidecar, [[index, 1, 1, 1]]) for index in range(16)]
        (bad_status, bad_body), *good_outcomes = await asyncio.gather(bad(http), *goods)
    assert bad_status == status, bad_body
    for index, (good_status, body) in enumerate(good_outcomes):
        assert good_status == 200, body
        assert body["outputs"][0]["data"] == [2 * index + 1, 3, 3, 3]


async def test_only_the_served_version_exists(sidecar: Sidecar) -> None:
    assert get(sidecar, "/v2/models/toy/versions/1")[0] == 200
    assert get(sidecar, "/v2/models/toy/versions/1/ready")[0] == 200
    status, body = get(sidecar, "/v2/models/toy/versions/2")
    assert status == 404 and "version" in orjson.loads(body)["error"]
    async with aiohttp.ClientSession() as http:
        url = f"{sidecar.url}/v2/models/toy/versions/2/infer"
        async with http.post(url, json=v2_body([[1, 2, 3, 4]])) as reply:
            assert reply.status == 404


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/toy/infer",
        "/v2/models/toy/infer?trace=1",
        "/v2/models/toy/versions/1/infer",
        "/v2/models/t%6Fy/infer",  # decoded by the router
        "/v2/models/toy/versions/%31/infer",
    ],
)
async def test_the_infer_route_answers_and_counts_however_its_path_is_spelled(
    sidecar: Sidecar, path: str
) -> None:
    counted = metric(sidecar, "carpool_requests_total", protocol="rest", code="200")
    url = yarl.URL(sidecar.url + path, encoded=True)
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=v2_body([[1, 2, 3, 4]])) as reply,
    ):
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "application/json"
        assert (await reply.json())["outputs"][0]["data"] == [3, 5, 7, 9]
    assert metric(sidecar, "carpool_requests_total", protocol="rest", code="200") == counted + 1


async def test_a_caller_that_expects_100_continue_is_answered(sidecar: Sidecar) -> None:
    url = f"{sidecar.url}/v2/models/toy/infer"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=v2_body([[1, 2, 3, 4]]), expect100=True) as reply,
    ):
        assert reply.status == 200
        assert (await reply.json())["outputs"][0]["data"] == [3, 5, 7, 9]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v2/models/toy/versions/2/infer", 404),
        ("POST", "/v2/models/other/infer", 404),
        ("POST", "/v2/models/toy/infer/", 404),
        ("POST", "/v2/models//infer", 404),
        ("GET", "/v2/models/toy/infer", 405),
    ],
)
async def test_a_wrong_infer_path_or_method_is_refused_in_json(
    sidecar: Sidecar, method: str, path: str, status: int
) -> None:
    url = yarl.URL(sidecar.url + path, encoded=True)
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, json=v2_body([[1, 2, 3, 4]])) as reply,
    ):
        assert reply.status == status
        assert reply.headers["Content-Type"] == "application/json"
        assert (await reply.json())["error"]
        if status == 405:  # RFC 9110: a 405 names the methods the resource takes
            assert reply.headers["Allow"] == "POST"


@pytest.mark.parametrize("path", ["/v2/models/toy/infer", "/v1/models/toy:predict"])
async def test_a_body_not_in_its_content_encoding_is_400(sidecar: Sidecar, path: str) -> None:
    """Plain JSON said to be gzip: aiohttp fails to decode it as the route reads the body.
    (Before: 500, "internal error", and two tracebacks in the log.)"""
    rejected_before = metric(sidecar, "carpool_rejected_total", reason="bad_request")
    headers = {"Content-Encoding": "gzip"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(sidecar.url + path, json=v2_body([[1, 2, 3, 4]]), headers=headers) as reply,
    ):
        assert reply.status == 400
        assert "content-encoding: gzip" in (await reply.json())["error"]
    assert metric(sidecar, "carpool_rejected_total", reason="bad_request") == rejected_before + 1


async def test_header_length_with_a_non_ascii_digit_is_400(sidecar: Sidecar) -> None:
    body = orjson.dumps(v2_body([[1, 2, 3, 4]]))
    # U+00B2 SUPERSCRIPT TWO: str.isdigit() says yes, int() says no.
    headers = {"Inference-Header-Content-Length": "\u00b2"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.url}/v2/models/toy/infer", data=body, headers=headers) as reply,
    ):
        assert reply.status == 400
        assert "Inference-Header-Content-Length" in (await reply.json())["error"]


async def test_an_output_can_opt_out_of_binary_data(sidecar: Sidecar) -> None:
    outputs = [{"name": "output", "parameters": {"binary_data": False}}]
    async with aiohttp.ClientSession() as http:
        status, body = await infer(
            http,
            sidecar,
            [[1.0, 2.0, 3.0, 4.0]],
            outputs=outputs,
            parameters={"binary_data_output": True},
        )
    assert status == 200, body
    assert body["outputs"][0]["data"] == [3, 5, 7, 9]


async def test_deadline_counts_from_arrival_not_from_the_parsed_body(sidecar: Sidecar) -> None:
    body = orjson.dumps(v2_body([[1, 2, 3, 4]]))

    async def slow_body() -> AsyncIterator[bytes]:
        yield body[:10]
        await asyncio.sleep(2.0)  # the client takes longer to send than its deadline allows
        yield body[10:]

    headers = {"X-Carpool-Timeout-Ms": "200", "Content-Length": str(len(body))}
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.url}/v2/models/toy/infer", data=slow_body(), headers=headers) as reply,
    ):
        # The request did not arrive by its deadline: 408 then, not after the body.
        assert reply.status == 408, await reply.text()
        assert "deadline" in (await reply.json())["error"]
        assert reply.headers["Connection"] == "close"
    # Near its 200 ms deadline, long before the body's end (with time to spare for a loaded
    # machine's timers).
    assert time.monotonic() - started < 1.5


async def test_a_body_arriving_in_pieces_is_read_whole(sidecar: Sidecar) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
    body = orjson.dumps(v2_body(rows))

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 16):
            yield body[start : start + 16]
            await asyncio.sleep(0.01)

    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.url}/v2/models/toy/infer", data=pieces()) as reply,
    ):
        assert reply.status == 200, await reply.text()
        assert (await reply.json())["outputs"][0]["data"] == expected(rows)
