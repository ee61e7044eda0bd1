"""The pipelined worker in process: the next batch is preprocessed while one runs, results
keep their order, a failing item stays alone and a poisoned device still stops everything."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from carpool.contract.wire import Item, Tensor
from carpool_model_server.errors import DeviceFailed
from carpool_model_server.handler import HandlerSettings, Prepared
from carpool_model_server.handler_toy import ToyHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner

FORWARD_S = 0.05


class PipelinedToy(ToyHandler):
    preprocess_overlaps_infer = True


class SlowToy(PipelinedToy):
    """The toy model with a forward pass of FORWARD_S; it logs when each step of each batch
    (named by its first value) begins and ends."""

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.events: list[tuple[str, float]] = []
        self.threads: set[str] = set()

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        self.threads.add(threading.current_thread().name)
        prepared = super().preprocess(items)
        if prepared.batch is not None:
            self.events.append((f"prepared {prepared.batch[0, 0].item():g}", time.monotonic()))
        return prepared

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        first = f"{batch[0, 0].item():g}"
        self.events.append((f"infer {first}", time.monotonic()))
        time.sleep(FORWARD_S)
        self.events.append((f"inferred {first}", time.monotonic()))
        return super().infer(batch)


def item(value: float) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.full(4, value, dtype=np.float32))}


def outputs(results: Sequence[object]) -> list[float | None]:
    values: list[float | None] = []
    for result in results:
        found = getattr(result, "outputs", None)
        values.append(None if found is None else float(found["output"].to_numpy()[0]))
    return values


def make(handler_class: type[ToyHandler], pipeline: bool = True) -> tuple[Runner, ToyHandler]:
    handler = handler_class(HandlerSettings(None, torch.float32, 16))
    return Runner(
        handler, torch.device("cpu"), ModelMetrics.create("toy"), 16, None, pipeline
    ), handler


class SlowToyOfSharedState(SlowToy):
    preprocess_overlaps_infer = False


@pytest.mark.parametrize(
    ("handler_class", "flag", "pipeline"),
    [(SlowToy, True, True), (SlowToy, False, False), (SlowToyOfSharedState, True, False)],
    ids=["pipelined", "turned-off", "not-allowed-by-the-handler"],
)
async def test_the_next_batch_is_preprocessed_while_one_runs(
    handler_class: type[SlowToy], flag: bool, pipeline: bool
) -> None:
    runner, handler = make(handler_class, flag)
    assert isinstance(handler, SlowToy)
    await runner.load(1, [])
    try:
        batches = [[item(10 * b + i) for i in range(3)] for b in range(4)]
        results = await asyncio.gather(*(runner.run(batch) for batch in batches))
    finally:
        runner.close()
    for b, answer in enumerate(results):
        assert outputs(answer) == [2 * (10 * b + i) + 1 for i in range(3)]
    at = dict(handler.events)
    # Batch 10 is ready before batch 0's forward pass ends only when preprocess runs ahead.
    assert (at["prepared 10"] < at["inferred 0"]) is pipeline
    assert ("carpool-prep_0" in handler.threads) is pipeline


class BrokenPreprocess(PipelinedToy):
    """A preprocess bug (not a refusal) on an item holding 13."""

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        if any(float(i["input"].to_numpy()[0]) == 13 for i in items):
            raise ValueError("preprocess cannot handle 13")
        return super().preprocess(items)


async def test_an_item_that_breaks_preprocess_fails_alone() -> None:
    runner, _ = make(BrokenPreprocess)
    await runner.load(1, [])
    try:
        results = await runner.run([item(v) for v in (1, 13, 2, 3)])
    finally:
        runner.close()
    assert [r.status for r in results] == [200, 500, 200, 200]
    assert outputs(results) == [3, None, 5, 7]
    assert "preprocess cannot handle 13" in (results[1].error or "")


class PoisonedPreprocess(PipelinedToy):
    """A copy to the device that trips a device-side assert, as on a poisoned CUDA context."""

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        if any(np.isnan(i["input"].to_numpy()).any() for i in items):
            raise torch.AcceleratorError("CUDA error: device-side assert triggered")
        return super().preprocess(items)


async def test_a_fatal_error_in_preprocess_stops_every_batch() -> None:
    runner, _ = make(PoisonedPreprocess)
    await runner.load(1, [])
    try:
        with pytest.raises(DeviceFailed, match="device-side assert"):
            await runner.run([item(1), item(float("nan"))])
        assert runner.failure is not None
        with pytest.raises(DeviceFailed, match="restart"):
            await runner.run([item(1)])
    finally:
        runner.close()
