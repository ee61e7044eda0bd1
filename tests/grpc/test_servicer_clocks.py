"""ModelInfer in process, on virtual time: how a call is counted and timed when the loop's
clock is coarse, as uvloop's is (whole milliseconds), and disagrees with gRPC's core by a hair.

Virtual time stands still while code runs, as uvloop's clock does within a millisecond."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from support.virtual_time import on_virtual_time

from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest
from carpool.contract.wire import Item, ItemResult
from carpool.engine.batcher import Batcher
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.settings import BatchingSettings
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.converting import Converter
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.grpc.servicer import InferenceServicer
from carpool_sidecar.health import ModelState
from carpool_sidecar.reading import ReadingBudget

DEADLINE_S = 0.1
# gRPC's core ends the call this long before the loop's timer for the same deadline fires.
GRPC_EARLY_S = 0.001


class Stuck:
    """A model server that never answers."""

    async def send(self, items: Sequence[Item], timeout_s: float) -> tuple[list[ItemResult], None]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Context:
    """grpc.aio's context, as much as ModelInfer uses of it."""

    def __init__(self, remaining_s: float | None) -> None:
        self.remaining_s = remaining_s

    def time_remaining(self) -> float | None:
        return self.remaining_s

    def add_done_callback(self, callback: Any) -> None:
        pass

    async def abort(self, code: Any, details: str, metadata: Any = ()) -> None:
        raise Aborted(code)


class Aborted(Exception):
    """What grpc.aio's `context.abort` raises to end the call."""


@asynccontextmanager
async def servicer(registry: CollectorRegistry) -> AsyncIterator[InferenceServicer]:
    metrics = SidecarMetrics(registry, "m")
    clock = asyncio.get_running_loop().time
    batcher = Batcher(BatchingSettings(max_wait_ms=0), Stuck(), metrics, clock)
    state = ModelState()
    spec = TensorSpec("x", "FP32", (-1,))
    state.ready = True
    state.metadata = ModelMetadata(
        name="m", platform="test", inputs=(spec,), outputs=(spec,), max_batch_size=8
    )
    dataplane = DataPlane("m", batcher, state, AnswerBudget(2**30, 2**30))
    reading = ReadingBudget(2**30)
    sidecar = SimpleNamespace(
        dataplane=dataplane, batcher=batcher, metrics=metrics, converter=Converter(reading),
        config=SimpleNamespace(grpc_message_limit=2**30),
    )  # fmt: skip
    dispatcher = asyncio.create_task(batcher.run())
    try:
        yield InferenceServicer(sidecar)  # type: ignore[arg-type]
    finally:
        dispatcher.cancel()
        await asyncio.gather(dispatcher, return_exceptions=True)
        sidecar.converter.close()


def message() -> bytes:
    request = ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    return request.SerializeToString()


def counted(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"model": "m", **labels}) or 0.0


@on_virtual_time
async def test_a_call_grpc_ends_at_its_deadline_counts_as_the_deadline_refusal() -> None:
    """gRPC's core ends a call at its deadline by its own clock, which may run ahead of the
    loop's timer for the same deadline: the call still counts as the sidecar counts a
    deadline it saw pass itself, a 504 and a `deadline` refusal."""
    registry = CollectorRegistry()
    async with servicer(registry) as infer:
        call = asyncio.create_task(infer.ModelInfer(message(), Context(DEADLINE_S)))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + DEADLINE_S - GRPC_EARLY_S, call.cancel)
        with pytest.raises(asyncio.CancelledError):
            await call
    assert counted(registry, "carpool_requests_total", protocol="grpc", code="504") == 1
    assert counted(registry, "carpool_rejected_total", reason="deadline") == 1


@on_virtual_time
async def test_a_call_answered_within_a_tick_of_the_loops_clock_still_takes_its_time() -> None:
    """A refusal takes well under a millisecond, which uvloop's clock does not see pass: the
    sidecar times its calls by a finer clock, as it times REST requests."""
    registry = CollectorRegistry()
    async with servicer(registry) as infer:
        with pytest.raises(Aborted):
            await infer.ModelInfer(b"not protobuf", Context(None))  # type: ignore[arg-type]
    assert counted(registry, "carpool_requests_total", protocol="grpc", code="400") == 1
    took = counted(registry, "carpool_request_duration_seconds_sum", protocol="grpc")
    assert 0 < took < 1
