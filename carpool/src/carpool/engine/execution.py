"""One batch's way back: results to the callers' futures, one error to all of them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol, TypeVar, cast

from carpool.contract.wire import BatchTiming
from carpool.engine.errors import INTERNAL_MESSAGE, BadModelResponse, SidecarError, Unavailable
from carpool.engine.pending import AnyPart, ItemT, Part, ResultT

log = logging.getLogger(__name__)

ItemT_contra = TypeVar("ItemT_contra", contravariant=True)
ResultT_co = TypeVar("ResultT_co", covariant=True)

# One result per item, in order, and the model server's timing of the batch when it tells.
Answer = tuple[Sequence[ResultT], BatchTiming | None]


class BatchSender(Protocol[ItemT_contra, ResultT_co]):
    """Where the engine sends its batches: the model server, or an in-process function."""

    async def send(
        self, items: Sequence[ItemT_contra], timeout_s: float
    ) -> tuple[Sequence[ResultT_co], BatchTiming | None]:
        """The batch's answer; raises SidecarError on failure."""
        ...


async def execute(
    sender: BatchSender[ItemT, ResultT],
    parts: Sequence[Part[ItemT, ResultT]],
    items: list[ItemT],
    timeout_s: float,
) -> Answer[ResultT] | None:
    """Send one batch and answer its callers; its answer when the sender answered every item."""
    try:
        results, timing = await sender.send(items, timeout_s)
        if len(results) != len(items):
            raise BadModelResponse(
                f"model server returned {len(results)} results for {len(items)} items"
            )
    except SidecarError as error:
        log.warning("batch of %d items failed: %s", len(items), error.message)
        fail(parts, error)
    except asyncio.CancelledError:
        # The sidecar is stopping: callers hear so now, not at their deadline.
        fail(parts, Unavailable("the sidecar stopped"))
        raise
    except Exception:
        # A bug, not an outage; still, every waiter hears about it (details in the log).
        log.exception("batch of %d items failed", len(items))
        fail(parts, SidecarError(INTERNAL_MESSAGE))
    else:
        deliver(parts, results)
        return results, timing
    return None


def batch_items(parts: Sequence[Part[ItemT, ResultT]]) -> list[ItemT]:
    return [item for part in parts for item in part.request.items[part.start : part.stop]]


def deliver(parts: Sequence[Part[ItemT, ResultT]], results: Sequence[ResultT]) -> None:
    """Hand each caller its slice of `results`; a caller is answered once all its items are."""
    offset = 0
    for part in parts:
        request = part.request
        count = part.stop - part.start
        answers = results[offset : offset + count]
        offset += count
        if request.future.done():
            continue
        request.results[part.start : part.stop] = answers
        request.answered += count
        if request.answered == len(request.items):
            # Every slot is filled once all items are answered.
            request.future.set_result(cast(list[ResultT], request.results))


def fail(parts: Sequence[AnyPart], error: Exception) -> None:
    """Every waiter of a failed batch hears of it."""
    for part in parts:
        part.request.fail(error)


def padding_ratio(parts: Sequence[AnyPart]) -> float | None:
    """Padded elements / real elements - 1 of a batch of variable-length items."""
    lengths = [
        length
        for part in parts
        if part.request.lengths is not None
        for length in part.request.lengths[part.start : part.stop]
    ]
    real = sum(lengths)
    return len(lengths) * max(lengths) / real - 1 if real else None
