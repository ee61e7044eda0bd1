"""`carpool.batch` on a loop whose clock is coarse, as uvloop's is (whole milliseconds)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from support.virtual_time import StillClockLoop

import carpool


def test_a_call_within_a_tick_of_the_loops_clock_still_takes_its_time() -> None:
    registry = CollectorRegistry()

    @carpool.batch(max_batch_size=4, max_wait_ms=0, registry=registry)
    async def double(values: list[int]) -> list[int]:
        return [2 * value for value in values]

    async def call() -> int:
        try:
            return await double(21)
        finally:
            await double.aclose()

    with asyncio.Runner(loop_factory=StillClockLoop) as runner:
        assert runner.run(call()) == 42
    labels = {"model": "double", "protocol": "inprocess"}
    assert registry.get_sample_value("carpool_requests_total", {**labels, "code": "200"}) == 1
    took = registry.get_sample_value("carpool_request_duration_seconds_sum", labels)
    assert took is not None and 0 < took < 1
