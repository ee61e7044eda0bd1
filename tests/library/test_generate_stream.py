"""`generate_stream` through a real sidecar and a model server that batches generation
token by token (`--handler-options batching=continuous`), on the tiny GPT-2.

The sidecar sends each generate request on its own, at once: the model server's loop is
the batcher. Streamed pieces join to the unstreamed answer, which is the model's own greedy
`generate` for the prompt alone; a client that leaves ends its sequence on the model server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import torch
from library.test_generate_route import post, request
from library.test_text_generation import generate as generate_static
from library.test_text_generation import prompt_item
from library.tiny_lm import WORDS
from prometheus_client.parser import text_string_to_metric_families
from support.model_server import ModelServer, http_get
from support.sidecar import Pair, Sidecar, metric, run_pair, wait_for

import carpool
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_generation import TextGenerationHandler

MODEL = "gen"
STREAM = f"/v2/models/{MODEL}/generate_stream"


@contextlib.contextmanager
def continuous_pair(folder: Path, model_path: Path) -> Iterator[Pair]:
    """A sidecar, and a model server that batches the model's generation token by token."""
    model_args = ["--model-path", str(model_path), "--device", "cpu", "--max-batch-size", "8"]
    model_args += ["--handler-options", "batching=continuous", "--warmup-sizes", "1"]
    with run_pair(
        folder, "text-generation", "--max-queue-items", "64", model_args=model_args, model=MODEL
    ) as running:
        yield running


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tiny_lm_path: Path) -> Iterator[Pair]:
    with continuous_pair(tmp_path_factory.mktemp("stream"), tiny_lm_path) as running:
        yield running


@pytest.fixture(scope="module")
def static(tiny_lm_path: Path) -> TextGenerationHandler:
    loaded = TextGenerationHandler(HandlerSettings(tiny_lm_path, torch.float32, 64))
    loaded.load(torch.device("cpu"))
    return loaded


async def stream(
    http: aiohttp.ClientSession, sidecar: Sidecar, body: object
) -> tuple[int, list[dict[str, Any]]]:
    """The status and the events' documents of one streamed request."""
    async with http.post(sidecar.url + STREAM, data=orjson.dumps(body)) as reply:
        if reply.status != 200:
            return reply.status, [orjson.loads(await reply.read())]
        assert reply.headers["Content-Type"] == "text/event-stream"
        events = []
        async for line in reply.content:
            if line.startswith(b"data: "):
                events.append(orjson.loads(line[len(b"data: ") :]))
        return reply.status, events


def model_metric(server: ModelServer, name: str, **labels: str) -> float:
    status, body = http_get(server, "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def wait_cancelled(server: ModelServer, cancelled_before: float, count: int) -> None:
    """Until `count` more streams are cancelled on the model server and no sequence runs or
    holds cache: the loop drops a cancelled sequence at its next step (which a loaded
    machine may delay)."""
    wait_for(
        lambda: (
            model_metric(server, "carpool_model_streams_total", outcome="cancelled")
            == cancelled_before + count
            and model_metric(server, "carpool_model_running_sequences") == 0
            and model_metric(server, "carpool_model_kv_cache_usage_ratio") == 0
        ),
        10.0,
        f"{count} streams cancelled, their sequences and cache gone",
    )


def mixed_requests(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(17)
    requests = []
    for index in range(count):
        prompt = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 60))))
        parameters: dict[str, Any] = {"max_tokens": int(rng.integers(1, 40))}
        if index % 4 == 1:
            parameters["stop"] = ["sun", "moon"]
        requests.append(request(prompt, **parameters))
    return requests


