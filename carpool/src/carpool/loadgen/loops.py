"""Closed and open load loops, in plain asyncio and independent of HTTP.

A loop calls `send(index)` and records when the request was due, how long it took and the
status it got. Both loops are bounded by a duration, a request count, or both.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# send(index) -> HTTP status, or 0 when no response came back (connection error, timeout).
Send = Callable[[int], Awaitable[int]]
# Called after each completed request with the number completed so far.
OnDone = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished request: seconds after the loop started that it was due, and its latency."""

    due: float
    latency: float
    status: int


@dataclass(frozen=True, slots=True)
class LoopResult:
    outcomes: list[Outcome]
    # From the loop's start to its last completion: the denominator of throughput.
    wall_seconds: float


def _check_bounds(duration: float | None, requests: int | None) -> None:
    if duration is None and requests is None:
        raise ValueError("a loop needs a duration, a request count, or both")
    if duration is not None and duration <= 0:
        raise ValueError(f"duration must be positive, got {duration}")
    if requests is not None and requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")


def _ignore(done: int) -> None:
    del done


async def closed_loop(
    send: Send,
    concurrency: int,
    *,
    duration: float | None = None,
    requests: int | None = None,
    on_done: OnDone = _ignore,
) -> LoopResult:
    """`concurrency` workers, each sending its next request as soon as the previous returns.

    No request starts after the duration has passed; those in flight then are awaited.
    """
    _check_bounds(duration, requests)
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    outcomes: list[Outcome] = []
    started = time.monotonic()
    deadline = math.inf if duration is None else started + duration
    limit = math.inf if requests is None else requests
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < limit:
            begin = time.monotonic()
            if begin >= deadline:
                return
            index = issued
            issued += 1
            status = await send(index)
            end = time.monotonic()
            outcomes.append(Outcome(begin - started, end - begin, status))
            on_done(len(outcomes))

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return LoopResult(outcomes, time.monotonic() - started)


def poisson_arrivals(
    rate: float,
    rng: random.Random,
    *,
    duration: float | None = None,
    requests: int | None = None,
) -> list[float]:
    """Arrival times (seconds from start) of a Poisson process of `rate` per second.

    Gaps are exponential with mean 1/rate; the schedule stops at the duration or count.
    """
    _check_bounds(duration, requests)
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    horizon = math.inf if duration is None else duration
    limit = math.inf if requests is None else requests
    arrivals: list[float] = []
    now = rng.expovariate(rate)
    while now < horizon and len(arrivals) < limit:
        arrivals.append(now)
        now += rng.expovariate(rate)
    return arrivals


async def open_loop(
    send: Send,
    arrivals: list[float],
    *,
    on_done: OnDone = _ignore,
) -> LoopResult:
    """Send one request at each arrival time, whether or not earlier ones have returned.

    Latency counts from the time a request was due, not when it left, so a server (or a
    load generator) that falls behind shows up in the figures instead of hiding in them.
    """
    outcomes: list[Outcome] = []
    started = time.monotonic()

    async def one(index: int, due: float) -> None:
        status = await send(index)
        end = time.monotonic()
        outcomes.append(Outcome(due, end - (started + due), status))
        on_done(len(outcomes))

    async with asyncio.TaskGroup() as group:
        for index, due in enumerate(arrivals):
            delay = started + due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(one(index, due))
    return LoopResult(outcomes, time.monotonic() - started)
