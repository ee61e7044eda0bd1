"""Streamed answers on the framed socket (`carpool.contract.frames.STREAM`), and the metrics
of generation that streams.

A stream frame holds one item. A handler that streams (`StreamsTokens`: the text-generation
handler with continuous batching) answers it piece by piece: each piece goes out as a PART
frame whose result holds the new text as `text_output`, and the last frame (200) holds the
whole answer as a batch's answer does. Any other handler, or an item the handler sends the
static way, is run as a batch of one: no PART frame, just the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from carpool.contract import frames, wire
from carpool.contract.generation import FIRST_TOKEN_BUCKETS, TEXT_OUTPUT, TOKEN_GAP_BUCKETS
from carpool.contract.wire import BYTES, Item, ItemResult, Tensor
from carpool_model_server.errors import BadRequest, InvalidItem

if TYPE_CHECKING:
    from carpool_model_server.continuous import LoopState, Piece


@runtime_checkable
class StreamsTokens(Protocol):
    def stream(self, item: Item) -> AsyncGenerator[Piece, None] | None:
        """The item's answer piece by piece, or None to run it as a batch; raises
        InvalidItem for an item the handler refuses."""

    def loop_state(self) -> LoopState | None:
        """The running and waiting sequences and the cache in use; None with no loop."""

    def close(self) -> None:
        """Stop the loop, if one runs; called once the worker has stopped."""


@dataclass(frozen=True, slots=True)
class GenerationMetrics:
    model: str
    first_token: Histogram
    token_gap: Histogram
    tokens: Counter
    streams: Counter

    @classmethod
    def create(
        cls, registry: CollectorRegistry, model: str, state: Callable[[], LoopState | None]
    ) -> GenerationMetrics:
        labels = ["model"]

        def gauge(name: str, description: str, read: Callable[[LoopState], float]) -> None:
            metric = Gauge(name, description, labels, registry=registry)

            def value() -> float:
                now = state()
                return 0.0 if now is None else read(now)

            metric.labels(model).set_function(value)

        gauge(
            "carpool_model_running_sequences",
            "Sequences in the running batch of the token loop.",
            lambda s: s.running,
        )
        gauge(
            "carpool_model_waiting_sequences",
            "Sequences queued for a place in the token loop's running batch.",
            lambda s: s.waiting,
        )
        gauge(
            "carpool_model_kv_cache_usage_ratio",
            "Fraction of the token loop's paged KV cache in use.",
            lambda s: s.cache_used,
        )
        created = cls(
            model,
            Histogram(
                "carpool_model_time_to_first_token_seconds",
                "From a stream's arrival to its first piece of text.",
                labels,
                buckets=FIRST_TOKEN_BUCKETS,
                registry=registry,
            ),
            Histogram(
                "carpool_model_inter_token_seconds",
                "Between a stream's pieces of text (one token each, but for held text).",
                labels,
                buckets=TOKEN_GAP_BUCKETS,
                registry=registry,
            ),
            Counter(
                "carpool_model_generated_tokens",
                "Tokens generated for streams' answers.",
                labels,
                registry=registry,
            ),
            Counter(
                "carpool_model_streams",
                "Stream frames answered, by how they ended: done, cancelled or failed.",
                [*labels, "outcome"],
                registry=registry,
            ),
        )
        for metric in (created.first_token, created.token_gap, created.tokens):
            metric.labels(model)
        for outcome in ("done", "cancelled", "failed"):
            created.streams.labels(model, outcome)
        return created


def part(text: str) -> bytes:
    """A PART frame's payload: one result holding the new text."""
    piece = Tensor(BYTES, (1,), [text.encode()])
    return wire.encode_response([ItemResult(outputs={TEXT_OUTPUT: piece})])


async def answer(
    handler: object,
    body: bytes,
    run_batch: Callable[[bytes], Awaitable[bytes]],
    metrics: GenerationMetrics,
) -> AsyncIterator[tuple[int, bytes]]:
    """The frames (code, payload) that answer the stream frame `body`, the last one final."""
    try:
        items = wire.decode_request(body)
    except wire.WireError as error:
        raise BadRequest(f"invalid stream body: {error}") from error
    if len(items) != 1:
        raise BadRequest(f"a stream frame holds one item, this one {len(items)}")
    # Not the loop's clock: uvloop's counts whole milliseconds, and tokens come a few apart.
    arrived = time.monotonic()  # the first token's wait includes tokenizing the prompt
    pieces = None
    if isinstance(handler, StreamsTokens):
        try:
            pieces = await asyncio.to_thread(handler.stream, items[0])
        except InvalidItem as error:
            refused = ItemResult.failed(str(error), InvalidItem.status)
            yield frames.OK, wire.encode_response([refused])
            return
    if pieces is None:
        yield frames.OK, await run_batch(body)
        return
    # Labelled once a stream, not at every piece.
    first_token = metrics.first_token.labels(metrics.model)
    token_gap = metrics.token_gap.labels(metrics.model)
    last = arrived
    first = True
    outcome = "cancelled"  # unless it ends otherwise: the caller left
    try:
        async for piece in pieces:
            now = time.monotonic()
            (first_token if first else token_gap).observe(now - last)
            first, last = False, now
            if piece.answer is not None:
                metrics.tokens.labels(metrics.model).inc(piece.answer.generated_tokens)
                outcome = "done"
                if piece.text:
                    yield frames.PART, part(piece.text)
                outputs = ItemResult(outputs=piece.answer.outputs())
                yield frames.OK, wire.encode_response([outputs])
                return
            yield frames.PART, part(piece.text)
    except Exception:
        outcome = "failed"
        raise
    finally:
        await pieces.aclose()
        metrics.streams.labels(metrics.model, outcome).inc()
