"""The data plane in-process: a real Batcher, with a stand-in for the model server's answers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.contract.wire import BYTES, Item, ItemResult, Tensor
from carpool.engine.batcher import Batcher
from carpool.engine.errors import (
    MAX_MESSAGE_BYTES,
    BadModelResponse,
    BadRequest,
    ModelError,
    PayloadTooLarge,
    Unavailable,
)
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.settings import BatchingSettings
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.generation import GenerateRequest, GenerateResponse
from carpool_sidecar.health import ModelState
from carpool_sidecar.inference import InferRequest, InferResponse, RequestedOutput
from carpool_sidecar.tensors import RequestTensor

Answer = Callable[[Sequence[Item]], list[ItemResult]]


def echo(items: Sequence[Item]) -> list[ItemResult]:
    return [ItemResult(outputs={"y": item["x"]}) for item in items]


NUMBERS = (TensorSpec("x", "FP32", (-1,)),)


def metadata(
    pads: bool, output_shape: tuple[int, ...] = (-1,), inputs: tuple[TensorSpec, ...] = NUMBERS
) -> ModelMetadata:
    return ModelMetadata(
        name="m",
        platform="test",
        inputs=inputs,
        outputs=(TensorSpec("y", "FP32", output_shape),),
        max_batch_size=8,
        pads_variable_dims=pads,
    )


class Model:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.batches: list[list[tuple[int, ...]]] = []

    async def send(self, items: Sequence[Item], timeout_s: float) -> tuple[list[ItemResult], None]:
        self.batches.append([next(iter(item.values())).shape for item in items])
        return self.answer(items), None


@asynccontextmanager
async def dataplane(
    answer: Answer = echo,
    pads: bool = False,
    answers: AnswerBudget | None = None,
    output_shape: tuple[int, ...] = (-1,),
    inputs: tuple[TensorSpec, ...] = NUMBERS,
) -> AsyncIterator[tuple[DataPlane, Model]]:
    model = Model(answer)
    settings = BatchingSettings(dispatch="fixed", max_wait_ms=50)
    batcher = Batcher(settings, model, SidecarMetrics(CollectorRegistry(), "m"))
    state = ModelState()
    state.ready, state.metadata = True, metadata(pads, output_shape, inputs)
    answers = answers or AnswerBudget(2**30, 2**30)
    runner = asyncio.create_task(batcher.run())
    try:
        yield DataPlane("m", batcher, state, answers), model
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


def request(*rows: list[float]) -> InferRequest:
    data = np.array(rows, dtype=np.float32)
    return InferRequest(inputs=[RequestTensor("x", "FP32", data.shape, data.ravel())])


async def infer_all(plane: DataPlane, *requests: InferRequest) -> list[object]:
    now = asyncio.get_running_loop().time()
    calls = [plane.infer(each, None, now, 2**30) for each in requests]
    return await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.parametrize(("pads", "batches"), [(False, 2), (True, 1)])
async def test_numeric_items_of_other_shapes_share_a_batch_only_if_padded(
    pads: bool, batches: int
) -> None:
    async with dataplane(pads=pads) as (plane, model):
        outcomes = await infer_all(plane, request([1, 2]), request([1, 2, 3]), request([4, 5]))
    assert not any(isinstance(outcome, Exception) for outcome in outcomes), outcomes
    assert len(model.batches) == batches
    if not pads:
        assert sorted(model.batches) == [[(2,), (2,)], [(3,)]]


@pytest.mark.parametrize("datatype", [BYTES, "FP32"])
@pytest.mark.parametrize(("by_length", "batches"), [(True, 2), (False, 1)])
async def test_items_of_any_length_share_a_batch_unless_their_input_goes_by_length(
    datatype: str, by_length: bool, batches: int
) -> None:
    def scored(items: Sequence[Item]) -> list[ItemResult]:
        return [ItemResult(outputs={"y": Tensor.from_numpy(np.ones(1, np.float32))})] * len(items)

    def item(size: int) -> InferRequest:
        if datatype == BYTES:  # one file of `size` bytes
            return InferRequest(inputs=[RequestTensor("x", BYTES, (1, 1), [b"x" * size])])
        return request([0.5] * size)

    shape = (1,) if datatype == BYTES else (-1,)
    spec = TensorSpec("x", datatype, shape, batch_by_length=by_length)
    async with dataplane(scored, pads=True, inputs=(spec,)) as (plane, model):
        outcomes = await infer_all(plane, *map(item, (10, 1000, 12)))
    assert not any(isinstance(outcome, Exception) for outcome in outcomes), outcomes
    assert len(model.batches) == batches


@pytest.mark.parametrize(("status", "seen"), [(404, 404), (503, 503), (200, 502), (302, 502)])
async def test_item_error_status_is_an_error_status(status: int, seen: int) -> None:
    def failing(items: Sequence[Item]) -> list[ItemResult]:
        return [ItemResult.failed("refused", status) for _ in items]

    async with dataplane(failing) as (plane, _):
        [outcome] = await infer_all(plane, request([1.0]))
    assert isinstance(outcome, ModelError) and outcome.status == seen


async def test_a_models_long_message_reaches_its_callers_cut_short() -> None:
    """Every caller of a batch gets the model's message for its item: 10 MB each would be
    answered whole, to each of them."""
    message = "é" * 5_000_000

    def verbose(items: Sequence[Item]) -> list[ItemResult]:
        return [ItemResult.failed(message, 400) for _ in items]

    async with dataplane(verbose) as (plane, _):
        outcomes = await infer_all(plane, request([1.0]), request([2.0]))
    for outcome in outcomes:
        assert isinstance(outcome, ModelError) and outcome.status == 400
        assert outcome.message.startswith("éé") and "10000000 bytes in all" in outcome.message
        assert len(outcome.message.encode()) <= MAX_MESSAGE_BYTES + 64


async def test_outputs_that_differ_between_items_are_a_bad_model_response() -> None:
    def ragged(items: Sequence[Item]) -> list[ItemResult]:
        sizes = range(1, len(items) + 1)
        return [
            ItemResult(outputs={"y": Tensor.from_numpy(np.zeros(size, np.float32))})
            for size in sizes
        ]

    async with dataplane(ragged) as (plane, _):
        [outcome] = await infer_all(plane, request([1.0], [2.0]))
    assert isinstance(outcome, BadModelResponse) and outcome.status == 502


async def test_an_output_requested_twice_is_refused_before_the_model_runs() -> None:
    """Each copy would be answered, a copy each: a 0.4 MB request asked for 564 MB."""
    twice = dataclasses.replace(request([1.0, 2.0]), outputs=[RequestedOutput("y", None)] * 2)
    async with dataplane() as (plane, model):
        [outcome] = await infer_all(plane, twice)
    assert isinstance(outcome, BadRequest) and "'y' already requested" in outcome.message
    assert model.batches == []


@pytest.mark.parametrize(("output_shape", "runs"), [((2,), False), ((-1,), True)])
async def test_an_answer_over_the_limit_is_refused_before_it_is_built(
    output_shape: tuple[int, ...], runs: bool
) -> None:
    """8 items of 2 FP32 take up to 256 bytes of JSON, over a limit of 100: a fixed output
    shape tells so before the model runs, a variable one once the results are in."""
    budget = AnswerBudget(100, 2**30)
    async with dataplane(answers=budget, output_shape=output_shape) as (plane, model):
        [outcome] = await infer_all(plane, request(*[[1.0, 2.0]] * 8))
    assert isinstance(outcome, PayloadTooLarge), outcome
    assert "up to 256 bytes, more than the limit of 100" in outcome.message
    assert bool(model.batches) == runs
    assert budget.unsent == 0


async def test_the_id_an_answer_echoes_counts_in_its_size() -> None:
    """An id of 1,000 characters makes the answer 1 kB longer: within a limit of 500 only
    without it."""
    budget = AnswerBudget(500, 2**30)
    async with dataplane(answers=budget, output_shape=(2,)) as (plane, model):
        [plain] = await infer_all(plane, request([1.0, 2.0]))
        long_id = dataclasses.replace(request([1.0, 2.0]), id="x" * 1000)
        [outcome] = await infer_all(plane, long_id)
    assert isinstance(plain, InferResponse)
    assert isinstance(outcome, PayloadTooLarge), outcome
    assert len(model.batches) == 1  # refused before the model ran


async def test_generated_text_is_an_answer_held_and_bounded_like_any() -> None:
    """A model server may answer a 1 MB text: over the answer limit it is refused; within
    it, it holds its room until the front has sent it."""
    text = b"x" * (1 << 20)

    def talkative(items: Sequence[Item]) -> list[ItemResult]:
        return [ItemResult(outputs={"text_output": Tensor(BYTES, (1,), [text])}) for _ in items]

    generates = dataclasses.replace(
        metadata(False),
        inputs=(TensorSpec("text_input", BYTES, (1,)),),
        outputs=(TensorSpec("text_output", BYTES, (1,)),),
    )
    now = asyncio.get_running_loop().time()
    for limit in (1 << 20, 1 << 23):
        budget = AnswerBudget(1 << 30, 1 << 30)
        async with dataplane(talkative, answers=budget) as (plane, _):
            plane.state.metadata = generates
            call = plane.generate(GenerateRequest("hi"), None, now, limit)
            outcome = (await asyncio.gather(call, return_exceptions=True))[0]
        if limit == 1 << 20:
            assert isinstance(outcome, PayloadTooLarge) and budget.unsent == 0, outcome
        else:
            assert isinstance(outcome, GenerateResponse) and outcome.held is not None
            assert budget.unsent >= len(text)
            outcome.held.release()
            assert budget.unsent == 0


async def test_answers_not_yet_sent_hold_a_bounded_budget() -> None:
    budget = AnswerBudget(2**20, 40)  # one answer of 2 FP32 as JSON: up to 32 bytes
    async with dataplane(answers=budget) as (plane, _):
        [first] = await infer_all(plane, request([1.0, 2.0]))
        [second] = await infer_all(plane, request([1.0, 2.0]))
        assert isinstance(first, InferResponse) and first.held is not None
        assert isinstance(second, Unavailable) and second.headers == {"Retry-After": "1"}
        first.held.release()
        [third] = await infer_all(plane, request([1.0, 2.0]))
    assert isinstance(third, InferResponse) and budget.unsent == 32
