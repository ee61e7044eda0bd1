"""The batching engine: pure asyncio, no HTTP.

Callers `submit` their items and await one future. A single dispatcher task forms batches
from compatible queued items and hands each to `send` in its own task, at most
`max_inflight_batches` at a time. The window of a forming batch opens at its first item.

Adaptive dispatch: while no batch is in flight the model server is idle, so whatever is
queued goes at once (reason `idle`); while one runs, the next batch waits until it is full
or `max_wait` has passed since its first item (`full`, `timeout`). Fixed dispatch always
waits. On shutdown every queued item is sent as fast as slots free up (`drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from carpool.contract.wire import Item, ItemResult
from carpool.sidecar.config import BatchingSettings
from carpool.sidecar.errors import (
    BadModelResponse,
    DeadlineExceeded,
    PayloadTooLarge,
    QueueFull,
    SidecarError,
    Unavailable,
)
from carpool.sidecar.metrics import SidecarMetrics
from carpool.sidecar.pending import BatchKey, PendingRequest

log = logging.getLogger(__name__)

# Sends one batch and returns one result per item; raises SidecarError on failure.
Send = Callable[[Sequence[Item], float], Awaitable[Sequence[ItemResult]]]

THROUGHPUT_WINDOW_S = 10.0
MAX_RETRY_AFTER_S = 60


def _queued(request: PendingRequest) -> bool:
    """Whether the request still has items to send and a caller waiting for them."""
    return request.unsent > 0 and not request.future.done()


@dataclass(slots=True, eq=False)
class _Group:
    """Queued requests with one BatchKey, highest priority first, FIFO within a level.

    Finished requests (cancelled, expired) leave lazily: from the front of `heap` and
    `arrivals` as they reach it, and all at once when the group's entries outnumber twice
    its waiting items; a group left with no waiting item is dropped whole.
    """

    key: BatchKey
    heap: list[tuple[int, int, PendingRequest]] = field(default_factory=list)
    # The same requests in arrival order: the oldest opens the batch window.
    arrivals: deque[PendingRequest] = field(default_factory=deque)
    items: int = 0  # unsent items of requests still waiting

    def push(self, request: PendingRequest) -> None:
        heapq.heappush(self.heap, (-request.priority, request.seq, request))
        self.arrivals.append(request)
        self.items += len(request.items)

    def head(self) -> PendingRequest | None:
        """The next request to serve, dropping finished (cancelled, expired) ones on the way."""
        while self.heap:
            request = self.heap[0][2]
            if not request.future.done():
                return request
            heapq.heappop(self.heap)
        return None

    def opened_at(self) -> float:
        """Enqueue time of the oldest request with items to send; O(1) amortised."""
        while self.arrivals and not _queued(self.arrivals[0]):
            self.arrivals.popleft()
        return self.arrivals[0].enqueued_at if self.arrivals else math.inf

    def compact(self) -> None:
        """Drop finished requests once they are the majority, so their bodies are freed
        without waiting for the queue to reach them; the rebuild costs O(1) per finish."""
        if len(self.heap) > 2 * self.items:
            self.heap = [entry for entry in self.heap if _queued(entry[2])]
            heapq.heapify(self.heap)
            self.arrivals = deque(request for request in self.arrivals if _queued(request))


def _fail(request: PendingRequest, error: Exception) -> None:
    """Fail a caller who is still waiting; one who left (cancelled) is no error."""
    if not request.future.done():
        request.future.set_exception(error)


@dataclass(slots=True)
class _Part:
    request: PendingRequest
    start: int
    stop: int


class Batcher:
    def __init__(self, settings: BatchingSettings, send: Send, metrics: SidecarMetrics) -> None:
        self._settings = settings
        self._send = send
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._groups: dict[BatchKey, _Group] = {}
        self._queued = 0
        # Batches at the model server. A counter rather than a semaphore: only the dispatcher
        # takes slots, and the limit (maxInflightBatches) can change live.
        self._inflight = 0
        self._seq = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        # (started, finished, items) of each answered batch of the last THROUGHPUT_WINDOW_S.
        self._completed: deque[tuple[float, float, int]] = deque()
        # The model server's own limit, once its metadata is known.
        self._model_max_batch_size: int | None = None

    @property
    def settings(self) -> BatchingSettings:
        return self._settings

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queued_items(self) -> int:
        return self._queued

    def limit_batch_size(self, model_max_batch_size: int) -> None:
        """Never send more than the model server says it takes."""
        self._model_max_batch_size = model_max_batch_size
        self._wake.set()

    def update(self, settings: BatchingSettings) -> None:
        """Use new batching knobs from the next batch on."""
        self._settings = settings
        self._wake.set()

    async def submit(self, request: PendingRequest) -> list[ItemResult]:
        """Queue the request and wait for all its results, or raise the SidecarError for it.

        Cancelling the caller (client gone, deadline) cancels the future; its unsent items
        are then never sent.
        """
        if self._draining:
            raise Unavailable("the sidecar is shutting down")
        count = len(request.items)
        limit = self._settings.max_queue_items
        if count > limit:
            raise PayloadTooLarge(f"request has {count} items, more than maxQueueItems {limit}")
        if self._queued + count > limit:
            raise QueueFull(
                f"queue full: {self._queued} items queued, limit {limit}",
                self.retry_after_s(),
            )
        now = self._loop.time()
        request.enqueued_at = now
        request.seq = self._seq = self._seq + 1
        request.results = [None] * count
        group = self._groups.get(request.key)
        if group is None:
            group = self._groups[request.key] = _Group(request.key)
        group.push(request)
        self._queued += count
        self._idle.clear()
        self._metrics.queue_items.set(self._queued)
        request.future.add_done_callback(lambda _: self._forget(request, group))
        self._wake.set()
        try:
            async with asyncio.timeout_at(request.deadline):
                return await request.future
        except TimeoutError:
            raise DeadlineExceeded(
                f"deadline of {1000 * (request.deadline - now):.0f} ms passed"
            ) from None

    def _forget(self, request: PendingRequest, group: _Group) -> None:
        """A finished request gives back the queue room of items it never sent; a group
        left without waiting requests goes, with whatever it still holds."""
        if request.sent == 0:
            # Left the queue unsent (expired, cancelled, shut down): its wait shows overload.
            self._metrics.queue_wait.observe(self._loop.time() - request.enqueued_at)
        unsent = request.unsent
        request.sent = len(request.items)
        if unsent:
            group.items -= unsent
            self._queued -= unsent
            self._metrics.queue_items.set(self._queued)
            if self._groups.get(group.key) is group:
                if group.items <= 0:
                    del self._groups[group.key]
                else:
                    group.compact()
        self._check_idle()
        self._wake.set()

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained, from throughput of the last seconds."""
        now = self._loop.time()
        self._prune_completed(now)
        done = sum(count for _, _, count in self._completed)
        if not done:
            return 1
        # Items per second over the time those batches took, not over the whole window: at
        # the start of a spike most of the window is idle time, which would promise a drain
        # many times slower than the model's.
        busy_since = min(started for started, _, _ in self._completed)
        rate = done / max(now - busy_since, 1e-3)
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(self._queued / rate)))

    def _prune_completed(self, now: float) -> None:
        while self._completed and self._completed[0][1] < now - THROUGHPUT_WINDOW_S:
            self._completed.popleft()

    def _capacity(self, key: BatchKey) -> int:
        settings = self._settings
        limit = settings.max_batch_size
        if self._model_max_batch_size:
            limit = min(limit, self._model_max_batch_size)
        if key.bucket is None or not settings.max_batch_tokens:
            return limit
        # Every item of the group pads to at most its bucket length.
        return max(1, min(limit, settings.max_batch_tokens // key.bucket))

    def _decide(self, now: float) -> tuple[_Group, str] | float | None:
        """The group to send now and why, else when to look again (None: on the next event)."""
        settings = self._settings
        if self._inflight >= settings.max_inflight_batches:
            return None
        ranked: list[tuple[tuple[int, int], _Group]] = []
        for group in self._groups.values():
            head = group.head() if group.items else None
            if head is not None:
                ranked.append(((-head.priority, head.seq), group))
        if not ranked:
            return None
        ranked.sort(key=lambda pair: pair[0])
        due = math.inf
        for _, group in ranked:
            if group.items >= self._capacity(group.key):
                return group, "full"
            closes_at = group.opened_at() + settings.max_wait_s
            if now >= closes_at:
                return group, "timeout"
            due = min(due, closes_at)
        first = ranked[0][1]
        if self._draining:
            return first, "drain"
        if settings.dispatch == "adaptive" and self._inflight == 0:
            return first, "idle"
        return due

    def _take(self, group: _Group, now: float) -> list[_Part]:
        """Remove up to one batch of items from the group, best first."""
        room = self._capacity(group.key)
        parts: list[_Part] = []
        while room and (request := group.head()) is not None:
            if request.deadline <= now:
                # Not worth the model's time: its caller is answered 504 now.
                _fail(request, DeadlineExceeded("deadline passed in the queue"))
                continue
            if request.sent == 0:
                self._metrics.queue_wait.observe(now - request.enqueued_at)
            count = min(room, request.unsent)
            parts.append(_Part(request, request.sent, request.sent + count))
            request.sent += count
            group.items -= count
            self._queued -= count
            room -= count
            if request.unsent == 0:
                heapq.heappop(group.heap)
        if group.items <= 0:
            del self._groups[group.key]
        self._metrics.queue_items.set(self._queued)
        return parts

    async def run(self) -> None:
        """The dispatcher: runs until cancelled, then fails whatever is left with 503."""
        try:
            while True:
                self._wake.clear()
                now = self._loop.time()
                decision = self._decide(now)
                if isinstance(decision, tuple):
                    group, reason = decision
                    parts = self._take(group, now)
                    if parts:
                        self._launch(parts, reason, group.key)
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(decision):
                        await self._wake.wait()
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Refuse new requests and answer every waiting caller, queued or in a batch, 503."""
        self._draining = True
        # Queued requests first: with none left, the dispatcher starts no batch meanwhile.
        for group in self._groups.values():
            for _, _, request in group.heap:
                _fail(request, Unavailable("the sidecar stopped"))
        self._groups.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def drain(self, grace_s: float) -> bool:
        """Refuse new requests, send everything queued; True when all of it was answered."""
        self._draining = True
        self._wake.set()
        try:
            async with asyncio.timeout(grace_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _check_idle(self) -> None:
        if self._queued == 0 and self._inflight == 0:
            self._idle.set()

    def _launch(self, parts: list[_Part], reason: str, key: BatchKey) -> None:
        items = [item for part in parts for item in part.request.items[part.start : part.stop]]
        self._metrics.batch_sent(reason, len(items))
        if key.bucket is not None:
            self._observe_padding(parts)
        self._inflight += 1
        self._metrics.inflight_batches.set(self._inflight)
        task = asyncio.create_task(self._run_batch(parts, items))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _observe_padding(self, parts: list[_Part]) -> None:
        lengths = [
            length
            for part in parts
            if part.request.lengths is not None
            for length in part.request.lengths[part.start : part.stop]
        ]
        real = sum(lengths)
        if real:
            self._metrics.padding_ratio.observe(len(lengths) * max(lengths) / real - 1)

    async def _run_batch(self, parts: list[_Part], items: list[Item]) -> None:
        started = self._loop.time()
        timeout_s = max(part.request.deadline for part in parts) - started
        try:
            results = await self._send(items, timeout_s)
            if len(results) != len(items):
                raise BadModelResponse(
                    f"model server returned {len(results)} results for {len(items)} items"
                )
        except SidecarError as error:
            log.warning("batch of %d items failed: %s", len(items), error.message)
            for part in parts:
                _fail(part.request, error)
        except asyncio.CancelledError:
            # The sidecar is stopping: callers hear so now, not at their deadline.
            for part in parts:
                _fail(part.request, Unavailable("the sidecar stopped"))
            raise
        except Exception:
            # A bug, not an outage; still, every waiter hears about it (details in the log).
            log.exception("batch of %d items failed", len(items))
            for part in parts:
                _fail(part.request, SidecarError("internal error; see the sidecar log"))
        else:
            self._deliver(parts, results)
            # Only answered batches tell how fast the queue drains (for Retry-After).
            self._completed.append((started, self._loop.time(), len(items)))
        finally:
            now = self._loop.time()
            self._metrics.model_duration.observe(now - started)
            self._prune_completed(now)
            self._inflight -= 1
            self._metrics.inflight_batches.set(self._inflight)
            self._check_idle()
            self._wake.set()

    @staticmethod
    def _deliver(parts: list[_Part], results: Sequence[ItemResult]) -> None:
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
                request.future.set_result(cast(list[ItemResult], request.results))
