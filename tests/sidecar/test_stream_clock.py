"""Generation timings on a loop whose clock is coarse, as uvloop's is (whole milliseconds):
pieces a few milliseconds apart are timed as they came, not as 0 or 1 ms."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import numpy as np
from prometheus_client import CollectorRegistry
from support.virtual_time import StillClockLoop

from carpool.contract.generation import TEXT_OUTPUT
from carpool.contract.wire import BYTES, Item, ItemResult, Tensor
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.client import ModelClient
from carpool_sidecar.streaming import GenerationMetrics, Streams

GAP_S = 0.01


def text(value: str) -> ItemResult:
    return ItemResult(outputs={TEXT_OUTPUT: Tensor(BYTES, (1,), [value.encode()])})


class SpacedPieces:
    """A model server's stream: two pieces, GAP_S of the host's time before each."""

    async def stream(
        self, item: Item, part_limit: int, arrived: Callable[[int], None] | None = None
    ) -> AsyncGenerator[tuple[bool, ItemResult], None]:
        for piece in ("a", "b"):
            await asyncio.to_thread(time.sleep, GAP_S)
            yield True, text(piece)
        yield False, text("ab")


def test_generation_timings_are_of_the_hosts_time_not_the_loops_clock() -> None:
    registry = CollectorRegistry()
    streams = Streams(cast(ModelClient, SpacedPieces()), GenerationMetrics(registry, "lm"))

    async def generate() -> list[str]:
        now = asyncio.get_running_loop().time()
        item: Any = {"text_input": Tensor.from_numpy(np.array([b"hi"], dtype=object))}
        pieces = streams.run(
            item, "lm", 0, (1, 1, 1 << 20), now, now + 5, AnswerBudget(1 << 20, 1 << 20)
        )
        return [piece.text async for piece in pieces]

    with asyncio.Runner(loop_factory=StillClockLoop) as runner:
        assert runner.run(generate()) == ["a", "b", ""]

    for name in ("time_to_first_token_seconds", "inter_token_seconds"):
        timed = registry.get_sample_value(f"carpool_generation_{name}_sum", {"model": "lm"})
        assert timed is not None and timed >= GAP_S, name
