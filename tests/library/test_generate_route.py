"""Text generation through the sidecar: the Open Inference Protocol generate extension.

A real sidecar in front of a real model server running the text-generation handler on the
tiny GPT-2. The sidecar waits a fixed 300 ms for each batch to fill, so requests sent
together batch whenever their batch keys allow it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from jsonschema import Draft202012Validator
from library.tiny_lm import WORDS
from support.sidecar import Pair, Sidecar, get, metric, run_pair

from carpool import processes
from carpool.processes import free_port

MODEL = "gen"
GENERATE = f"/v2/models/{MODEL}/generate"
WAIT_MS = 300


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tiny_lm_path: Path) -> Iterator[Pair]:
    model_args = ["--model-path", str(tiny_lm_path), "--device", "cpu", "--warmup-sizes", "1,4"]
    sidecar_args = ["--dispatch", "fixed", "--max-wait-ms", str(WAIT_MS)]
    sidecar_args += ["--max-batch-size", "32"]
    with run_pair(
        tmp_path_factory.mktemp("generate"),
        "text-generation",
        *sidecar_args,
        model_args=model_args,
        model=MODEL,
    ) as running:
        yield running


async def post(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    body: object,
    path: str = GENERATE,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.post(sidecar.url + path, data=orjson.dumps(body), headers=headers) as reply:
        return reply.status, orjson.loads(await reply.read())


def request(prompt: str, **parameters: Any) -> dict[str, Any]:
    return {"text_input": prompt, "parameters": parameters}


def mixed_requests() -> list[dict[str, Any]]:
    """Prompts of 1 to 40 words (three prompt-length buckets) with mixed settings."""
    rng = np.random.default_rng(11)
    requests = []
    for index in range(16):
        prompt = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 40))))
        parameters: dict[str, Any] = {"max_tokens": int(rng.choice([3, 4, 12, 14, 25]))}
        if index % 3 == 0:
            parameters["stop"] = ["sun", "moon"]
        if index % 4 == 1:
            parameters["temperature"] = 0
        if index % 5 == 2:
            del parameters["max_tokens"]  # the default, 20
        requests.append(request(prompt, **parameters))
    return requests


def batches(sidecar: Sidecar) -> tuple[float, float]:
    """(batches run, items in them) so far."""
    return (
        metric(sidecar, "carpool_batch_size_count"),
        metric(sidecar, "carpool_batch_size_sum"),
    )


def validator(sidecar: Sidecar, status: int) -> Draft202012Validator:
    """The schema /openapi.json documents for a generate answer with `status`."""
    document = orjson.loads(get(sidecar, "/openapi.json")[1])
    operation = document["paths"]["/v2/models/{name}/generate"]["post"]
    schema = operation["responses"][str(status)]["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": document["components"]})


async def test_concurrent_requests_batch_and_each_gets_what_it_gets_alone(pair: Pair) -> None:
    sidecar = pair.sidecar
    requests = mixed_requests()
    async with aiohttp.ClientSession() as http:
        alone = []
        for body in requests:
            status, answer = await post(http, sidecar, body)
            assert status == 200, answer
            alone.append(answer["text_output"])
        before = batches(sidecar)
        # A sampled neighbour puts its batch on the sampling path; greedy rows must not notice.
        sampled = request(requests[0]["text_input"], max_tokens=14, temperature=1.5)
        answers = await asyncio.gather(*(post(http, sidecar, r) for r in [*requests, sampled]))
    after = batches(sidecar)
    assert [status for status, _ in answers] == [200] * len(answers)
    assert [answer["text_output"] for _, answer in answers[:-1]] == alone
    assert all(text for text in alone)
    assert isinstance(answers[-1][1]["text_output"], str)
    ok = validator(sidecar, 200)
    for _, answer in answers:
        ok.validate(answer)
        assert answer["model_name"] == MODEL and answer["model_version"] == "1"
    batch_count, item_count = after[0] - before[0], after[1] - before[1]
    assert item_count == len(answers)
    # 17 requests in at most 3 prompt-length x 4 max_new_tokens buckets: they shared batches.
    assert batch_count <= len(answers) / 2, (batch_count, item_count)


async def test_short_requests_do_not_share_a_batch_with_long_ones(pair: Pair) -> None:
    sidecar = pair.sidecar
    prompt = "the cat sat on the mat"

    async def together(*limits: int) -> float:
        before = batches(sidecar)
        async with aiohttp.ClientSession() as http:
            answers = await asyncio.gather(
                *(post(http, sidecar, request(prompt, max_tokens=n)) for n in limits)
            )
        assert [status for status, _ in answers] == [200] * len(limits)
        after = batches(sidecar)
        assert after[1] - before[1] == len(limits)
        return after[0] - before[0]

    assert await together(2, 30) == 2  # buckets 2 and 32
    assert await together(5, 7, 8) == 1  # all in bucket 8


@pytest.mark.parametrize(
    "settings",
    [("max_new_tokens", "temperature", "stop"), ("max_new_tokens",), ()],
    ids=["every-setting", "max-new-tokens", "text-only"],
)
async def test_infer_and_generate_give_the_same_text(pair: Pair, settings: tuple[str, ...]) -> None:
    """An /infer client (Triton's) may leave out any setting: it gets /generate's default."""
    sidecar = pair.sidecar
    prompt = "a red house by the river"
    given = {
        "max_new_tokens": ("INT32", 9),
        "temperature": ("FP32", 0.0),
        "stop": ("BYTES", ""),
    }
    inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [prompt]}]
    for name in settings:
        datatype, value = given[name]
        inputs.append({"name": name, "datatype": datatype, "shape": [1, 1], "data": [value]})
    parameters = {"max_tokens": 9} if "max_new_tokens" in settings else {}
    async with aiohttp.ClientSession() as http:
        status, generated = await post(http, sidecar, request(prompt, **parameters))
        assert status == 200, generated
        status, inferred = await post(
            http, sidecar, {"inputs": inputs}, path=f"/v2/models/{MODEL}/infer"
        )
        assert status == 200, inferred
        versioned = f"/v2/models/{MODEL}/versions/1/generate"
        status, again = await post(http, sidecar, request(prompt, **parameters), versioned)
    outputs = {output["name"]: output["data"] for output in inferred["outputs"]}
    assert outputs["text_output"] == [generated["text_output"]]
    assert outputs["generated_tokens"] == [generated["generated_tokens"]]
    assert outputs["finish_reason"] == [generated["finish_reason"]]
    assert status == 200 and again == generated


async def test_the_answer_says_why_it_ended_and_counts_tokens(pair: Pair) -> None:
    sidecar = pair.sidecar
    prompt = "a red house by the river"
    async with aiohttp.ClientSession() as http:
        _, default = await post(http, sidecar, request(prompt))
        _, short = await post(http, sidecar, request(prompt, max_tokens=3))
        stop_word = default["text_output"].split()[4]
        _, stopped = await post(http, sidecar, request(prompt, stop=[stop_word]))
        # The tiny model ends this one with its end-of-sequence token after 5 tokens.
        _, ended = await post(http, sidecar, request("the dog ran far away"))
    # The extension's default limit is 20 tokens.
    assert (default["finish_reason"], default["generated_tokens"]) == ("length", 20)
    assert (short["finish_reason"], short["generated_tokens"]) == ("length", 3)
    assert short["prompt_tokens"] == default["prompt_tokens"] == 6
    assert stopped["finish_reason"] == "stop_sequence"
    assert stopped["text_output"] == default["text_output"].split(stop_word)[0]
    assert (ended["finish_reason"], ended["generated_tokens"]) == ("eos_token", 5)
    for answer in (default, short, stopped, ended):
        validator(sidecar, 200).validate(answer)


async def test_the_old_max_new_tokens_still_works_with_a_deprecation_warning(pair: Pair) -> None:
    url = pair.sidecar.url + GENERATE
    async with aiohttp.ClientSession() as http:
        old = request("the sky", max_new_tokens=4)
        async with http.post(url, data=orjson.dumps(old)) as reply:
            assert reply.status == 200
            answer = orjson.loads(await reply.read())
            warning = reply.headers["Warning"]
        async with http.post(url, data=orjson.dumps(request("the sky", max_tokens=4))) as reply:
            assert "Warning" not in reply.headers
            assert orjson.loads(await reply.read())["text_output"] == answer["text_output"]
        both = request("the sky", max_tokens=4, max_new_tokens=4)
        async with http.post(url, data=orjson.dumps(both)) as reply:
            assert reply.status == 400
    assert answer["generated_tokens"] == 4
    assert warning.startswith("299 carpool") and "'max_tokens'" in warning


@pytest.mark.parametrize(
    "body",
    [
        request("the sky", max_tokens=0),
        request("the sky", max_tokens="many"),
        request("the sky", temperature=-1),
        request("the sky", stop=5),
        request("the sky", priority=1.5),
        request("the " * 250, max_tokens=10),  # past the model's context of 256 tokens
        {"parameters": {"max_new_tokens": 3}},
        {"text_input": ["not", "a", "string"]},
        [1, 2],
    ],
)
async def test_bad_requests_get_400(pair: Pair, body: object) -> None:
    before = metric(pair.sidecar, "carpool_requests_total", code="400")
    async with aiohttp.ClientSession() as http:
        status, answer = await post(http, pair.sidecar, body)
    assert status == 400, answer
    validator(pair.sidecar, 400).validate(answer)
    assert metric(pair.sidecar, "carpool_requests_total", code="400") == before + 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"text_input": "the \xff sky"}',
        b'{"text_input": "the sky", "parameters": {"stop": ["\xff"]}}',
        b'{"text_input": "the sky", "parameters": {"seed": "\xff"}}',
    ],
)
async def test_text_that_is_not_utf8_gets_400(pair: Pair, body: bytes) -> None:
    async with aiohttp.ClientSession() as http:
        for path in (GENERATE, GENERATE + "_stream"):
            async with http.post(pair.sidecar.url + path, data=body) as reply:
                assert reply.status == 400, await reply.read()
                assert "UTF-8" in orjson.loads(await reply.read())["error"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (request("the " * 5000), "max_element_bytes"),  # 20 kB: 16 bytes per token of context
        # Named as the caller named them, not as the model's inputs.
        (request("the sky", max_tokens=100_000), "parameter 'max_tokens': value 100000 is outside"),
        (request("the sky", max_tokens=2**40), "parameter 'max_tokens': values out of range"),
        (request("the sky", temperature=1e9), "outside the model's range [0, 100]"),
        (request("the sky", seed=2**40), "parameter 'seed': values out of range"),
        (request("the sky", stop=["sun"] * 17), "max_elements"),
        (request("the sky", stop=["s" * 257]), "max_element_bytes"),
    ],
)
async def test_settings_past_the_models_bounds_get_400_before_queueing(
    pair: Pair, body: object, words: str
) -> None:
    before = batches(pair.sidecar)
    async with aiohttp.ClientSession() as http:
        status, answer = await post(http, pair.sidecar, body)
    assert status == 400 and words in answer["error"], answer
    assert batches(pair.sidecar) == before  # the model server never saw it


async def test_settings_beside_the_text_are_taken_as_among_the_parameters(pair: Pair) -> None:
    """The extension passes a request's other keys to the model's inputs of their names, as
    clients of Triton's TensorRT-LLM models send `max_tokens`."""
    among = request("the sky", max_tokens=3, stop=["sun"])
    beside = {"text_input": "the sky", "max_tokens": 3, "stop": ["sun"]}
    async with aiohttp.ClientSession() as http:
        (status, expected), (beside_status, answer) = await asyncio.gather(
            post(http, pair.sidecar, among), post(http, pair.sidecar, beside)
        )
        twice = await post(http, pair.sidecar, {**among, "max_tokens": 3})
    assert status == beside_status == 200, answer
    assert answer == expected and answer["generated_tokens"] == 3
    assert twice[0] == 400 and "'max_tokens' once" in twice[1]["error"]


async def test_the_answer_returns_the_requests_id(pair: Pair) -> None:
    """As the extension requires of a request that gives one, in every streamed event too."""
    body = {"id": "42", **request("the sky", max_tokens=3)}
    async with aiohttp.ClientSession() as http:
        status, answer = await post(http, pair.sidecar, body)
        _, plain = await post(http, pair.sidecar, request("the sky", max_tokens=3))
        async with http.post(pair.sidecar.url + GENERATE + "_stream", json=body) as reply:
            events = [
                orjson.loads(line[len(b"data: ") :])
                async for line in reply.content
                if line.startswith(b"data: ")
            ]
    assert status == 200 and answer["id"] == "42", answer
    validator(pair.sidecar, 200).validate(answer)
    assert "id" not in plain
    assert events and all(event["id"] == "42" for event in events)


async def test_a_setting_given_as_null_is_as_if_not_given(pair: Pair) -> None:
    nulls = request("the sky", max_tokens=4, temperature=None, stop=None, seed=None)
    async with aiohttp.ClientSession() as http:
        plain = await post(http, pair.sidecar, request("the sky", max_tokens=4))
        given = await post(http, pair.sidecar, nulls)
    assert plain[0] == given[0] == 200, (plain, given)
    assert given[1]["text_output"] == plain[1]["text_output"]


async def test_a_tiny_temperature_is_answered_as_greedy(pair: Pair) -> None:
    async with aiohttp.ClientSession() as http:
        greedy = await post(http, pair.sidecar, request("the sky", max_tokens=8))
        tiny = await post(http, pair.sidecar, request("the sky", max_tokens=8, temperature=1e-38))
    assert greedy[0] == tiny[0] == 200, (greedy, tiny)
    assert tiny[1]["text_output"] == greedy[1]["text_output"]


async def test_the_deadline_counts_as_for_infer(pair: Pair) -> None:
    async with aiohttp.ClientSession() as http:
        # The batch waits WAIT_MS to fill: a shorter deadline passes first.
        status, answer = await post(
            http, pair.sidecar, request("the sky", timeout=WAIT_MS / 3 * 1000)
        )
        assert status == 504, answer
        headers = {"X-Carpool-Timeout-Ms": str(WAIT_MS / 3)}
        status, answer = await post(http, pair.sidecar, request("the sky"), headers=headers)
        assert status == 504, answer
        status, answer = await post(http, pair.sidecar, request("the sky", timeout=30e6))
        assert status == 200, answer


async def test_a_model_that_does_not_generate_text_gets_400(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy") as toy:
        async with aiohttp.ClientSession() as http:
            url = "/v2/models/toy/generate"
            status, answer = await post(http, toy.sidecar, request("the sky"), path=url)
    assert status == 400
    assert "text_input" in answer["error"] and "/infer" in answer["error"]


def test_carpool_serve_answers_generate_as_documented(pair: Pair, tiny_lm_path: Path) -> None:
    port = free_port()
    command = processes.carpool_command("serve", "--handler", "text-generation")
    command += ["--model-path", str(tiny_lm_path), "--device", "cpu", "--torch-threads", "1"]
    command += ["--port", str(port), "--grpc-port", str(free_port())]
    body = orjson.dumps(request("the cat sat", max_tokens=16, stop=["\n"]))
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "ready at" in line:
                break
        url = f"http://127.0.0.1:{port}/v2/models/text-generation/generate"
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as reply:
            served = orjson.loads(reply.read())
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    alone = urllib.request.Request(pair.sidecar.url + GENERATE, data=body)
    with urllib.request.urlopen(alone, timeout=30) as reply:
        expected = orjson.loads(reply.read())
    assert served == {**expected, "model_name": "text-generation"}


async def test_a_model_that_does_not_stream_tokens_streams_one_piece(pair: Pair) -> None:
    body = orjson.dumps(request("a red house by the river", max_tokens=6))
    url = pair.sidecar.url + f"/v2/models/{MODEL}/generate_stream"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"] == "text/event-stream"
            events = (await reply.read()).split(b"\n\n")
        _, whole = await post(http, pair.sidecar, orjson.loads(body))
    assert events[1:] == [b""]
    (event,) = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:1]]
    assert event == {**whole, "done": True}


async def test_a_seed_gives_a_sampled_answer_again(pair: Pair) -> None:
    sampled = request("the moon", max_tokens=20, temperature=2.0, seed=7)
    async with aiohttp.ClientSession() as http:
        answers = await asyncio.gather(*(post(http, pair.sidecar, sampled) for _ in range(3)))
        other = await post(http, pair.sidecar, {**sampled, "parameters": {"seed": 8}})
        _, refused = await post(http, pair.sidecar, request("the moon", seed=-1))
    assert [status for status, _ in answers] == [200] * 3
    assert len({answer["text_output"] for _, answer in answers}) == 1
    assert other[0] == 200 and "'seed'" in refused["error"]
