"""The batching engine: pure asyncio, no HTTP, no model-server client.

Callers `submit` their items and await one future. A dispatcher task (`run`) forms batches
from compatible queued items (`batch_queue`, `scheduling`), and so does a batch's task as
its answer frees the model; each batch goes to the sender in its own task, at most
`max_inflight_batches` at a time; `execution` fans the answers, or one error, back out to
the callers. The window of a forming batch opens at its first item. Its clock is
`time.monotonic`: uvloop's `loop.time()` counts whole milliseconds, and a fast device's
batch takes two or three. A test may give it another, the clock of its loop's timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Generic

from carpool.engine import execution
from carpool.engine.arrivals import Arrivals
from carpool.engine.batch_queue import BatchQueue
from carpool.engine.bounds import RequestBounds
from carpool.engine.errors import DeadlineExceeded, QueueFull, Unavailable
from carpool.engine.execution import BatchSender
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.objective import Objective
from carpool.engine.pending import AnyPart, BatchKey, ItemT, PendingRequest, ResultT
from carpool.engine.priority import rank
from carpool.engine.scheduling import Limits, Outlook, decide
from carpool.engine.settings import BatchingSettings
from carpool.engine.throughput import ThroughputWindow
from carpool.engine.timeline import ModelTimeline

# How stale carpool_queue_drain_seconds may be while work is queued or running: scrapes come
# seconds apart, and a dispatcher's loop turns thousands of times a second.
DRAIN_GAUGE_S = 0.05
# When the dispatcher looks again after it sent a batch: at once, but after a turn of the
# loop in which the batch's task writes it.
AT_ONCE = -math.inf
# How long past its last caller's deadline a batch's sender is given: uvloop's timers count
# whole milliseconds from a clock read in whole milliseconds, so two set for one time can
# fire a millisecond or two apart, and a sender that gave up first would answer 503, not 504.
SENDER_GRACE_S = 0.005


class Batcher(Generic[ItemT, ResultT]):
    """Batches of callers' items through one sender; generic over what items and results are."""

    def __init__(
        self,
        settings: BatchingSettings,
        sender: BatchSender[ItemT, ResultT],
        metrics: SidecarMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._limits = Limits(settings)
        self._sender = sender
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue = BatchQueue(metrics, self._changed, clock)
        self._throughput = ThroughputWindow()
        self._timeline = ModelTimeline()
        self._arrivals = Arrivals()
        self._objective = Objective(self._timeline, self._queue)
        self._drain_set_at = -math.inf
        self._drain_zero = True  # what carpool_queue_drain_seconds shows
        metrics.keep_objective(settings.latency_objective_s)
        # Batches at the model server. A counter rather than a semaphore: only the dispatcher
        # takes slots, and the limit (maxInflightBatches) can change live.
        self._inflight = 0
        # When the dispatcher looks again unwoken (None: only when woken).
        self._due: float | None = None
        self._seq = 0
        self._draining = False
        self._running = False  # the dispatcher runs
        self._poke_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        worker = self._timeline.worker.pooled
        metrics.read_engine(
            lambda: self._inflight,
            lambda: worker.fixed_s,
            lambda: worker.per_item_s,
            self._timeline.hop_s,
        )

    @property
    def settings(self) -> BatchingSettings:
        return self._limits.settings

    @property
    def bounds(self) -> RequestBounds:
        """What one request may hold (maxQueueItems, maxQueueBytes)."""
        return RequestBounds(self.settings.max_queue_items, self.settings.max_queue_bytes)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queued_items(self) -> int:
        return self._queue.items

    def limit_batch_size(self, model_max_batch_size: int) -> None:
        """Never send more than the model server says it takes."""
        self._limits = dataclasses.replace(self._limits, model_max_batch_size=model_max_batch_size)
        self._wake.set()

    def update(self, settings: BatchingSettings) -> None:
        """Use new batching knobs from the next batch on."""
        self._limits = dataclasses.replace(self._limits, settings=settings)
        self._metrics.keep_objective(settings.latency_objective_s)
        self._wake.set()

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained, from throughput of the last seconds."""
        return self._throughput.retry_after_s(self._queue.items, self._clock())

    async def submit(
        self,
        items: Sequence[ItemT],
        key: BatchKey,
        deadline: float,
        *,
        priority: int = 0,
        lengths: Sequence[int] | None = None,
        nbytes: int = 0,
        arrived_at: float | None = None,
    ) -> list[ResultT]:
        """Queue the items and wait for all their results, or raise the SidecarError for them.

        `priority` is a level as Triton's (`carpool.engine.priority`: 1 the highest, 0 the
        default). `deadline` is loop time, which the engine's clock agrees with to the
        millisecond (uvloop's counts whole ones); `lengths` are the items' lengths when they
        vary (for the padding metric); `nbytes` is what their data holds; `arrived_at` when
        the request reached the front, which a latency objective counts from (default: now).
        Cancelling the caller (client gone) cancels its entry; its unsent items are then never
        sent.
        """
        if self._draining:
            raise Unavailable("the sidecar is shutting down")
        queue_rank = rank(priority)
        bounds = self.bounds
        count, limit, byte_limit = len(items), bounds.max_items, bounds.max_bytes
        bounds.check_items(count)
        bounds.check_bytes(nbytes)
        if self._queue.items + count > limit or self._queue.bytes + nbytes > byte_limit:
            raise QueueFull(
                f"queue full: {self._queue.items} items ({self._queue.bytes} bytes) queued, "
                f"limits {limit} items and {byte_limit} bytes",
                self.retry_after_s(),
            )
        now = self._clock()
        if deadline <= now:
            # Reading and parsing the body took the whole deadline.
            raise DeadlineExceeded("deadline passed before the request was queued")
        # Without an objective, none of its work: this path runs for every request.
        keeping = bool(self._limits.settings.latency_objective_ms)
        predicted = None
        if keeping:
            arrived_at = now if arrived_at is None else arrived_at
            predicted = self._objective.admit(
                self._limits, count, key, queue_rank, deadline, now, arrived_at
            )
        self._seq += 1
        request: PendingRequest[ItemT, ResultT] = PendingRequest(
            items, key, queue_rank, deadline, self._loop.create_future(), now, self._seq, lengths,
            nbytes,
        )  # fmt: skip
        request.results = [None] * count
        request.arrived_at = arrived_at
        self._queue.push(request)
        if keeping:
            self._objective.displace(self._limits, request, now)
        self._arrivals.arrived(count, now)
        self._idle.clear()
        # Not sent from here: requests that arrive in one turn of the loop (a burst) share
        # the batch formed once they are all queued, in the next turn. By a callback rather
        # than the dispatcher's wake-up, which costs a task's step (at one caller, a request
        # meets an idle dispatcher every time).
        self._poke_soon()
        # A timer that cancels the future, not asyncio.timeout_at (which also reschedules a
        # timeout object): this runs for every request. A cancelled future with no new
        # cancellation of the task itself is the deadline.
        expiry = self._loop.call_at(deadline, request.future.cancel)
        task = asyncio.current_task()
        cancelling = task.cancelling() if task is not None else 0
        try:
            results = await request.future
        except asyncio.CancelledError:
            if task is None or task.cancelling() > cancelling:
                raise
            waited_ms = 1000 * (self._clock() - now)
            raise DeadlineExceeded(
                f"deadline passed after {waited_ms:.0f} ms in the sidecar's queue"
            ) from None
        finally:
            expiry.cancel()
        if predicted is not None:
            self._objective.answered(predicted, self._clock())
        return results

    async def run(self) -> None:
        """The dispatcher: runs until cancelled, then fails whatever is left with 503."""
        self._running = True
        try:
            while True:
                self._wake.clear()
                self._due = self._dispatch()
                if self._due == AT_ONCE:
                    # The batch just launched is written to the model server first.
                    await asyncio.sleep(0)
                    continue
                if self._due is None:  # no timeout to arm: at one caller, every wait
                    await self._wake.wait()
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(self._due):
                        await self._wake.wait()
        finally:
            self._running = False
            self._due = None
            await self.abort()

    def _dispatch(self) -> float | None:
        """Send a batch if one should leave now (then look again AT_ONCE, once its task has
        written it), else when to look again (None: on an event)."""
        while True:
            now = self._clock()
            limits = self._objective.limits(self._limits)
            decision = decide(
                self._queue.groups(),
                limits,
                self._inflight,
                self._draining,
                now,
                functools.partial(self._outlook, now=now),
            )
            if not isinstance(decision, tuple):
                # Nothing to send now: off the way of a batch that leaves.
                self._drain_gauge(limits, now)
                return decision
            group, reason = decision
            parts = self._queue.take(group, limits.capacity(group.key), now)
            if parts:
                self._launch(parts, reason, group.key, now)
                return AT_ONCE

    async def abort(self) -> None:
        """Refuse new requests and answer every waiting caller, queued or in a batch, 503."""
        self._draining = True
        # Queued requests first: with none left, the dispatcher starts no batch meanwhile.
        self._queue.fail_all(Unavailable("the sidecar stopped"))
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

    def _outlook(self, key: BatchKey, now: float) -> Outlook:
        timeline, arrivals = self._timeline, self._arrivals
        # Closed-loop callers due back: those answered lately, and those of the next answer.
        # (A caller counts as one item: most send one; with more, waiting pays all the more.)
        company = []
        if returning := arrivals.returning(now):
            company.append((returning, *arrivals.back(arrivals.last_answer)))
        if (upcoming := timeline.next_answer()) is not None:
            company.append((upcoming[0], *arrivals.back(upcoming[1])))
        return Outlook(
            timeline.ready_at(),
            timeline.fixed_s(key.bucket),
            arrivals.per_second(now),
            tuple(company),
        )

    def _drain_gauge(self, limits: Limits, now: float) -> None:
        """carpool_queue_drain_seconds, from this loop's thread, on an event (an arrival, an
        answer): at once when work starts or ends, at most every DRAIN_GAUGE_S between (a
        burst that follows an idle moment shows at once: the autoscaler reads it)."""
        if self._queue.items == 0 and self._inflight == 0:
            if not self._drain_zero:  # not at every idle answer: once
                self._metrics.queue_drain.set(0.0)
                self._drain_zero = True
        elif self._drain_zero or now >= self._drain_set_at + DRAIN_GAUGE_S:
            self._metrics.queue_drain.set(self._objective.drain_s(limits, now))
            self._drain_set_at = now
            self._drain_zero = False

    def _poke(self) -> None:
        """Send what may leave now from here rather than by waking the dispatcher, which
        would start it a turn of the loop later; wake it only to look again sooner than it
        will."""
        if not self._running:
            return
        due = self._dispatch()
        if due == AT_ONCE:
            self._poke_soon()  # for more, once the batch sent here is written
        elif due is not None and (self._due is None or due < self._due):
            self._wake.set()

    def _poke_soon(self) -> None:
        """`_poke` in the next turn of the loop (once, however often asked meanwhile)."""
        if not self._poke_scheduled:
            self._poke_scheduled = True
            self._loop.call_soon(self._poked)

    def _poked(self) -> None:
        self._poke_scheduled = False
        self._poke()

    def _changed(self) -> None:
        self._note_idle()
        self._wake.set()

    def _note_idle(self) -> None:
        if self._queue.items == 0 and self._inflight == 0:
            self._idle.set()

    def _launch(self, parts: list[AnyPart], reason: str, key: BatchKey, taken_at: float) -> None:
        items = execution.batch_items(parts)
        self._inflight += 1
        token = self._timeline.sent(len(items), key.bucket, self._clock())
        task = asyncio.create_task(self._run_batch(parts, items, token))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Counted once the task has sent the batch (this callback runs after its first
        # step), while the model runs it: not on the batch's way there.
        self._loop.call_soon(self._count_sent, parts, reason, key, len(items), taken_at)

    def _count_sent(
        self, parts: list[AnyPart], reason: str, key: BatchKey, size: int, taken_at: float
    ) -> None:
        self._metrics.batch_sent(reason, size)
        for part in parts:
            if part.start == 0:  # the request's first batch: its wait in the queue ends
                self._metrics.queue_wait.observe(taken_at - part.request.enqueued_at)
        if key.bucket is not None and (ratio := execution.padding_ratio(parts)) is not None:
            self._metrics.padding_ratio.observe(ratio)

    async def _run_batch(self, parts: list[AnyPart], items: list[ItemT], token: int) -> None:
        started = self._clock()
        # Deadlines are loop time, whose timers the sender's timeout runs on: measured on that
        # clock, the batch gives up after its last caller, who hears 504, not 503.
        last_deadline = max(part.request.deadline for part in parts)
        timeout_s = last_deadline + SENDER_GRACE_S - self._loop.time()
        answer = None
        finished = None
        try:
            answer = await execution.execute(self._sender, parts, items, timeout_s)
            finished = self._clock()
            if answer is not None:
                # Only answered batches tell how fast the queue drains (for Retry-After).
                self._throughput.record(started, finished, len(items))
                done = sum(part.stop == len(part.request.items) for part in parts)
                self._arrivals.answered(done, finished)
                if not self._queue.items:
                    # No one waits for the model: the callers' answers go out before what
                    # follows is learned (at one caller, every batch), which is timed
                    # without the callers' turn.
                    await asyncio.sleep(0)
        finally:
            if finished is None:  # cancelled
                finished = self._clock()
            timing = answer[1] if answer is not None else None
            self._timeline.answered(token, finished, timing, learn=answer is not None)
            self._arrivals.pace(self._timeline.worker.pooled.predict(len(items)))
            self._metrics.model_duration.observe(finished - started)
            self._inflight -= 1
            self._note_idle()
            self._poke()
