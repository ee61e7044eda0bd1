"""Generate requests to a model server that batches generation itself, token by token
(its metadata says `streams_tokens`): each request goes on its own, as a stream frame, the
moment it may, without waiting for company: the model server's loop is the batcher.

The sidecar still bounds and orders them (`Admission`): at most the model's max batch size
run at once (the model server's running batch), the rest wait here, highest priority first
and FIFO within a level, at most maxQueueItems of them (429 past that), each until its
deadline (504). A caller who leaves gives up its place in the queue, or ends its sequence at
the model server (the stream frame is cancelled). The frames a caller has not yet taken
hold their bytes in the answer budget (`answers.HeldFrames`) until the caller takes the
next one, that is once the front has sent the one before. The metrics say how generation
goes: time to first token, time between tokens, tokens generated, streams running and
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from carpool.contract.generation import FIRST_TOKEN_BUCKETS, TEXT_OUTPUT, TOKEN_GAP_BUCKETS
from carpool.contract.wire import Item, ItemResult, Tensor
from carpool.engine.errors import BadModelResponse, DeadlineExceeded, ModelError, QueueFull
from carpool.engine.priority import rank
from carpool_sidecar import generation
from carpool_sidecar.answers import AnswerBudget, HeldFrames
from carpool_sidecar.client import ModelClient
from carpool_sidecar.generation import Ending, GenerateResponse

# Seconds a refused caller is told to wait: a place frees as soon as one answer ends.
RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Piece:
    """Text for the caller as it comes; the last piece carries the answer too."""

    text: str
    final: GenerateResponse | None = None


class GenerationMetrics:
    """Generation as callers see it, for every generate request (streamed or not)."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, ["model"], registry=registry, buckets=buckets)
            return metric.labels(model)

        self.first_token = histogram(
            "carpool_generation_time_to_first_token_seconds",
            "From a generate request's arrival to its first text (the whole answer's, for a "
            "model that does not stream tokens).",
            FIRST_TOKEN_BUCKETS,
        )
        self.token_gap = histogram(
            "carpool_generation_inter_token_seconds",
            "Between the pieces of text of a streamed answer.",
            TOKEN_GAP_BUCKETS,
        )
        self.tokens = Counter(
            "carpool_generation_tokens",
            "Tokens generated for answered generate requests (where the model counts them).",
            ["model"],
            registry=registry,
        ).labels(model)
        self.running = Gauge(
            "carpool_generation_running_streams",
            "Generate requests sent to a model server that batches tokens itself, unanswered.",
            ["model"],
            registry=registry,
        ).labels(model)
        self.waiting = Gauge(
            "carpool_generation_waiting_streams",
            "Generate requests waiting in the sidecar for a place in the model's running batch.",
            ["model"],
            registry=registry,
        ).labels(model)


class Admission:
    """At most `limit` streams at once, the others waiting by priority, bounded in number."""

    def __init__(self, metrics: GenerationMetrics) -> None:
        self._metrics = metrics
        self._running = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @contextlib.asynccontextmanager
    async def place(
        self, priority: int, deadline: float, limit: int, max_waiting: int
    ) -> AsyncIterator[None]:
        """Hold one of `limit` places while the block runs; wait for it (by priority, until
        `deadline` in loop time) behind at most `max_waiting` others."""
        queue_rank = rank(priority)
        if self._running < limit and not self._live_waiters():
            self._take()
        else:
            if self._live_waiters() >= max_waiting:
                raise QueueFull(
                    f"queue full: {self._live_waiters()} generate requests wait for a place "
                    f"among {limit}, limit {max_waiting}",
                    RETRY_AFTER_S,
                )
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (-queue_rank, next(self._seq), granted))
            self._metrics.waiting.inc()
            try:
                async with asyncio.timeout_at(deadline):
                    await granted
            except BaseException as error:
                if granted.done() and not granted.cancelled():
                    self._release(limit)  # granted as the caller gave up: pass it on
                else:
                    granted.cancel()
                    self._metrics.waiting.dec()
                if isinstance(error, TimeoutError):
                    raise DeadlineExceeded(
                        "deadline passed waiting for a place in the model's running batch"
                    ) from None
                raise
        try:
            yield
        finally:
            self._release(limit)

    def _live_waiters(self) -> int:
        return sum(not granted.done() for *_, granted in self._waiting)

    def _take(self) -> None:
        self._running += 1
        self._metrics.running.inc()

    def _release(self, limit: int) -> None:
        self._running -= 1
        self._metrics.running.dec()
        while self._waiting and self._running < limit:
            *_, granted = heapq.heappop(self._waiting)
            if not granted.done():
                self._metrics.waiting.dec()
                self._take()
                granted.set_result(None)


