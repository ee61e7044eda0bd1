"""A latency objective (latencyObjectiveMs): batches that keep it, and refusing what cannot.

The timeline knows how long a batch of b items takes, d(b) = fixed + per_item * b, and when
the worker will be done with the batches it runs. Under load a request waits for the batch
running when it arrives and then runs in the next one, so batches are held to the largest b
with hop + 2 d(b) within the objective (at least one item, at most maxBatchSize), and a
forming batch waits for company no longer than the objective leaves beside those two batches.

A request is predicted its answer on arrival: the worker's free time, then the queued items
of its priority and above and its own, in batches of that size, one after another, as the
worker runs them; its own batch as full as the items admitted lately will make it by the
time it starts (later arrivals join it, and its answer waits for theirs), and later by how
much answers have lately come later than predicted (`Lateness`). Predicted past the
objective or its own deadline, it is refused at once (429, its Retry-After when what is
ahead of it has likely drained) rather than left to wait and fail. A request of higher
priority goes ahead of queued lower-priority ones; those it pushes past their objective are
refused as well (`displaced`), while a lower-priority arrival never delays a higher-priority
request. Until the timeline has learned batch times, nothing is predicted and nothing
refused.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
from collections import deque

from carpool.engine.batch_queue import BatchQueue
from carpool.engine.errors import LATE_REASONS, Late
from carpool.engine.pending import AnyRequest, BatchKey
from carpool.engine.scheduling import Limits
from carpool.engine.throughput import MAX_RETRY_AFTER_S
from carpool.engine.timeline import ModelTimeline

OBJECTIVE, DEADLINE, DISPLACED = LATE_REASONS
# The key of items whose own is unknown: the queue as a whole (any length bucket).
ANY = BatchKey(None)
# The span the rate of admitted items is averaged over (exponentially).
RATE_HORIZON_S = 1.0
# Predictions are held to answer this share of admitted requests in time: they are medians
# of batch times, and a loaded machine's timers fire late.
CALIBRATED_SHARE = 0.98
# How long an answer counts in the lateness margin: a late spell is forgotten this long after
# it ends, whether answers come on time or none come (everything refused).
LATENESS_HORIZON_S = 1.0
# The most answers it remembers (the newest): what bounds its work under a high rate.
LATENESS_ANSWERS = 1024
# Fewer answers than this (1 / (1 - CALIBRATED_SHARE)) say too little for the quantile: it is
# taken as if the rest had come on time, so one late answer among few (a collection pause, a
# shape's first run) raises no margin, and two do.
CONFIDENT_ANSWERS = round(1 / (1 - CALIBRATED_SHARE))
# The largest margin, as a share of the objective: answers later than this say the machine
# is overloaded, not the model (an event loop seconds behind), and a margin past the
# objective would refuse everything until the late answers are forgotten.
MAX_MARGIN = 0.5


class RecentRate:
    """Items per second of late, averaged exponentially over RATE_HORIZON_S; over the time
    since the first, until that is longer (a load that has just begun reads as what it is)."""

    def __init__(self) -> None:
        self._weight = 0.0  # items, each weighted by exp(-age / RATE_HORIZON_S), as of `_at`
        self._at = 0.0
        self._since: float | None = None

    def add(self, items: int, now: float) -> None:
        self._weight = self._weight * self._decay(now) + items
        self._at = now
        if self._since is None:
            self._since = now

    def per_second(self, now: float) -> float:
        if self._since is None:
            return 0.0
        span = RATE_HORIZON_S * -math.expm1(-max(now - self._since, 1e-3) / RATE_HORIZON_S)
        return self._weight * self._decay(now) / span

    def _decay(self, now: float) -> float:
        return math.exp(-(now - self._at) / RATE_HORIZON_S)


class Lateness:
    """How much later than predicted answers come: the CALIBRATED_SHARE quantile of the
    answers of the last LATENESS_HORIZON_S (at most LATENESS_ANSWERS of them; fewer than
    CONFIDENT_ANSWERS counted with on-time ones), held from 0 to `most_s`."""

    def __init__(self) -> None:
        self._answers: deque[tuple[float, float]] = deque()  # (answered at, late by), in order
        self._ordered: list[float] = []  # the same lateness, sorted

    def add(self, late_s: float, now: float) -> None:
        self._answers.append((now, late_s))
        bisect.insort(self._ordered, late_s)
        self._forget(now)

    def seconds(self, now: float, most_s: float) -> float:
        self._forget(now)
        ordered = self._ordered
        count = len(ordered)
        counted = max(count, CONFIDENT_ANSWERS)
        index = math.ceil(CALIBRATED_SHARE * counted) - 1 - (counted - count)
        if index < 0:
            return 0.0
        return min(max(ordered[index], 0.0), most_s)

    def _forget(self, now: float) -> None:
        answers, since = self._answers, now - LATENESS_HORIZON_S
        while answers and (answers[0][0] <= since or len(answers) > LATENESS_ANSWERS):
            _, late_s = answers.popleft()
            del self._ordered[bisect.bisect_left(self._ordered, late_s)]


class Objective:
    def __init__(self, timeline: ModelTimeline, queue: BatchQueue) -> None:
        self._timeline = timeline
        self._queue = queue
        self._objective_s = 0.0
        # The limits last derived, and what they were derived from.
        self._derived: tuple[tuple[object, ...], Limits] | None = None
        self._admitted = RecentRate()  # items: they fill the batches ahead
        self._lateness = Lateness()

    def limits(self, base: Limits) -> Limits:
        """`base` held to the objective; `base` itself without one or before anything is
        learned."""
        objective_s = base.settings.latency_objective_s
        timeline = self._timeline
        if not objective_s or not timeline.known:
            return base
        self._objective_s = objective_s
        fit = timeline.worker.pooled
        basis = (base, fit.fixed_s, fit.per_item_s, timeline.hop_s())
        if self._derived is not None and self._derived[0] == basis:
            return self._derived[1]
        ceiled = dataclasses.replace(base, ceiling=self._ceiling)
        # The forming batch's wait, on top of the batch ahead of it and its own.
        batch_s = fit.predict(ceiled.capacity(ANY))
        room_ms = 1000 * max(0.0, objective_s - timeline.hop_s() - 2 * batch_s)
        if room_ms < base.settings.max_wait_ms:
            ceiled = dataclasses.replace(
                ceiled, settings=dataclasses.replace(base.settings, max_wait_ms=room_ms)
            )
        self._derived = (basis, ceiled)
        return ceiled

    def admit(
        self,
        base: Limits,
        count: int,
        key: BatchKey,
        rank: int,
        deadline: float,
        now: float,
        arrived_at: float,
    ) -> float | None:
        """When `count` items of queue `rank` (`priority.rank`) arrived at `arrived_at` will
        be answered, or refuse them (Late) if that is after the objective or `deadline`;
        None without an objective or a confirmed prediction."""
        limits = self.limits(base)
        if limits is base:
            return None
        ahead = self._queue.items_from(rank)
        answer_at = self._answer_at(limits, ahead + count, key, now)
        due = arrived_at + self._objective_s
        margin_s = self._lateness.seconds(now, MAX_MARGIN * self._objective_s)
        if answer_at + margin_s <= min(due, deadline):
            self._admitted.add(count, now)
            # A line on lone samples is no prediction to learn the margin from.
            return answer_at if self._timeline.worker.pooled.confirmed else None
        reason, what = (OBJECTIVE, "the latency objective") if due <= deadline else (
            DEADLINE, "its deadline"
        )  # fmt: skip
        raise Late(
            f"refused: predicted to be answered {1000 * (answer_at - arrived_at):.0f} ms after "
            f"arrival, after {what} ({1000 * (min(due, deadline) - arrived_at):.0f} ms)",
            self._retry_after_s(limits, ahead, key, now),
            reason,
        )

    def answered(self, predicted: float, now: float) -> None:
        """An admitted request was answered `now`, predicted at `predicted`."""
        self._lateness.add(now - predicted, now)

    def displace(self, base: Limits, arrived: AnyRequest, now: float) -> None:
        """Refuse the queued requests of lower priority than `arrived` that it pushes past
        their objective or deadline; those that would miss anyway are left as they are."""
        if self._queue.items == self._queue.items_from(arrived.priority):
            return  # nothing queued below it (every default-level arrival): before the limits
        limits = self.limits(base)
        if limits is base:
            return
        behind = sorted(
            (
                request
                for group in self._queue.groups()
                for _, _, request in group.heap
                if request.priority < arrived.priority and request.sent == 0 and request.queued
            ),
            key=lambda request: (-request.priority, request.seq),
        )
        ahead = self._queue.items_from(arrived.priority)
        pushed = len(arrived.items)
        for request in behind:
            arrived_at = request.enqueued_at if request.arrived_at is None else request.arrived_at
            due = min(request.deadline, arrived_at + self._objective_s)
            answer_at = self._answer_at(limits, ahead + request.unsent, request.key, now)
            if (
                answer_at
                > due
                >= self._answer_at(limits, ahead - pushed + request.unsent, request.key, now)
            ):
                request.fail(
                    Late(
                        f"refused: a request of higher priority pushed its predicted answer "
                        f"to {1000 * (answer_at - arrived_at):.0f} ms after arrival",
                        self._retry_after_s(limits, ahead, request.key, now),
                        DISPLACED,
                    )
                )
                continue
            ahead += request.unsent

    def drain_s(self, limits: Limits, now: float) -> float:
        """How long the model is predicted to take for what runs and what is queued, in
        batches of `limits` (held to the objective); 0 until batch times are learned."""
        if not self._timeline.known:
            return 0.0
        return max(0.0, self._answer_at(limits, self._queue.items, ANY, now) - now)

    def _retry_after_s(self, limits: Limits, items: int, key: BatchKey, now: float) -> int:
        drain_s = self._answer_at(limits, items, key, now) - now
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(drain_s)))

    def _answer_at(self, limits: Limits, items: int, key: BatchKey, now: float) -> float:
        """When the last of `items` queued items would be answered, run in the largest
        batches the limits allow after the running ones; with none, when the worker is free."""
        timeline = self._timeline
        half_hop = timeline.hop_s() / 2
        free = max(timeline.worker_free_at(), now + half_hop)
        if not items:
            return max(timeline.worker_free_at(), now)
        size = limits.capacity(key)
        full, rest = divmod(items, size)
        busy = full * timeline.worker.predict(size, key.bucket)
        if rest:
            joining = self._admitted.per_second(now) * (free + busy - now)
            busy += timeline.worker.predict(min(size, math.ceil(rest + joining)), key.bucket)
        return free + busy + half_hop

    def _ceiling(self, key: BatchKey) -> int:
        """The largest batch of the key that a request waiting for one like it still
        finishes within the objective."""
        timeline = self._timeline
        fit = timeline.worker.fit(None, key.bucket)
        if fit.per_item_s <= 0:
            return sys.maxsize  # a larger batch takes no longer
        budget_s = (self._objective_s - timeline.hop_s()) / 2 - fit.fixed_s
        return max(1, min(sys.maxsize, math.floor(budget_s / fit.per_item_s)))
