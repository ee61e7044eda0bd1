"""`ModelStreamInfer`'s answers in process (the data plane with a stand-in model), to a
client that reads its stream's responses when it pleases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry
from sidecar.test_dataplane import dataplane

from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest, ModelStreamInferResponse
from carpool.engine.errors import BadRequest
from carpool.engine.metrics import SidecarMetrics
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.grpc import streaming

VALUES = 1000
# Room for four answers of VALUES FP32 outputs (4,003 bytes each, the id's included).
ROOM = 4 * 4 * VALUES + VALUES


def numbers(request_id: str) -> ModelInferRequest:
    message = ModelInferRequest(model_name="m", id=request_id)
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, VALUES])
    tensor.contents.fp32_contents.extend([0.5] * VALUES)
    return message


async def wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 5 s")


async def sent(count: int) -> AsyncIterator[ModelInferRequest]:
    for index in range(count):
        yield numbers(str(index))


async def test_answers_a_client_has_not_read_hold_the_answer_budget() -> None:
    """Ten requests on a stream whose client reads nothing after the first response: the
    answers waiting for it count as unsent, and past `max_unsent_bytes` the next ones are
    refused, as on every other path. (Before, each was dropped from the budget as soon as it
    was queued for the stream: all ten were held, the budget read 0.)"""
    budget = AnswerBudget(2**30, ROOM)
    async with dataplane(answers=budget) as (plane, model):
        metrics = SidecarMetrics(CollectorRegistry(), "m")
        responses = streaming.answer(sent(10), plane, metrics, "grpc", 2**30, asyncio.Event())
        first = await anext(responses)
        # Every request answered by the model, and four answers held for the client.
        await wait_until(lambda: sum(map(len, model.batches)) == 10)
        await wait_until(lambda: budget.unsent > ROOM - 4 * VALUES)
        rest: list[ModelStreamInferResponse] = [response async for response in responses]
    refused = [r.error_message for r in [first, *rest] if r.error_message]
    assert len(refused) == 6, refused
    assert all("bytes of answers are waiting to be sent" in error for error in refused)
    assert budget.unsent == 0


async def test_a_stream_closed_with_answers_unread_frees_their_room() -> None:
    budget = AnswerBudget(2**30, 2**30)
    async with dataplane(answers=budget) as (plane, _):
        metrics = SidecarMetrics(CollectorRegistry(), "m")
        responses = streaming.answer(sent(10), plane, metrics, "grpc", 2**30, asyncio.Event())
        await anext(responses)
        await wait_until(lambda: budget.unsent >= 9 * 4 * VALUES)
        await responses.aclose()  # as grpc.aio ends a cancelled call's handler
        assert budget.unsent == 0


async def test_a_failed_request_is_answered_with_its_id() -> None:
    """Responses of a stream's requests interleave: an error names the request it answers,
    as Triton's does. (Before, its id was empty.)"""
    async with dataplane() as (plane, _):
        metrics = SidecarMetrics(CollectorRegistry(), "m")

        async def requests() -> AsyncIterator[ModelInferRequest]:
            yield numbers("good")
            yield ModelInferRequest(model_name="nope", id="unknown model")
            yield ModelInferRequest(model_name="m", id="no inputs")

        responses = streaming.answer(requests(), plane, metrics, "grpc", 2**30, asyncio.Event())
        answered = {r.infer_response.id: r.error_message async for r in responses}
    assert answered.keys() == {"good", "unknown model", "no inputs"}
    assert answered["good"] == ""
    assert "nope" in answered["unknown model"]
    assert "'inputs' must not be empty" in answered["no inputs"]


async def test_a_stream_whose_requests_cannot_be_read_ends_with_a_bad_request() -> None:
    """A message that is no ModelInferRequest ends the call as a bad request (the servicer
    makes it INVALID_ARGUMENT), once the requests read before it are answered."""
    async with dataplane() as (plane, _):
        metrics = SidecarMetrics(CollectorRegistry(), "m")

        async def requests() -> AsyncIterator[ModelInferRequest]:
            yield numbers("good")
            raise DecodeError("Error parsing message with type 'inference.ModelInferRequest'")

        answered = []
        with pytest.raises(BadRequest, match="a message is not a ModelInferRequest"):
            async for response in streaming.answer(
                requests(), plane, metrics, "grpc", 2**30, asyncio.Event()
            ):
                answered.append(response.infer_response.id)
        assert answered == ["good"]
