"""Admission of generate requests to a model server that batches tokens itself: places in
its running batch, then priority order, the queue bound and deadlines."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from carpool.engine.errors import DeadlineExceeded, QueueFull
from carpool_sidecar.streaming import Admission, GenerationMetrics

LIMIT = 2


def admission() -> tuple[Admission, CollectorRegistry]:
    registry = CollectorRegistry()
    return Admission(GenerationMetrics(registry, "m")), registry


def gauge(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"model": "m"})


async def test_waiters_get_places_by_priority_level_then_arrival() -> None:
    places, registry = admission()
    order: list[str] = []
    release = asyncio.Event()

    async def caller(name: str, priority: int) -> None:
        async with places.place(priority, asyncio.get_running_loop().time() + 10, LIMIT, 8):
            order.append(name)
            await release.wait()

    running = [asyncio.create_task(caller(f"run{n}", 0)) for n in range(LIMIT)]
    await asyncio.sleep(0)
    waiting = []
    for name, priority in [("default", 0), ("second", 2), ("first", 1), ("second-b", 2)]:
        waiting.append(asyncio.create_task(caller(name, priority)))
        await asyncio.sleep(0)
    assert gauge(registry, "carpool_generation_running_streams") == LIMIT
    assert gauge(registry, "carpool_generation_waiting_streams") == 4
    release.set()
    await asyncio.gather(*running, *waiting)
    assert order == ["run0", "run1", "first", "second", "second-b", "default"]
    assert gauge(registry, "carpool_generation_running_streams") == 0
    assert gauge(registry, "carpool_generation_waiting_streams") == 0


async def test_the_queue_is_bounded_and_waiting_has_a_deadline() -> None:
    places, registry = admission()
    loop = asyncio.get_running_loop()
    hold = asyncio.Event()

    async def holder() -> None:
        async with places.place(0, loop.time() + 10, 1, 1):
            await hold.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    patient = asyncio.create_task(holder())
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        async with places.place(0, loop.time() + 10, 1, 1):
            pass
    patient.cancel()  # a caller who leaves gives up its place in the queue
    await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded):
        async with places.place(0, loop.time() + 0.05, 1, 1):
            pass
    hold.set()
    await held
    async with places.place(0, loop.time() + 10, 1, 1):
        assert gauge(registry, "carpool_generation_running_streams") == 1
    assert gauge(registry, "carpool_generation_waiting_streams") == 0
