"""A stream's token timings on a loop whose clock is coarse, as uvloop's is (whole
milliseconds): tokens a few milliseconds apart are timed as they came, not as 0 or 1 ms."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from prometheus_client import CollectorRegistry
from support.virtual_time import StillClockLoop

from carpool.contract import frames, wire
from carpool.contract.wire import Item
from carpool_model_server import streaming
from carpool_model_server.continuous import LoopState, Piece
from carpool_model_server.handler_text_generation import Answer
from carpool_model_server.streaming import GenerationMetrics

GAP_S = 0.01


class SpacedTokens:
    """Answers every item with two pieces, GAP_S of the host's time before each."""

    def stream(self, item: Item) -> AsyncGenerator[Piece, None]:
        return self._pieces()

    async def _pieces(self) -> AsyncGenerator[Piece, None]:
        for text in ("a", "b"):
            await asyncio.to_thread(time.sleep, GAP_S)
            yield Piece(text)
        yield Piece("", Answer("ab", "length", 1, 2))

    def loop_state(self) -> LoopState | None:
        return None

    def close(self) -> None:
        pass


def test_token_timings_are_of_the_hosts_time_not_the_loops_clock() -> None:
    registry = CollectorRegistry()
    metrics = GenerationMetrics.create(registry, "lm", lambda: None)

    async def unused(body: bytes) -> bytes:
        raise AssertionError("the stream runs as a batch")

    async def answer() -> list[int]:
        body = wire.encode_request([{}])
        return [code async for code, _ in streaming.answer(SpacedTokens(), body, unused, metrics)]

    with asyncio.Runner(loop_factory=StillClockLoop) as runner:
        assert runner.run(answer()) == [frames.PART, frames.PART, frames.OK]

    for name in ("time_to_first_token_seconds", "inter_token_seconds"):
        timed = registry.get_sample_value(f"carpool_model_{name}_sum", {"model": "lm"})
        assert timed is not None and timed >= GAP_S, name