async def test_streamed_pieces_join_to_the_answer_of_generate_alone(
    pair: Pair, static: TextGenerationHandler
) -> None:
    requests = mixed_requests(16)
    async with aiohttp.ClientSession() as http:
        streamed = await asyncio.gather(*(stream(http, pair.sidecar, r) for r in requests))
        whole = await asyncio.gather(*(post(http, pair.sidecar, r) for r in requests))
    for body, (status, events), (whole_status, answer) in zip(
        requests, streamed, whole, strict=True
    ):
        assert status == whole_status == 200, (events, answer)
        assert [event["done"] for event in events] == [False] * (len(events) - 1) + [True]
        text = "".join(event["text_output"] for event in events)
        assert text == answer["text_output"]
        last = events[-1]
        assert last["finish_reason"] == answer["finish_reason"]
        assert last["generated_tokens"] == answer["generated_tokens"]
        parameters = body["parameters"]
        item = prompt_item(
            body["text_input"], parameters["max_tokens"], 0.0, parameters.get("stop")
        )
        assert text == generate_static(static, [item])[0]  # the static batch's greedy text
    assert metric(pair.sidecar, "carpool_generation_tokens_total") > 0
    assert metric(pair.sidecar, "carpool_requests_total", code="200", protocol="rest") >= 32


async def test_a_client_that_leaves_ends_its_sequence(pair: Pair) -> None:
    server = pair.model_server
    cancelled = model_metric(server, "carpool_model_streams_total", outcome="cancelled")
    body = request("a red house by the river", max_tokens=240)
    url = pair.sidecar.url + STREAM
    async with aiohttp.ClientSession() as http, http.post(url, data=orjson.dumps(body)) as reply:
        assert reply.status == 200
        await reply.content.readline()  # the first event
        assert model_metric(server, "carpool_model_running_sequences") == 1
    # Gone after its first piece of up to 240: the model server cancels it.
    await asyncio.to_thread(wait_cancelled, server, cancelled, 1)
    assert model_metric(server, "carpool_model_generated_tokens_total") >= 0


async def test_errors_before_the_first_piece_keep_their_status(pair: Pair) -> None:
    async with aiohttp.ClientSession() as http:
        status, (answer,) = await stream(http, pair.sidecar, request("the sky", max_tokens=0))
        assert status == 400 and "max_tokens" in answer["error"]
        past = request("the " * 250, max_tokens=10)  # past the model's context
        status, (answer,) = await stream(http, pair.sidecar, past)
        assert status == 400 and "context" in answer["error"]


async def test_a_seeded_sampled_request_streams_the_static_ways_draw(
    pair: Pair, static: TextGenerationHandler
) -> None:
    body = request("the moon", max_tokens=30, temperature=2.0, seed=3)
    async with aiohttp.ClientSession() as http:
        status, events = await stream(http, pair.sidecar, body)
        whole_status, whole = await post(http, pair.sidecar, body)
    assert status == whole_status == 200
    assert len(events) > 1 and events[-1]["done"]  # piece by piece, from the token loop
    text = "".join(event["text_output"] for event in events)
    assert text == whole["text_output"]
    item = prompt_item("the moon", max_new_tokens=30, temperature=2.0, seed=3)
    assert text == generate_static(static, [item])[0]


async def test_the_library_reads_a_stream_as_an_async_iterator(pair: Pair) -> None:
    prompt = "a red house by the river"
    async with aiohttp.ClientSession() as http:
        events = [
            event
            async for event in carpool.generate_stream(
                http, pair.sidecar.url, MODEL, prompt, max_tokens=12
            )
        ]
        _, whole = await post(http, pair.sidecar, request(prompt, max_tokens=12))
        with pytest.raises(carpool.StreamError) as refused:
            async for _ in carpool.generate_stream(http, pair.sidecar.url, MODEL, "x", stop=5):
                pass
    assert "".join(event.text for event in events) == whole["text_output"]
    assert [event.done for event in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].generated_tokens == whole["generated_tokens"] == 12
    assert refused.value.status == 400 and "stop" in refused.value.message


async def test_an_http_1_0_client_that_asks_to_keep_alive_sees_the_stream_end(
    pair: Pair,
) -> None:
    """HTTP/1.0 has no chunks: an answer of unknown length ends only as its connection
    closes. (Before, aiohttp kept the connection open for the keep-alive asked for, and the
    client waited for the answer's end until its own timeout.)"""
    body = orjson.dumps(request("the sky", max_tokens=3))
    host, port = pair.sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST {STREAM} HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: {len(body)}"
    writer.write(head.encode() + b"\r\n\r\n" + body)
    try:
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the connection's end
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.0 200")
    *_, last = (line for line in answer.split(b"\n") if line.startswith(b"data: "))
    assert orjson.loads(last[len(b"data: ") :])["done"]
