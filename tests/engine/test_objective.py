"""A latency objective against a stand-in model server (`support.timed_model`) whose batches
take 20 ms + 4 ms per item: batches sized to keep it, and early refusals of what cannot. On
virtual time (`support.virtual_time`), so that the engine's decisions are measured, not the
host's timers."""

from __future__ import annotations

import asyncio
import functools
import random

import pytest
from support.timed_model import KEY, Served, TimedModel, now, running
from support.virtual_time import EXACT_S, on_virtual_time

from carpool.engine.errors import Late
from carpool.engine.objective import CALIBRATED_SHARE, Lateness

OBJECTIVE_MS = 200


async def teach(served: Served, batches: int = 6) -> None:
    """A few batches of 1 and 4 items, so the engine learns the model's batch times."""
    for index in range(batches):
        at = now()
        size = 1 if index % 2 else 4
        await asyncio.gather(*(served.batcher.submit([at], KEY, at + 30) for _ in range(size)))


async def poisson(
    served: Served, rate: float, seconds: float, seed: int = 7, priority: int = 0
) -> tuple[list[float], list[tuple[Late, float]]]:
    """Open-loop arrivals at `rate` per second: the latencies of answered requests, and the
    refusals with how long each took."""
    chance = random.Random(seed)
    answered: list[float] = []
    refused: list[tuple[Late, float]] = []

    async def call() -> None:
        started = now()
        try:
            await served.batcher.submit([started], KEY, started + 30, priority=priority)
        except Late as error:
            refused.append((error, now() - started))
        else:
            answered.append(now() - started)

    calls = []
    due = now()
    end = due + seconds
    while due < end:
        calls.append(asyncio.create_task(call()))
        due += chance.expovariate(rate)
        await asyncio.sleep(max(0.0, due - now()))
    await asyncio.gather(*calls)
    return answered, refused


def within(latencies: list[float], objective_ms: float) -> float:
    return sum(latency <= objective_ms / 1000 for latency in latencies) / len(latencies)


@pytest.mark.parametrize("objective_ms", [0, 400])
@on_virtual_time
async def test_overload_is_refused_at_once_and_the_rest_answered_in_time(
    objective_ms: int,
) -> None:
    """At 1.5 times what the model can serve, without an objective the queue grows and few
    requests are answered within 400 ms; with it, the answered ones are, and the others are
    refused at arrival with a Retry-After."""
    model = TimedModel(fixed_s=0.040, per_item_s=0.008)
    async with running(model, latency_objective_ms=objective_ms) as served:
        await teach(served)
        # Batches of 20 (200 ms) keep 400 ms: 100 items/s.
        answered, refused = await poisson(served, 150, 2.0)
    if not objective_ms:
        assert not refused
        assert within(answered, 400) < 0.6
        return
    assert within(answered, objective_ms) == 1.0, sorted(answered)[-20:]
    assert len(refused) >= 0.15 * (len(answered) + len(refused))
    assert all(error.status == 429 for error, _ in refused)
    assert all(int(error.headers["Retry-After"]) >= 1 for error, _ in refused)
    assert {error.rejected_reason for error, _ in refused} == {"objective"}
    assert max(seconds for _, seconds in refused) < EXACT_S


