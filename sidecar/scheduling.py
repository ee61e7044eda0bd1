"""When the dispatcher sends a batch, from which group, and how large it may be.

Adaptive dispatch: while no batch is in flight the model server is idle, so whatever is
queued goes at once (reason `idle`); while one runs, the next batch waits until it is full
or `max_wait` has passed since its first item (`full`, `timeout`). Fixed dispatch always
waits. On shutdown every queued item is sent as fast as slots free up (`drain`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from carpool.sidecar.batch_queue import Group
from carpool.sidecar.config import BatchingSettings
from carpool.sidecar.pending import BatchKey


@dataclass(frozen=True, slots=True)
class Limits:
    settings: BatchingSettings
    # The model server's own largest batch, once its metadata is known.
    model_max_batch_size: int | None = None

    def capacity(self, key: BatchKey) -> int:
        settings = self.settings
        limit = settings.max_batch_size
        if self.model_max_batch_size:
            limit = min(limit, self.model_max_batch_size)
        if key.bucket is None or not settings.max_batch_tokens:
            return limit
        # Every item of the group pads to at most its bucket length.
        return max(1, min(limit, settings.max_batch_tokens // key.bucket))


def decide(
    groups: Iterable[Group], limits: Limits, inflight: int, draining: bool, now: float
) -> tuple[Group, str] | float | None:
    """The group to send now and why, else when to look again (None: on the next event)."""
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
    ranked.sort(key=lambda pair: pair[0])
    due = math.inf
    for _, group in ranked:
        if group.items >= limits.capacity(group.key):
            return group, "full"
        closes_at = group.opened_at() + settings.max_wait_s
        if now >= closes_at:
            return group, "timeout"
        due = min(due, closes_at)
    first = ranked[0][1]
    if draining:
        return first, "drain"
    if settings.dispatch == "adaptive" and inflight == 0:
        return first, "idle"
    return due
