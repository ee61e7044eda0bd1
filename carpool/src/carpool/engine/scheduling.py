"""When the dispatcher sends a batch, from which group, and how large it may be.

Timed dispatch: a batch leaves when the model server can start it, as full as
the wait allows then. While batches run, the next one keeps filling until the running ones
are predicted to finish, less the hop (`model_ready`); with the model server idle it goes at
once (`idle`) unless the items arriving meanwhile make a fuller batch pay for the wait, which
then ends when the batch is full or `max_wait` after the model could start it (`timeout`).
Groups go in the order of their oldest items: a younger group that is full waits its turn,
so that a rare length bucket is not starved by a common one. Until the durations are
learned it acts as adaptive dispatch.
Adaptive dispatch: while no batch is in flight the model server is idle, so whatever is
queued goes at once (`idle`); while one runs, the next batch waits until it is full or
`max_wait` has passed since its first item (`full`, `timeout`). Fixed dispatch always
waits. On shutdown every queued item is sent as fast as slots free up (`drain`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from carpool.engine.batch_queue import Group
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings


@dataclass(frozen=True, slots=True)
class Limits:
    settings: BatchingSettings
    # The model server's own largest batch, once its metadata is known.
    model_max_batch_size: int | None = None
    # The largest batch of a key that keeps a latency objective (`objective`), if one is set.
    ceiling: Callable[[BatchKey], int] | None = None

    def capacity(self, key: BatchKey) -> int:
        settings = self.settings
        limit = settings.max_batch_size
        if self.model_max_batch_size:
            limit = min(limit, self.model_max_batch_size)
        if self.ceiling is not None:
            limit = min(limit, self.ceiling(key))
        if key.bucket is None or not settings.max_batch_tokens:
            return limit
        # Every item of the group pads to at most its bucket length.
        return max(1, min(limit, settings.max_batch_tokens // key.bucket))


@dataclass(frozen=True, slots=True)
class Outlook:
    """What timed dispatch has learned of the model server and the callers."""

    # When the model server can take the next batch (or could since); None: nothing learned.
    ready_at: float | None
    fixed_s: float  # what one more batch of the group's bucket costs beyond its items
    arrivals_per_s: float  # fresh items (not the returns of closed-loop callers), on average
    # Closed-loop callers expected back: (items, when, when to stop waiting for them).
    company: tuple[tuple[int, float, float], ...] = ()


def decide(
    groups: Iterable[Group],
    limits: Limits,
    inflight: int,
    draining: bool,
    now: float,
    outlook: Callable[[BatchKey], Outlook],
) -> tuple[Group, str] | float | None:
    """The group to send now and why, else when to look again (None: on the next event).

    `outlook` is what timed dispatch knows for a group's key (its length bucket)."""
    settings = limits.settings
    if inflight >= settings.max_inflight_batches:
        return None
    ranked: list[tuple[tuple[int, int], Group]] = []
    for group in groups:
        head = group.head()
        if head is not None:
            ranked.append(((-head.priority, head.seq), group))
    if not ranked:
        return None
    if len(ranked) > 1:
        ranked.sort(key=_rank)
    first = ranked[0][1]
    if settings.dispatch == "timed":
        view = outlook(first.key)
        if view.ready_at is not None:
            if first.items >= limits.capacity(first.key):
                return first, "full"
            if draining:
                return first, "drain"
            return _when_ready(first, inflight, now, view, settings.max_wait_s)
    due = math.inf
    for _, group in ranked:
        if group.items >= limits.capacity(group.key):
            return group, "full"
        closes_at = group.opened_at() + settings.max_wait_s
        if now >= closes_at:
            return group, "timeout"
        due = min(due, closes_at)
    if draining:
        return first, "drain"
    if settings.dispatch != "fixed" and inflight == 0:
        return first, "idle"
    return due


def _rank(pair: tuple[tuple[int, int], Group]) -> tuple[int, int]:
    return pair[0]


def _when_ready(
    group: Group, inflight: int, now: float, outlook: Outlook, max_wait_s: float
) -> tuple[Group, str] | float:
    ready_at = outlook.ready_at
    assert ready_at is not None
    if now < ready_at:
        # A batch sent now would only wait at the model server while items could join it.
        return ready_at
    # maxWait bounds the wait for company, not that for the model.
    closes_at = max(group.opened_at(), ready_at) + max_wait_s
    until = _company_until(group.items, now, closes_at, outlook)
    if until is not None:
        if now < until:
            return until
        if now >= closes_at > ready_at:
            return group, "timeout"  # it did wait for company
    return group, "idle" if inflight == 0 else "model_ready"


def _company_until(queued: int, now: float, closes_at: float, outlook: Outlook) -> float | None:
    """Until when waiting for the items due makes more items/s of the model than sending now;
    None if it does not.

    With d(b) = fixed + per_item * b, `arriving` items that come `wait` from now pay for the
    wait when the batch's items/s, wait included, beat those of sending now: arriving * fixed
    > queued * wait. Closed-loop callers also form the next batch while this one runs, so
    theirs must save more than the idle wait costs: wait < fixed. Items arriving at a mean
    rate (wait 1/rate per item) pay when more are due within one fixed cost than are queued
    (the ratio is monotonic in the wait, so the best wait is none or the longest allowed).
    """
    if outlook.arrivals_per_s * outlook.fixed_s > queued:
        return closes_at
    until = [
        min(give_up_at, closes_at)
        for arriving, back_at, give_up_at in outlook.company
        if back_at <= closes_at
        and now < give_up_at
        and (wait := max(back_at - now, 0.0)) < outlook.fixed_s
        and arriving * outlook.fixed_s > queued * wait
    ]
    return max(until, default=None)
