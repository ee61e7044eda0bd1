"""`ModelStreamInfer` with tritonclient's own stream API, against a sidecar in front of a
model server that batches generation token by token (the tiny GPT-2)."""

from __future__ import annotations

import queue
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
from library.test_generate_stream import model_metric, wait_cancelled
from library.tiny_lm import build_tiny_lm
from support.sidecar import Pair, metric, run_pair

tritongrpc = pytest.importorskip("tritonclient.grpc")

MODEL = "gen"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("stream-infer")
    model = build_tiny_lm(folder / "lm")
    model_args = ["--model-path", str(model), "--device", "cpu", "--warmup-sizes", "1"]
    model_args += ["--handler-options", "batching=continuous"]
    with run_pair(folder, "text-generation", model_args=model_args, model=MODEL) as running:
        yield running


def prompt_inputs(prompt: str, max_tokens: int) -> list[Any]:
    text = tritongrpc.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    limit = tritongrpc.InferInput("max_new_tokens", [1, 1], "INT32")
    limit.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    temperature = tritongrpc.InferInput("temperature", [1, 1], "FP32")
    temperature.set_data_from_numpy(np.array([[0.0]], dtype=np.float32))
    stop = tritongrpc.InferInput("stop", [1, 1], "BYTES")
    stop.set_data_from_numpy(np.array([[b""]], dtype=object))
    return [text, limit, temperature, stop]


def generated(pair: Pair, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = orjson.dumps({"text_input": prompt, "parameters": {"max_tokens": max_tokens}})
    url = f"{pair.sidecar.url}/v2/models/{MODEL}/generate"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as reply:
        answer: dict[str, Any] = orjson.loads(reply.read())
    return answer


def test_a_stream_answers_each_request_piece_by_piece(pair: Pair) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tritongrpc.InferenceServerClient(pair.sidecar.grpc)
    prompts = [("a red house by the river", 12), ("the sky", 4)]
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index, (prompt, max_tokens) in enumerate(prompts):
            client.async_stream_infer(
                MODEL, prompt_inputs(prompt, max_tokens), request_id=str(index)
            )
        client.async_stream_infer("nope", prompt_inputs("the sky", 4), request_id="unknown")
        texts: dict[str, list[str]] = {}
        finals: dict[str, Any] = {}
        errors = []
        while len(finals) + len(errors) < len(prompts) + 1:
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(str(error))
                continue
            response = result.get_response()
            piece = result.as_numpy("text_output")[0][0].decode()
            texts.setdefault(response.id, []).append(piece)
            if response.parameters["triton_final_response"].bool_param:
                finals[response.id] = result
    finally:
        client.stop_stream()
        client.close()
    for index, (prompt, max_tokens) in enumerate(prompts):
        whole = generated(pair, prompt, max_tokens)
        assert "".join(texts[str(index)]) == whole["text_output"]
        final = finals[str(index)]
        assert final.as_numpy("finish_reason")[0][0].decode() == whole["finish_reason"]
        assert final.as_numpy("generated_tokens")[0][0] == whole["generated_tokens"]
    assert len(texts["0"]) > 1  # answered in pieces, not whole
    (error,) = errors
    assert "unknown model 'nope'" in error
    assert metric(pair.sidecar, "carpool_requests_total", protocol="grpc", code="200") >= 2
    assert metric(pair.sidecar, "carpool_requests_total", protocol="grpc", code="404") == 1


def test_ordinary_infer_still_answers_whole(pair: Pair) -> None:
    client = tritongrpc.InferenceServerClient(pair.sidecar.grpc)
    try:
        result = client.infer(MODEL, prompt_inputs("a red house by the river", 6))
    finally:
        client.close()
    whole = generated(pair, "a red house by the river", 6)
    assert result.as_numpy("text_output")[0][0].decode() == whole["text_output"]


def test_the_requests_of_one_stream_are_answered_beside_one_another(pair: Pair) -> None:
    """A short request sent after a long one on the same stream is not held behind it (as
    Triton answers a decoupled model's requests): its last response comes first."""
    finals: queue.Queue[str] = queue.Queue()

    def heard(result: Any, error: Any) -> None:
        assert error is None, error
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals.put(response.id)

    client = tritongrpc.InferenceServerClient(pair.sidecar.grpc)
    try:
        client.start_stream(callback=heard)
        client.async_stream_infer(MODEL, prompt_inputs("a long walk", 200), request_id="long")
        client.async_stream_infer(MODEL, prompt_inputs("the sky", 2), request_id="short")
        order = [finals.get(timeout=60), finals.get(timeout=60)]
    finally:
        client.stop_stream()
        client.close()
    assert order == ["short", "long"]


def test_a_client_that_cancels_its_stream_ends_every_sequence_of_it(pair: Pair) -> None:
    server = pair.model_server
    cancelled = model_metric(server, "carpool_model_streams_total", outcome="cancelled")
    heard: queue.Queue[str] = queue.Queue()
    client = tritongrpc.InferenceServerClient(pair.sidecar.grpc)
    try:
        # The stream's cancellation comes to the callback as an error, with no result.
        client.start_stream(
            callback=lambda result, error: error or heard.put(result.get_response().id)
        )
        for name in ("first", "second"):
            client.async_stream_infer(MODEL, prompt_inputs(f"a {name} walk", 240), request_id=name)
        answered: set[str] = set()
        while answered != {"first", "second"}:  # until both have answered a piece
            answered.add(heard.get(timeout=30))
        assert model_metric(server, "carpool_model_running_sequences") == 2
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    wait_cancelled(server, cancelled, 2)


async def test_a_message_that_is_no_request_ends_the_stream_as_invalid(pair: Pair) -> None:
    """(Before, the stream ended UNKNOWN, "unhandled errors in a TaskGroup".)"""
    async with grpc.aio.insecure_channel(pair.sidecar.grpc) as channel:
        method = "/inference.GRPCInferenceService/ModelStreamInfer"
        call = channel.stream_stream(method)()  # bytes as they are, not a message
        await call.write(b"\xff\xff\xff\xff")
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in call:
                pass
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a ModelInferRequest" in (ended.value.details() or "")
