"""The per-batch helpers of the handler API, and the built-in handlers that use them: each
item gets the verdict and the answer it would get alone, whatever its neighbours."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from carpool.contract.metadata import TensorSpec
from carpool.contract.wire import BYTES, Item, ItemResult, Tensor
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import (
    AnyHandler,
    HandlerSettings,
    output_rows,
    require_input,
    require_inputs,
)
from carpool_model_server.handler_stand_in import StandInHandler
from carpool_model_server.handler_toy import ToyHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner


def numbers(values: list[float], dtype: str = "float32", shape: tuple[int, ...] = ()) -> Item:
    array = np.array(values, dtype=dtype)
    return {"input": Tensor.from_numpy(array.reshape(shape) if shape else array)}


def one_by_one(items: list[Item], spec: TensorSpec) -> tuple[dict[int, Tensor], dict[int, str]]:
    tensors: dict[int, Tensor] = {}
    rejected: dict[int, str] = {}
    for index, item in enumerate(items):
        try:
            tensors[index] = require_input(item, spec)
        except InvalidItem as error:
            rejected[index] = str(error)
    return tensors, rejected


MIXED = [
    numbers([1, 2, 3]),
    numbers([1, 2, 3, 4, 5, 6]),  # over max_elements, after an item of 3 passed
    numbers([4, 5, 6]),
    numbers([1, 2, 3], "int32"),
    numbers([1, 2, 3, 4], shape=(2, 2)),
    {"other": Tensor.from_numpy(np.zeros(3, dtype=np.float32))},
    numbers([7, 8]),
    numbers([1, 2, 3, 4, 5, 6]),
]


@pytest.mark.parametrize(
    "spec",
    [
        TensorSpec("input", "FP32", (-1,), max_elements=4),
        TensorSpec("input", "FP32", (-1,), max_elements=4, minimum=0, maximum=5),
        TensorSpec("input", "FP32", (3,)),
    ],
)
def test_require_inputs_gives_every_item_the_verdict_it_gets_alone(spec: TensorSpec) -> None:
    assert require_inputs(MIXED, spec) == one_by_one(MIXED, spec)


def test_require_inputs_reads_each_text_for_its_byte_limit() -> None:
    spec = TensorSpec("text", BYTES, (1,), max_element_bytes=3)
    items: list[Item] = [{"text": Tensor(BYTES, (1,), [text])} for text in (b"ab", b"abcd", b"c")]
    tensors, rejected = require_inputs(items, spec)
    assert list(tensors) == [0, 2]
    assert list(rejected) == [1]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool"])
def test_output_rows_answer_each_item_its_own_row(dtype: str) -> None:
    rows = (np.arange(12).reshape(3, 2, 2) % 3).astype(dtype)
    answers = output_rows("y", rows)
    assert [answer["y"] for answer in answers] == [Tensor.from_numpy(row) for row in rows]


def test_output_rows_cut_items_of_their_own_shapes_from_one_array() -> None:
    answers = output_rows("y", np.arange(6, dtype=np.float32), [(2,), (0,), (1, 3)])
    assert [answer["y"].to_numpy().tolist() for answer in answers] == [[0, 1], [], [[2, 3, 4]]]


def test_output_rows_answer_items_without_elements_and_batches_without_items() -> None:
    assert [a["y"].shape for a in output_rows("y", np.zeros((2, 0), np.float32))] == [(0,), (0,)]
    assert output_rows("y", np.zeros((0, 4), np.float32)) == []


async def run(handler: AnyHandler, items: list[Item]) -> list[ItemResult]:
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("m"), 64, pipeline=False)
    await runner.load(1, [])
    try:
        return await runner.run(items)
    finally:
        runner.close()


async def test_the_stand_in_answers_items_of_any_length_beside_refused_ones() -> None:
    handler = StandInHandler(HandlerSettings(None, torch.float32, 64))
    items = [
        numbers([1, 2, 3]),
        numbers([np.inf, 1]),
        numbers([5]),
        numbers([1, 2], "float64"),
        numbers([np.nan]),
        numbers([0.5, 1.5, 2.5, 3.5, 4.5]),
    ]
    results = await run(handler, items)
    assert [result.status for result in results] == [200, 400, 200, 400, 400, 200]
    assert results[1].error == "input 'input' must be finite"
    answered = [r.outputs["output"].to_numpy().tolist() for r in results if r.outputs]
    assert answered == [[3, 5, 7], [11], [2, 4, 6, 8, 10]]


async def test_the_toy_refuses_infinite_rows_and_isolates_a_poison_one() -> None:
    handler = ToyHandler(HandlerSettings(None, torch.float32, 64))
    items = [numbers([1, 1, 1, 1]), numbers([np.inf, 0, 0, 0]), numbers([np.nan, 0, 0, 0])]
    items += [numbers([2, 2, 2, 2]), numbers([1, 2]), numbers([-np.inf, 1, 1, 1])]
    results = await run(handler, items)
    assert [result.status for result in results] == [200, 400, 500, 200, 400, 400]
    assert results[1].error == "input 'input' must be finite, got [inf, 0.0, 0.0, 0.0]"
    assert results[5].error == "input 'input' must be finite, got [-inf, 1.0, 1.0, 1.0]"
    answered = [r.outputs["output"].to_numpy().tolist() for r in results if r.outputs]
    assert answered == [[3] * 4, [5] * 4]
