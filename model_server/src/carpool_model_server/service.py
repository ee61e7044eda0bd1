"""The data plane: readiness, metadata, batches and streams, independent of HTTP."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from carpool.contract import wire
from carpool.contract.metadata import ModelMetadata
from carpool.contract.wire import BatchTiming, Item
from carpool_model_server.errors import BadRequest, DeviceFailed, NotReady
from carpool_model_server.runner import Measured, Runner
from carpool_model_server.streaming import GenerationMetrics, StreamsTokens, answer


class ModelService:
    def __init__(self, name: str, runner: Runner) -> None:
        self.name = name
        self.runner = runner
        self.ready = False
        self._in_flight = _InFlight()
        handler = runner.handler
        state = handler.loop_state if isinstance(handler, StreamsTokens) else lambda: None
        self.generation = GenerationMetrics.create(runner.metrics.registry, name, state)

    async def start(
        self,
        torch_threads: int | None,
        warmup_sizes: Sequence[int] | None,
        warmup_seconds: float = math.inf,
    ) -> None:
        """Load and warm up; the service answers batches only afterwards."""
        await self.runner.load(torch_threads, warmup_sizes, warmup_seconds)
        self.ready = True

    def answer_now(self, items: Sequence[Item]) -> bytes | None:
        """The answer body of a batch the model runs on this thread at once
        (`Runner.run_now`); None for one that waits for the worker: `answer` it."""
        with self._busy():
            done = self.runner.run_now(items, time.monotonic())
        return None if done is None else wire.encode_response(*done)

    def answer_later(
        self, items: Sequence[Item], reply: Callable[[bytes | Exception], None]
    ) -> asyncio.Future[Measured] | None:
        """A batch the worker runs in one call (`Runner.run_later`), whose answer body (or
        error) goes to `reply` on the loop's thread, in the turn the worker's answer comes:
        no task waits for it. Cancelling the future cancels the batch (no reply); it
        is done in the turn of the reply. None for a batch that is to be awaited (`answer`)."""
        in_flight = self._busy()
        arrived = time.monotonic()
        future = self.runner.run_later(items, functools.partial(self._answered, arrived, reply))
        if future is not None:
            in_flight.started()
        return future

    def _answered(
        self,
        arrived: float,
        reply: Callable[[bytes | Exception], None],
        future: asyncio.Future[Measured],
    ) -> None:
        self._in_flight.ended()
        if future.cancelled():
            return
        try:
            results, started, finished = future.result()
            body = wire.encode_response(results, BatchTiming(started - arrived, finished - started))
        except Exception as error:
            reply(error)
        else:
            reply(body)

    async def answer(self, items: Sequence[Item]) -> bytes:
        """The batch's answer body: its results, and where their time went."""
        with self._busy():
            done = await self.runner.run_timed(items)
        return wire.encode_response(*done)

    async def stream_body(self, body: bytes) -> AsyncIterator[tuple[int, bytes]]:
        """The frames (code, payload) answering one stream frame (`streaming.answer`)."""
        with self._busy():
            try:
                async for frame in answer(
                    self.runner.handler, body, self.infer_body, self.generation
                ):
                    yield frame
            except DeviceFailed as error:
                # The token loop stopped for good: the health probe asks for a restart.
                self.runner.failure = self.runner.failure or str(error)
                raise

    def close(self) -> None:
        """Let the batch in flight finish, then stop the worker and any token loop."""
        self.runner.close()
        if isinstance(self.runner.handler, StreamsTokens):
            self.runner.handler.close()

    def _busy(self) -> _InFlight:
        """A batch or stream in flight, while in its `with`: the server is not idle
        (`idle_for`) meanwhile."""
        if not self.ready:
            raise NotReady("model is not ready: still loading or warming up")
        return self._in_flight

    async def infer_body(self, body: bytes) -> bytes:
        """One batch in the wire format, as the HTTP route and the framed stream carry it."""
        items = self.decode(body)
        return self.answer_now(items) or await self.answer(items)

    @staticmethod
    def decode(body: bytes) -> Sequence[Item]:
        """A batch body's items; BadRequest for a malformed one."""
        try:
            return wire.decode_request(body)
        except wire.WireError as error:
            raise BadRequest(f"invalid batch body: {error}") from error

    def idle_for(self) -> float:
        """Seconds since the last batch finished; 0 while one is in flight."""
        if self._in_flight.count:
            return 0.0
        return time.monotonic() - self._in_flight.last_ended

    def metadata(self) -> dict[str, Any]:
        """The model metadata document of `GET /metadata`."""
        declared = self.runner.handler.metadata
        served = ModelMetadata.served(declared, self.name, self.runner.max_batch_size)
        return served.encode()


class _InFlight:
    """Batches and streams in flight, and when the last one ended. A class, not a generator
    context manager: it wraps every batch, and costs a fifth as much."""

    __slots__ = ("count", "last_ended")

    def __init__(self) -> None:
        self.count = 0
        self.last_ended = time.monotonic()

    def started(self) -> None:
        self.count += 1

    def ended(self) -> None:
        self.count -= 1
        self.last_ended = time.monotonic()

    def __enter__(self) -> None:
        self.started()

    def __exit__(self, *_: object) -> None:
        self.ended()
