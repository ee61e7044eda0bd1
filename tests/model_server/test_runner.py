"""The worker in process: isolation cost, chunking, metrics at zero before any batch."""

from __future__ import annotations

import math

import numpy as np
import torch

from carpool.model_server.handler import HandlerSettings
from carpool.model_server.handler_toy import ToyHandler
from carpool.model_server.metrics import ModelMetrics
from carpool.model_server.runner import Runner
from carpool.model_server.wire import Tensor


class CountingToy(ToyHandler):
    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.batch_sizes: list[int] = []

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(len(batch))
        return super().infer(batch)


def make_runner(max_batch_size: int = 64) -> tuple[Runner, CountingToy]:
    handler = CountingToy(HandlerSettings(None, torch.float32, max_batch_size))
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), max_batch_size)
    return runner, handler


def item(value: float) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.full(4, value, dtype=np.float32))}


async def test_one_poison_item_costs_about_two_log2_n_passes() -> None:
    runner, handler = make_runner()
    await runner.load(1, [])
    items = [item(i) for i in range(64)]
    items[37] = item(float("nan"))
    try:
        results = await runner.run(items)
    finally:
        runner.close()
    assert [r.status for r in results] == [500 if i == 37 else 200 for i in range(64)]
    assert len(handler.batch_sizes) <= 1 + 2 * math.log2(64)
    assert handler.batch_sizes[0] == 64


async def test_requests_above_the_max_run_as_several_batches() -> None:
    runner, handler = make_runner(max_batch_size=4)
    await runner.load(1, [1, 4])
    handler.batch_sizes.clear()  # forget warm-up
    try:
        results = await runner.run([item(i) for i in range(10)])
    finally:
        runner.close()
    assert handler.batch_sizes == [4, 4, 2]
    assert [r.outputs["output"].to_numpy()[0] for r in results if r.outputs] == [
        2 * i + 1 for i in range(10)
    ]
    registry = runner.metrics.registry
    assert registry.get_sample_value("carpool_model_batch_size_count", {"model": "toy"}) == 3


def test_metrics_exist_at_zero_before_any_batch() -> None:
    registry = ModelMetrics.create("m").registry
    for kind in ("invalid_item", "infer"):
        labels = {"model": "m", "kind": kind}
        assert registry.get_sample_value("carpool_model_errors_total", labels) == 0
    assert registry.get_sample_value("carpool_model_items_total", {"model": "m"}) == 0
    assert registry.get_sample_value("carpool_model_batch_size_count", {"model": "m"}) == 0
