"""The engine's queue: waiting requests grouped by BatchKey, and taking a batch from a group."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from carpool.engine.errors import DeadlineExceeded
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.pending import AnyPart, AnyRequest, BatchKey, Part
from carpool.engine.priority import DEFAULT_RANK


@dataclass(slots=True, eq=False)
class Group:
    """Queued requests with one BatchKey, highest priority first, FIFO within a level.

    Finished requests (cancelled, expired) leave lazily: from the front of `heap` and
    `arrivals` as they reach it, and all at once when the group's entries outnumber twice
    its waiting items; a group left with no waiting item is dropped whole.
    """

    key: BatchKey
    heap: list[tuple[int, int, AnyRequest]] = field(default_factory=list)
    # The same requests in arrival order: the oldest opens the batch window.
    arrivals: deque[AnyRequest] = field(default_factory=deque)
    items: int = 0  # unsent items of requests still waiting

    def push(self, request: AnyRequest) -> None:
        heapq.heappush(self.heap, (-request.priority, request.seq, request))
        self.arrivals.append(request)
        self.items += len(request.items)

    def head(self) -> AnyRequest | None:
        """The next request to serve, dropping finished (cancelled, expired) ones on the way."""
        while self.heap:
            request = self.heap[0][2]
            if not request.future.done():
                return request
            heapq.heappop(self.heap)
        return None

    def opened_at(self) -> float:
        """Enqueue time of the oldest request with items to send; O(1) amortised."""
        while self.arrivals and not self.arrivals[0].queued:
            self.arrivals.popleft()
        return self.arrivals[0].enqueued_at if self.arrivals else math.inf

    def compact(self) -> None:
        """Drop finished requests once they are the majority, so their bodies are freed
        without waiting for the queue to reach them; the rebuild costs O(1) per finish."""
        if len(self.heap) > 2 * self.items:
            self.heap = [entry for entry in self.heap if entry[2].queued]
            heapq.heapify(self.heap)
            self.arrivals = deque(request for request in self.arrivals if request.queued)


class BatchQueue:
    """Every queued request, by group; `on_change` hears when a request leaves with items unsent;
    `clock` is the engine's."""

    def __init__(
        self, metrics: SidecarMetrics, on_change: Callable[[], None], clock: Callable[[], float]
    ) -> None:
        self._metrics = metrics
        self._on_change = on_change
        self._clock = clock
        self._groups: dict[BatchKey, Group] = {}
        self.items = 0  # unsent items of waiting requests, across groups
        self.bytes = 0  # data of requests with unsent items, across groups
        # Unsent items by queue rank, across groups, but for the default level's (most
        # requests'): those are the rest of `items`.
        self._by_priority: dict[int, int] = {}
        # Read when scraped: setting it (a lock) on every push and take cost more.
        metrics.queue_items.set_function(lambda: self.items)

    def groups(self) -> Iterator[Group]:
        """The groups with a request still waiting."""
        return (group for group in self._groups.values() if group.items)

    def items_from(self, rank: int) -> int:
        """Unsent items of this queue rank and above: those served before one of it."""
        ranks = self._by_priority
        above = sum(items for level, items in ranks.items() if level >= rank)
        return above + (self.items - sum(ranks.values()) if rank <= DEFAULT_RANK else 0)

    def push(self, request: AnyRequest) -> None:
        group = self._groups.get(request.key)
        if group is None:
            group = self._groups[request.key] = Group(request.key)
        group.push(request)
        self._count(len(request.items), request.priority)
        self.bytes += request.queued_bytes
        request.future.add_done_callback(lambda _: self._forget(request, group))

    def take(self, group: Group, room: int, now: float) -> list[AnyPart]:
        """Remove up to `room` items from the group, best first (the batcher counts the
        queue wait of each request's first part)."""
        parts: list[AnyPart] = []
        while room and (request := group.head()) is not None:
            if request.deadline <= now:
                # Not worth the model's time: its caller is answered 504 now.
                request.fail(DeadlineExceeded("deadline passed in the queue"))
                continue
            count = min(room, request.unsent)
            parts.append(Part(request, request.sent, request.sent + count))
            request.sent += count
            group.items -= count
            room -= count
            self._count(-count, request.priority)
            if request.unsent == 0:
                heapq.heappop(group.heap)
                self._release(request)
        if group.items <= 0:
            del self._groups[group.key]
        return parts

    def fail_all(self, error: Exception) -> None:
        for group in self._groups.values():
            for _, _, request in group.heap:
                request.fail(error)
        self._groups.clear()

    def _count(self, change: int, priority: int) -> None:
        self.items += change
        if priority != DEFAULT_RANK:
            left = self._by_priority.get(priority, 0) + change
            if left:
                self._by_priority[priority] = left
            else:
                del self._by_priority[priority]

    def _release(self, request: AnyRequest) -> None:
        """Its bytes no longer count against maxQueueBytes; once, however it leaves."""
        self.bytes -= request.queued_bytes
        request.queued_bytes = 0

    def _forget(self, request: AnyRequest, group: Group) -> None:
        """A finished request gives back the queue room of items it never sent; a group
        left without waiting requests goes, with whatever it still holds."""
        if request.sent == 0:
            # Left the queue unsent (expired, cancelled, shut down): its wait shows overload.
            self._metrics.queue_wait.observe(self._clock() - request.enqueued_at)
        self._release(request)
        unsent = request.unsent
        request.sent = len(request.items)
        if unsent:
            group.items -= unsent
            self._count(-unsent, request.priority)
            if self._groups.get(group.key) is group:
                if group.items <= 0:
                    del self._groups[group.key]
                else:
                    group.compact()
            self._on_change()
