"""The worker in process: isolation cost, chunking, metrics at zero before any batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from carpool.contract.wire import Tensor
from carpool_model_server.errors import DeviceFailed
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_toy import ToyHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner
from carpool_model_server.warmup import default_sizes


class CountingToy(ToyHandler):
    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.batch_sizes: list[int] = []
        self.rows: list[list[float]] = []

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(len(batch))
        self.rows.extend(batch.tolist())
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


class FaultyToy(CountingToy):
    """The toy model whose forward pass raises `error` on every batch holding NaN."""

    error: Exception = RuntimeError("unset")

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(len(batch))
        if torch.isnan(batch).any():
            raise self.error
        return batch * 2 + 1


@pytest.mark.parametrize(
    "error",
    [
        torch.AcceleratorError("CUDA error: device-side assert triggered"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
    ],
    ids=["accelerator-error", "runtime-error"],
)
async def test_a_poisoned_device_fails_the_batch_without_bisection_and_every_later_one(
    error: Exception,
) -> None:
    handler = FaultyToy(HandlerSettings(None, torch.float32, 64))
    handler.error = error
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), 64)
    await runner.load(1, [])
    items = [item(i) for i in range(64)]
    items[37] = item(float("nan"))
    try:
        with pytest.raises(DeviceFailed, match=r"device-side assert|illegal memory access"):
            await runner.run(items)
        assert handler.batch_sizes == [64]  # one pass, no 2n - 1 retries
        assert runner.failure is not None
        with pytest.raises(DeviceFailed, match="restart"):
            await runner.run([item(1)])
        assert handler.batch_sizes == [64]  # a clean batch no longer reaches the device
    finally:
        runner.close()
    errors = runner.metrics.registry.get_sample_value(
        "carpool_model_errors_total", {"model": "toy", "kind": "infer"}
    )
    assert errors == 64


async def test_out_of_memory_is_not_fatal_and_smaller_batches_run() -> None:
    class BigBatchesRunOutOfMemory(CountingToy):
        def infer(self, batch: torch.Tensor) -> torch.Tensor:
            self.batch_sizes.append(len(batch))
            if len(batch) > 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return batch * 2 + 1

    handler = BigBatchesRunOutOfMemory(HandlerSettings(None, torch.float32, 16))
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), 16)
    await runner.load(1, [])
    try:
        results = await runner.run([item(i) for i in range(16)])
    finally:
        runner.close()
    assert [r.status for r in results] == [200] * 16
    assert handler.batch_sizes == [16, 8, 8]
    assert runner.failure is None


async def test_a_warmup_item_replaces_the_handlers_example() -> None:
    handler = CountingToy(HandlerSettings(None, torch.float32, 4))
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), 4, item(7))
    try:
        await runner.load(1, [1, 4])
    finally:
        runner.close()
    assert handler.batch_sizes == [1, 4]
    assert handler.rows == [[7.0] * 4] * 5  # not the toy's own example, zeros


class ShapedToy(CountingToy):
    """Forms two input shapes (told apart here by value): warm-up must run both at every size."""

    def warmup_items(self) -> list[dict[str, Tensor]]:
        return [item(1), item(2)]


async def test_warm_up_runs_every_size_at_every_shape_the_handler_forms() -> None:
    handler = ShapedToy(HandlerSettings(None, torch.float32, 3))
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), 3)
    try:
        await runner.load(1, [1, 2, 3])
    finally:
        runner.close()
    assert handler.batch_sizes == [1, 1, 2, 2, 3, 3]
    assert [row[0] for row in handler.rows] == [1, 2, 1, 1, 2, 2, 1, 1, 1, 2, 2, 2]


def test_a_gpu_warms_up_every_size_a_cpu_the_powers_of_two() -> None:
    assert default_sizes(6, torch.device("cuda", 0)) == (1, 2, 3, 4, 5, 6)
    assert default_sizes(12, torch.device("cpu")) == (1, 2, 4, 8, 12)
    assert default_sizes(64, torch.device("cpu")) == (1, 2, 4, 8, 16, 32, 64)


async def test_warm_up_stops_when_its_time_is_spent(caplog: pytest.LogCaptureFixture) -> None:
    runner, handler = make_runner(max_batch_size=64)
    try:
        await runner.load(1, list(range(1, 65)), warmup_seconds=0)
    finally:
        runner.close()
    # The first size runs; the time is spent after it, and the log says what was left.
    assert handler.batch_sizes == [1]
    assert "with 1 of 64 batch sizes run; batches of 2 items and more" in caplog.text
