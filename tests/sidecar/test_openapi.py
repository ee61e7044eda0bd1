"""The OpenAPI document against behaviour: a real sidecar is sent the documented cases.

The sidecar runs as a process in front of a scripted model server (a thread here), so every
documented status can be provoked: each item's value picks what the model server does with
it. For each operation the statuses seen must be the statuses documented, every body must
match the documented schema, and the deadline parameters must count in the documented unit.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from jsonschema import Draft202012Validator
from support.sidecar import Sidecar, get, run_sidecar, until, wait_for

from carpool.contract import wire
from carpool.processes import free_port

# What the scripted model server does with an item, by its value.
ECHO, REFUSE, FAIL, GARBLE, HOLD, DOWN, SLOW = range(7)
SLOW_S = 0.5
BODY_TIMEOUT_S = 0.3
UNITS_S = {"milliseconds": 1e-3, "microseconds": 1e-6}
# Documented but not provoked here, with where it is checked instead.
CHECKED_ELSEWHERE = {("get", "/v2/health/live", "503"): "test_supervision.py"}


@dataclass
class ScriptedModel:
    ready: bool = True
    release: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)
    batches: list[list[float]] = field(default_factory=list)

    def answer(self, body: bytes) -> tuple[int, bytes]:
        values = [float(item["x"].to_numpy()[0]) for item in wire.decode_request(body)]
        self.batches.append(values)
        if DOWN in values:
            return 500, b"model server trouble"
        if GARBLE in values:
            return 200, b"not a batch"
        if HOLD in values:
            self.holding.set()
            self.release.wait(10)
        if SLOW in values:
            time.sleep(SLOW_S)
        results = [
            wire.ItemResult.failed("refused", 400)
            if value == REFUSE
            else wire.ItemResult.failed("failed", 500)
            if value == FAIL
            else wire.ItemResult(outputs={"y": wire.Tensor.from_numpy(np.array([value], "f4"))})
            for value in values
        ]
        return 200, wire.encode_response(results)


METADATA = {
    "name": "m",
    "platform": "scripted",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
    "max_batch_size": 16,
}


def serve_model(model: ScriptedModel, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/readyz":
                self.reply(200 if model.ready else 503, b"{}")
            else:
                self.reply(200, orjson.dumps(METADATA))

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.reply(*model.answer(body))

        def reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class World:
    sidecar: Sidecar
    model: ScriptedModel
    document: dict[str, Any]

    def operation(self, method: str, path: str) -> dict[str, Any]:
        operation: dict[str, Any] = self.document["paths"][path][method]
        return operation

    def check_body(self, method: str, path: str, status: int, body: bytes) -> None:
        """The body is what the document says this operation answers with this status."""
        content = self.operation(method, path)["responses"][str(status)]["content"]
        schema = content["application/json"]["schema"]
        validator = Draft202012Validator({**schema, "components": self.document["components"]})
        validator.validate(orjson.loads(body))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    model = ScriptedModel()
    port = free_port()
    server = serve_model(model, port)
    folder: Path = tmp_path_factory.mktemp("openapi")
    args = ["--max-queue-items", "8", "--max-inflight-batches", "1", "--max-wait-ms", "1"]
    args += ["--body-timeout-seconds", str(BODY_TIMEOUT_S)]
    try:
        with run_sidecar(folder, f"http://127.0.0.1:{port}", *args, model="m") as sidecar:
            status, body = get(sidecar, "/openapi.json")
            assert status == 200
            document = orjson.loads(body)
            yield World(sidecar, model, document)
    finally:
        model.release.set()
        server.shutdown()


def v2(*values: float, **parameters: Any) -> dict[str, Any]:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [len(values), 1], "data": list(values)}]
    return {"inputs": inputs, "parameters": parameters}


def v1(*values: float) -> dict[str, Any]:
    return {"instances": list(values)}


async def send(
    http: aiohttp.ClientSession,
    world: World,
    path: str,
    body: object,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, aiohttp.ClientResponse]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(world.sidecar.url + path, data=data, headers=headers) as reply:
        return reply.status, await reply.read(), reply


async def queue_full(
    http: aiohttp.ClientSession, world: World, path: str, make: Callable[..., object]
) -> int:
    """The answer to `body` while one batch is held at the model and the queue is full."""
    model = world.model
    model.holding.clear()
    model.release.clear()
    held = asyncio.create_task(send(http, world, path, make(HOLD)))
    await asyncio.to_thread(model.holding.wait, 5)
    filler = asyncio.create_task(send(http, world, path, make(*[ECHO] * 8)))
    await until(world.sidecar, "carpool_queue_items", 8)
    status, reply, response = await send(http, world, path, make(ECHO))
    retry_after = int(response.headers["Retry-After"])
    model.release.set()
    assert [(await task)[0] for task in (held, filler)] == [200, 200]
    documented = world.operation("post", OPENAPI_PATHS[path])["responses"]["429"]["headers"]
    bounds = documented["Retry-After"]["schema"]
    assert bounds["minimum"] <= retry_after <= bounds["maximum"]
    world.check_body("post", OPENAPI_PATHS[path], status, reply)
    return status


async def stalled_body(world: World, path: str) -> tuple[int, bytes]:
    """The answer to a request whose body stops short of its Content-Length."""
    host, port = world.sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 100\r\n\r\n"
        writer.write(head.encode() + b'{"inputs": ')
        status_line = await asyncio.wait_for(reader.readline(), BODY_TIMEOUT_S + 5)
        rest = await asyncio.wait_for(reader.read(), 5)  # the sidecar closes the connection
    finally:
        writer.close()
    return int(status_line.split()[1]), rest.split(b"\r\n\r\n", 1)[1]


OPENAPI_PATHS = {
    "/v2/models/m/infer": "/v2/models/{name}/infer",
    "/v2/models/m/versions/1/infer": "/v2/models/{name}/versions/{version}/infer",
    "/v1/models/m:predict": "/v1/models/{name}:predict",
}


@pytest.mark.parametrize("path", list(OPENAPI_PATHS))
async def test_inference_answers_exactly_the_documented_statuses(world: World, path: str) -> None:
    body = v2 if "v2" in path else v1
    cases: list[tuple[str, object]] = [
        (path, body(ECHO, ECHO)),
        (path, b"{not json"),
        (path, body(REFUSE)),
        (path.replace("models/m", "models/unknown", 1), body(ECHO)),
        (path, body(*[ECHO] * 9)),  # more items than --max-queue-items
        (path, body(FAIL)),
        (path, body(GARBLE)),
        (path, body(DOWN)),
    ]
    seen = {}
    async with aiohttp.ClientSession() as http:
        for url, payload in cases:
            status, reply, _ = await send(http, world, url, payload)
            world.check_body("post", OPENAPI_PATHS[path], status, reply)
            seen[status] = url
        status, reply, _ = await send(
            http, world, path, body(SLOW), {"X-Carpool-Timeout-Ms": str(SLOW_S * 100)}
        )
        world.check_body("post", OPENAPI_PATHS[path], status, reply)
        seen[status] = "deadline"
        seen[await queue_full(http, world, path, body)] = "queue full"
    status, reply = await stalled_body(world, path)
    world.check_body("post", OPENAPI_PATHS[path], status, reply)
    seen[status] = "stalled body"
    documented = world.operation("post", OPENAPI_PATHS[path])["responses"]
    assert sorted(map(str, seen)) == sorted(documented)


def deadline_parameters(world: World, path: str) -> list[tuple[str, str, float]]:
    """(where, name, seconds per unit) of each documented deadline of an operation."""
    found = []
    for parameter in world.operation("post", path)["parameters"]:
        if "x-unit" in parameter["schema"]:
            found.append(("header", parameter["name"], UNITS_S[parameter["schema"]["x-unit"]]))
    request = world.operation("post", path)["requestBody"]["content"]["application/json"]
    schemas = world.document["components"]["schemas"]
    name = request["schema"]["$ref"].rsplit("/", 1)[1]
    if "parameters" in schemas[name]["properties"]:
        parameters = schemas["InferParameters"]["properties"]
        for key, schema in parameters.items():
            if "x-unit" in schema:
                found.append(("body", key, UNITS_S[schema["x-unit"]]))
    return found


@pytest.mark.parametrize("path", ["/v2/models/m/infer", "/v1/models/m:predict"])
async def test_deadlines_count_in_the_documented_unit(world: World, path: str) -> None:
    """A deadline shorter than the model's time is 504, a longer one is 200: a value read in
    a unit 1000 times larger or smaller fails one of the two."""
    found = deadline_parameters(world, OPENAPI_PATHS[path])
    assert len(found) == (2 if "v2" in path else 1)
    async with aiohttp.ClientSession() as http:
        for where, name, unit_s in found:
            for seconds, expected in ((SLOW_S / 5, 504), (SLOW_S * 6, 200)):
                value = seconds / unit_s
                body = (
                    v2(SLOW, **{name: value})
                    if where == "body"
                    else (v2(SLOW) if "v2" in path else v1(SLOW))
                )
                headers = {name: str(value)} if where == "header" else None
                status, reply, _ = await send(http, world, path, body, headers)
                assert status == expected, (where, name, value, reply)


async def test_binary_data_is_as_documented(world: World) -> None:
    path = "/v2/models/m/infer"
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [2, 1],
                 "parameters": {"binary_data_size": 8}}
            ],
            "parameters": {"binary_data_output": True},
        }
    )  # fmt: skip
    data = np.array([ECHO, ECHO], "f4").tobytes()
    length = "Inference-Header-Content-Length"
    names = [p["name"] for p in world.operation("post", OPENAPI_PATHS[path])["parameters"]]
    assert length in names
    async with aiohttp.ClientSession() as http:
        status, reply, response = await send(
            http, world, path, header + data, {length: str(len(header))}
        )
        assert status == 200 and response.content_type == "application/octet-stream"
        split = int(response.headers[length])
        world.check_body("post", OPENAPI_PATHS[path], 200, reply[:split])
        assert reply[split:] == data
        status, _, _ = await send(http, world, path, header + data, {length: "x"})
        assert status == 400


async def test_priority_is_served_first(world: World) -> None:
    path = "/v2/models/m/infer"
    world.model.batches.clear()
    async with aiohttp.ClientSession() as http:
        world.model.holding.clear()
        world.model.release.clear()
        held = asyncio.create_task(send(http, world, path, v2(HOLD)))
        await asyncio.to_thread(world.model.holding.wait, 5)
        low = asyncio.create_task(send(http, world, path, v2(*[ECHO] * 4)))
        await until(world.sidecar, "carpool_queue_items", 4)
        high = asyncio.create_task(send(http, world, path, v2(*[SLOW] * 3, priority=1)))
        await until(world.sidecar, "carpool_queue_items", 7)
        world.model.release.set()
        assert [(await task)[0] for task in (held, low, high)] == [200, 200, 200]
    # Both wait behind the held batch, then share the next one, the later request first.
    assert world.model.batches[1] == [SLOW] * 3 + [ECHO] * 4


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/", "/"),
        ("/v2/health/live", "/v2/health/live"),
        ("/v2/health/ready", "/v2/health/ready"),
        ("/v2", "/v2"),
        ("/v2/models/m", "/v2/models/{name}"),
        ("/v2/models/m/versions/1", "/v2/models/{name}/versions/{version}"),
        ("/v2/models/m/ready", "/v2/models/{name}/ready"),
        ("/v2/models/m/versions/1/ready", "/v2/models/{name}/versions/{version}/ready"),
        ("/v2/models/m/batching", "/v2/models/{name}/batching"),
        ("/v1/models/m", "/v1/models/{name}"),
    ],
)
def test_probes_and_metadata_answer_exactly_the_documented_statuses(
    world: World, path: str, template: str
) -> None:
    seen: set[str] = set()
    wrong = [path.replace("models/m", "models/unknown", 1)] if "models/m" in path else []
    if "versions/1" in path:
        wrong.append(path.replace("versions/1", "versions/2"))
    for url in [path, *wrong]:
        status, body = get(world.sidecar, url)
        world.check_body("get", template, status, body)
        seen.add(str(status))
    world.model.ready = False
    try:
        wait_for(lambda: get(world.sidecar, "/v2/health/ready")[0] == 503, what="not ready")
        status, body = get(world.sidecar, path)
        world.check_body("get", template, status, body)
        seen.add(str(status))
    finally:
        world.model.ready = True
        wait_for(lambda: get(world.sidecar, "/v2/health/ready")[0] == 200, what="ready")
    documented = {
        status
        for status in world.operation("get", template)["responses"]
        if ("get", template, status) not in CHECKED_ELSEWHERE
    }
    assert seen == documented