class Streams:
    """The way to a model server that batches generation itself."""

    def __init__(self, client: ModelClient, metrics: GenerationMetrics) -> None:
        self.client = client
        self.metrics = metrics
        self.admission = Admission(metrics)

    def observe_whole(self, arrived_at: float, ending: Ending) -> None:
        """An answer that came whole, from the batcher."""
        self.metrics.first_token.observe(time.monotonic() - arrived_at)
        if ending.generated_tokens is not None:
            self.metrics.tokens.inc(ending.generated_tokens)

    async def run(
        self,
        item: Item,
        model_name: str,
        priority: int,
        limits: tuple[int, int, int],
        arrived_at: float,
        deadline: float,
        budget: AnswerBudget,
    ) -> AsyncGenerator[Piece, None]:
        """One generate request as a stream: its pieces of text, then its answer, its
        frames held in `budget` until taken. `limits`: the places in the running batch,
        the most requests waiting, the answer's most bytes."""
        places, max_waiting, answer_limit = limits
        metrics = self.metrics
        async with self.admission.place(priority, deadline, places, max_waiting):
            last = arrived_at
            streamed = 0  # characters of text sent in pieces
            held = HeldFrames(budget)
            answers = self.client.stream(item, answer_limit, held.arrived)
            try:
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            is_part, result = await anext(answers)
                    except TimeoutError:
                        raise DeadlineExceeded("deadline passed while generating") from None
                    # Not the loop's clock: uvloop's counts whole milliseconds, and pieces
                    # come a few apart. The arrival is on it, behind this by less than one.
                    now = time.monotonic()
                    if is_part:
                        first = last == arrived_at
                        (metrics.first_token if first else metrics.token_gap).observe(now - last)
                        last = now
                        text = _text(result)
                        streamed += len(text)
                        yield Piece(text)
                        held.sent()  # the caller asks for the next: this one is gone
                        continue
                    final = _answer(result, model_name)
                    if last == arrived_at:  # the model answered in one piece
                        metrics.first_token.observe(now - last)
                    if final.ending.generated_tokens is not None:
                        metrics.tokens.inc(final.ending.generated_tokens)
                    # What the pieces did not carry: all of it, from a model server that ran
                    # this request the static way.
                    yield Piece(final.text_output[streamed:], final)
                    return
            finally:
                await answers.aclose()
                held.release()


def _text(result: ItemResult) -> str:
    return generation.text_of(_output(result))


def _answer(result: ItemResult, model_name: str) -> GenerateResponse:
    text = generation.text_of(_output(result))
    return GenerateResponse(model_name, text, generation.ending_of(result.outputs or {}))


def _output(result: ItemResult) -> Tensor:
    """The result's text output; the error it carries, or BadModelResponse without one."""
    if result.error is not None:
        status = result.status if 400 <= result.status <= 599 else BadModelResponse.status
        raise ModelError(result.error, status)
    output = (result.outputs or {}).get(TEXT_OUTPUT)
    if output is None:
        raise BadModelResponse(f"model server result lacks output {TEXT_OUTPUT!r}")
    return output
