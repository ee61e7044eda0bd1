"""One caller's request while it waits in the batching engine."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

# What callers submit and what they get back: for the sidecar a model input and the model
# server's answer for it, for `carpool.batch` the wrapped function's argument and result.
ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Items share a batch only when their keys are equal.

    `signature` holds the input names, datatypes and per-item shapes (variable dimensions
    replaced by the bucket); `bucket` is the power-of-two length bucket of variable-length
    items, None for fixed-shape ones; `settings` what the items' own settings require to
    be equal (text generation: the power-of-two bucket of `max_new_tokens`), None if nothing.
    """

    signature: Hashable
    bucket: int | None = None
    settings: Hashable = None


@dataclass(slots=True, eq=False)
class PendingRequest(Generic[ItemT, ResultT]):
    """The items of one caller, its single future, and how far its items have been sent.

    Only the engine builds and changes these (`Batcher.submit`). A request larger than the
    batch size is sent in several batches: `sent` counts the items already taken, `results`
    collects their answers in order.
    """

    items: Sequence[ItemT]
    key: BatchKey
    priority: int  # the queue rank (`priority.rank`): higher is served first
    deadline: float  # loop.time() after which the caller gets 504
    future: asyncio.Future[list[ResultT]]
    enqueued_at: float  # time.monotonic(), the engine's clock (loop.time()'s, to the ms)
    seq: int
    # Per-item lengths of variable-length items (padding is measured on them).
    lengths: Sequence[int] | None = None
    # Bytes of its data the queue counts against maxQueueBytes until it leaves the queue.
    queued_bytes: int = 0
    sent: int = 0
    answered: int = 0
    results: list[ResultT | None] = field(default_factory=list)
    # When it reached the front (time.monotonic()), where its latency objective starts;
    # None: when it was queued.
    arrived_at: float | None = None

    @property
    def unsent(self) -> int:
        return len(self.items) - self.sent

    @property
    def queued(self) -> bool:
        """Whether it still has items to send and a caller waiting for them."""
        return self.unsent > 0 and not self.future.done()

    def fail(self, error: Exception) -> None:
        """Fail a caller who is still waiting; one who left (cancelled) is no error."""
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True)
class Part(Generic[ItemT, ResultT]):
    """The items `start` to `stop` of one request, as they go in one batch."""

    request: PendingRequest[ItemT, ResultT]
    start: int
    stop: int


# The queue and the dispatcher never look inside items or results.
AnyRequest = PendingRequest[Any, Any]
AnyPart = Part[Any, Any]