@on_virtual_time
async def test_batches_are_sized_so_a_waiting_request_keeps_the_objective() -> None:
    """With 100 ms, a request that waits for a batch and runs in the next keeps it when each
    takes 50 ms at most: 7 items (48 ms), not the 32 maxBatchSize allows."""
    model = TimedModel()
    async with running(model, latency_objective_ms=100) as served:
        await teach(served)
        learned = len(model.sizes)
        await poisson(served, 300, 1.0)
    sizes = model.sizes[learned:]
    assert max(sizes) == 7 and sorted(sizes)[len(sizes) // 2] == 7, sizes


@on_virtual_time
async def test_nothing_is_refused_before_batch_times_are_learned() -> None:
    model = TimedModel()
    async with running(model, latency_objective_ms=1) as served:
        at = now()
        # The first batch teaches the model's time: nothing to predict with before it.
        first = [served.batcher.submit([at], KEY, at + 30) for _ in range(8)]
        assert len(await asyncio.gather(*first)) == 8
        with pytest.raises(Late) as refused:
            await served.batcher.submit([at], KEY, now() + 30)
    assert refused.value.rejected_reason == "objective"


@on_virtual_time
async def test_a_request_that_cannot_meet_its_own_deadline_is_refused_at_once() -> None:
    model = TimedModel()
    async with running(model, latency_objective_ms=OBJECTIVE_MS) as served:
        await teach(served)
        started = now()
        # The model takes 24 ms for one item.
        with pytest.raises(Late) as refused:
            await served.batcher.submit([started], KEY, started + 0.010)
        assert now() - started < EXACT_S
        at = now()
        assert await served.batcher.submit([at], KEY, at + 0.100) == [at]
    assert refused.value.rejected_reason == "cannot_meet_deadline"
    assert "its deadline" in refused.value.message


# Batches of 10 take 60 ms, one at a time: answers at 60, 120, 180, 240, 300 ms ...
TEN_AT_A_TIME = {"max_batch_size": 10, "max_inflight_batches": 1, "latency_objective_ms": 270}


async def outcome(served: Served, priority: int, read_s: float = 0.0) -> str:
    """ "answered", or the reason the request was refused early; `read_s`: how long before
    it was queued it reached the front."""
    at = now()
    try:
        await served.batcher.submit([at], KEY, at + 30, priority=priority, arrived_at=at - read_s)
    except Late as error:
        assert error.rejected_reason is not None
        return error.rejected_reason
    return "answered"


@on_virtual_time
async def test_high_priority_displaces_low_priority_never_the_reverse() -> None:
    model = TimedModel()
    async with running(model, **TEN_AT_A_TIME) as served:
        await teach(served)
        call = functools.partial(outcome, served)

        # Three batches of low-priority requests, in time ...
        low = [asyncio.create_task(call(0)) for _ in range(30)]
        await asyncio.sleep(0)
        # ... then two batches of high-priority ones go ahead of the last two of them, which
        # the second pushes from 180 ms to 300; after them, low-priority ones again.
        high = [asyncio.create_task(call(5)) for _ in range(20)]
        await asyncio.sleep(0)
        late_low = [asyncio.create_task(call(0)) for _ in range(10)]
        low_outcomes = await asyncio.gather(*low)
        high_outcomes = await asyncio.gather(*high)
        late_outcomes = await asyncio.gather(*late_low)
    # The high-priority requests took the queued low-priority ones' places; those pushed past
    # the objective were refused at once rather than answered too late.
    assert high_outcomes == ["answered"] * 20
    assert low_outcomes[:10] == ["answered"] * 10
    assert low_outcomes[20:] == ["displaced"] * 10
    # Low-priority arrivals never push high-priority requests out: they are refused.
    assert late_outcomes == ["objective"] * 10


@on_virtual_time
async def test_a_displaced_requests_objective_counts_from_its_arrival_at_the_front() -> None:
    model = TimedModel()
    async with running(model, **TEN_AT_A_TIME) as served:
        await teach(served)
        # Read for 120 ms before they were queued: the second ten are predicted at 240 ms
        # after arrival, within 270 ...
        low = [asyncio.create_task(outcome(served, 0, read_s=0.120)) for _ in range(20)]
        await asyncio.sleep(0)
        # ... until ten of higher priority go ahead of them: 300 ms after arrival (180 after
        # they were queued, which alone would keep the objective).
        high = [asyncio.create_task(outcome(served, 1)) for _ in range(10)]
        low_outcomes = await asyncio.gather(*low)
        high_outcomes = await asyncio.gather(*high)
    assert high_outcomes == ["answered"] * 10
    assert low_outcomes == ["answered"] * 10 + ["displaced"] * 10


@on_virtual_time
async def test_a_request_counts_only_the_levels_served_before_its_own() -> None:
    """Priority 1 is Triton's highest level and 0 the default, served last: a level-1
    request is predicted behind level-1 requests alone, whatever waits at lower levels."""
    model = TimedModel()
    async with running(model, **TEN_AT_A_TIME) as served:
        await teach(served)
        call = functools.partial(outcome, served)

        # Default-level requests fill the queue up to the objective, and more are refused ...
        crowd = [asyncio.create_task(call(0)) for _ in range(60)]
        await asyncio.sleep(0)
        # ... while level-1 ones, served first, see an empty queue ahead of them.
        first = [asyncio.create_task(call(1)) for _ in range(10)]
        first_outcomes = await asyncio.gather(*first)
        crowd_outcomes = await asyncio.gather(*crowd)
    assert "objective" in crowd_outcomes
    assert first_outcomes == ["answered"] * 10


@on_virtual_time
async def test_the_drain_gauge_predicts_the_queue_and_falls_to_zero() -> None:
    model = TimedModel()
    async with running(model, max_inflight_batches=1) as served:
        await teach(served)
        at = now()
        calls = [asyncio.create_task(served.batcher.submit([at], KEY, at + 30)) for _ in range(64)]
        await asyncio.sleep(0.001)
        sample = served.registry.get_sample_value
        # Two batches of 32 (148 ms each), one of them running: between one and three.
        predicted = sample("carpool_queue_drain_seconds", {"model": "m"})
        assert predicted is not None and 0.15 < predicted < 0.45
        await asyncio.gather(*calls)
        await asyncio.sleep(0.01)
        assert sample("carpool_queue_drain_seconds", {"model": "m"}) == 0


@on_virtual_time
async def test_the_drain_gauge_sees_a_burst_that_comes_just_after_a_lone_answer() -> None:
    """The gauge the autoscaler reads: a burst right after the queue emptied shows at once,
    not a batch later (its 50 ms pacing starts when work starts, not when it ended)."""
    model = TimedModel()
    async with running(model, max_inflight_batches=1) as served:
        await teach(served)
        await asyncio.sleep(0.2)
        at = now()
        await served.batcher.submit([at], KEY, at + 30)  # a lone request, then a burst
        at = now()
        calls = [asyncio.create_task(served.batcher.submit([at], KEY, at + 30)) for _ in range(64)]
        await asyncio.sleep(0.005)
        predicted = served.registry.get_sample_value("carpool_queue_drain_seconds", {"model": "m"})
        await asyncio.gather(*calls)
    assert predicted is not None and predicted > 0.1


def test_the_margin_settles_where_the_calibrated_share_of_answers_is_in_time() -> None:
    """Answers late by 0 to 100 ms, evenly: the margin is near the share's quantile (98 ms
    for 98 %), and follows a machine that turns faster."""
    lateness = Lateness()
    chance = random.Random(3)
    clock = 0.0
    for _ in range(2_000):
        clock += 0.002
        lateness.add(chance.uniform(0.0, 0.100), clock)
    assert lateness.seconds(clock, 1.0) == pytest.approx(0.1 * CALIBRATED_SHARE, abs=0.005)
    for _ in range(2_000):
        clock += 0.002
        lateness.add(chance.uniform(0.0, 0.010), clock)
    assert lateness.seconds(clock, 1.0) == pytest.approx(0.01 * CALIBRATED_SHARE, abs=0.001)
    # An overloaded machine's answers, seconds late, raise it no further than its bound.
    for _ in range(100):
        clock += 0.002
        lateness.add(5.0, clock)
    assert lateness.seconds(clock, 0.1) == 0.1


def test_one_late_answer_among_few_raises_no_margin_and_two_do() -> None:
    """At 10 answers a second, one answer 100 ms late (a collection pause) is an outlier:
    refusing every request for the next second on its word would be wrong. A second one
    says the machine is late."""
    lateness = Lateness()
    clock = 0.0
    for index in range(10):
        clock += 0.1
        lateness.add(0.1 if index == 4 else 0.0, clock)
    assert lateness.seconds(clock, 1.0) == 0.0
    clock += 0.1
    lateness.add(0.1, clock)
    assert lateness.seconds(clock, 1.0) == pytest.approx(0.1)
