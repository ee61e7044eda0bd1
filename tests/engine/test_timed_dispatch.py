"""Timed dispatch against a stand-in model server whose batches take fixed + per-item time
(`support.timed_model`): by default 20 ms + 4 ms per item, the model on this project's CPU.
On virtual time (`support.virtual_time`), so that the engine's decisions are measured, not
the host's timers."""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest
from support.timed_model import KEY, TimedModel, closed_loop, now, running
from support.virtual_time import EXACT_S, on_virtual_time

from carpool.contract.wire import BatchTiming
from carpool.engine.batch_queue import Group
from carpool.engine.durations import DurationFit
from carpool.engine.pending import PendingRequest
from carpool.engine.scheduling import Limits, Outlook, decide
from carpool.engine.settings import BatchingSettings

FIXED_S = 0.020
PER_ITEM_S = 0.004


def mean_batch(model: TimedModel) -> float:
    # The first batches come before anything is learned.
    return statistics.mean(model.sizes[5:])


@pytest.mark.parametrize(
    "dispatch",
    ["timed", pytest.param("adaptive", marks=pytest.mark.xfail(strict=True, reason="old"))],
)
@on_virtual_time
async def test_batches_are_fuller_at_8_closed_loop_callers(dispatch: str) -> None:
    """With a batch in flight adaptive dispatch closes the next one after maxWait, and it
    only waits at the model server; timed dispatch keeps it open until the model frees."""
    model = TimedModel()
    await closed_loop(8, 1.5, model, dispatch=dispatch, max_inflight_batches=2)
    # The best a serial model can do with 8 callers is batches of 8; adaptive dispatch
    # settles into halves of 4 taking turns.
    assert mean_batch(model) >= 5.0, model.sizes


@on_virtual_time
async def test_one_caller_never_waits() -> None:
    model = TimedModel()
    latencies, registry = await closed_loop(1, 0.6, model, max_wait_ms=50)
    sent_at = [batch.sent for batch in model.ran]
    at_model = [done - sent for sent, done in zip(sent_at, model.answered_at, strict=True)]
    # No wait for company that cannot come: each request takes the model's time, no more.
    extra = [latency - spent for latency, spent in zip(latencies, at_model, strict=False)]
    assert max(extra) < EXACT_S, extra
    waited = registry.get_sample_value("carpool_queue_wait_seconds_sum", {"model": "m"})
    assert waited is not None and waited < EXACT_S


@pytest.mark.parametrize(
    "told",
    [
        BatchTiming(-0.5, -0.5),
        BatchTiming(-1.0, 0.0),
        BatchTiming(-0.2, 0.01),
        BatchTiming(math.nan, 0.01),
        BatchTiming(0.0, math.inf),
        BatchTiming(30.0, 60.0),
    ],
)
@on_virtual_time
async def test_a_lone_caller_never_waits_on_timings_that_cannot_be(told: BatchTiming) -> None:
    """A model server's timing is input: negative, infinite or longer than the round trip
    teaches nothing, and a lone caller still waits for its batch alone."""
    model = TimedModel(told=told)
    latencies, _ = await closed_loop(1, 0.6, model, max_wait_ms=50)
    at_model = [done - ran.sent for ran, done in zip(model.ran, model.answered_at, strict=True)]
    extra = [latency - spent for latency, spent in zip(latencies, at_model, strict=False)]
    assert max(extra) < EXACT_S, extra


@pytest.mark.parametrize("lanes,inflight", [(1, 1), (1, 2), (3, 3)])
@on_virtual_time
async def test_max_inflight_batches_is_honoured(lanes: int, inflight: int) -> None:
    model = TimedModel(lanes=lanes)
    await closed_loop(48, 0.8, model, max_batch_size=4, max_inflight_batches=inflight)
    # Full batches go at once: the cap, not the timing, bounds how many are out.
    assert model.most_at_server == inflight


@pytest.mark.parametrize(
    "dispatch",
    ["timed", pytest.param("adaptive", marks=pytest.mark.xfail(strict=True, reason="old"))],
)
@on_virtual_time
async def test_the_next_batch_leaves_as_the_running_one_ends_less_the_hop(dispatch: str) -> None:
    hop_s = 0.010
    model = TimedModel(hop_s=hop_s)
    async with running(model, dispatch=dispatch, max_wait_ms=0) as served:

        def call() -> asyncio.Task[list[float]]:
            at = now()
            return asyncio.create_task(served.batcher.submit([at], KEY, at + 5))

        # The first pairs teach the worker's time and the hop.
        for _ in range(5):
            first = call()
            await asyncio.sleep(0.005)
            second = call()
            await asyncio.gather(first, second)
    first_sent, second_sent = (batch.sent for batch in model.ran[-2:])
    first_answered = model.answered_at[-2]
    # When the worker is predicted to finish the first (29 ms after it left: half the hop
    # there, 24 ms of work) less half the hop (5 ms) it takes to get there: not at once, as
    # adaptive dispatch sends it (maxWait 0), nor at the first's answer.
    worker_s = FIXED_S + PER_ITEM_S
    assert second_sent - first_sent == pytest.approx(worker_s, abs=EXACT_S)
    assert first_answered - second_sent == pytest.approx(hop_s, abs=EXACT_S)
    sample = served.registry.get_sample_value
    assert served.batches("model_ready") >= 1
    # Only batches of one ran: their whole time is the fixed part.
    fixed = sample("carpool_model_batch_fixed_seconds", {"model": "m"})
    assert fixed == pytest.approx(worker_s, abs=EXACT_S)
    assert sample("carpool_model_hop_seconds", {"model": "m"}) == pytest.approx(hop_s, abs=EXACT_S)


def test_the_fit_shrugs_off_a_stall() -> None:
    fit = DurationFit()
    clock = 0.0
    for repeat in range(20):
        for size in (1, 2, 4, 8):
            clock += 0.010 + 0.002 * size
            fit.record(size, 0.010 + 0.002 * size, clock)
        if repeat == 10:
            clock += 5.0
            fit.record(4, 5.0, clock)  # a pause of the whole process
    assert fit.fixed_s == pytest.approx(0.010, rel=0.1)
    assert fit.per_item_s == pytest.approx(0.002, rel=0.1)
    assert fit.predict(32) == pytest.approx(0.074, rel=0.1)


def group_opened_at(opened_at: float, count: int) -> Group:
    group = Group(KEY)
    future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
    group.push(PendingRequest([opened_at] * count, KEY, 0, math.inf, future, opened_at, 1))
    return group


@pytest.mark.parametrize("max_wait_ms", [0, 5, 50])
async def test_an_idle_model_waits_for_company_at_most_max_wait(max_wait_ms: float) -> None:
    limits = Limits(BatchingSettings(dispatch="timed", max_wait_ms=max_wait_ms))
    busy = Outlook(ready_at=-math.inf, fixed_s=0.020, arrivals_per_s=1000.0)  # 20 due per batch
    group = group_opened_at(10.0, 1)
    wait_s = max_wait_ms / 1000
    if wait_s:
        assert decide([group], limits, 0, False, 10.0 + wait_s / 2, lambda _: busy) == 10.0 + wait_s
    assert decide([group], limits, 0, False, 10.0 + wait_s, lambda _: busy) == (group, "timeout")
    # Few arrivals expected: the batch goes at once.
    quiet = Outlook(ready_at=-math.inf, fixed_s=0.020, arrivals_per_s=10.0)
    assert decide([group], limits, 0, False, 10.0, lambda _: quiet) == (group, "idle")


async def test_a_batch_waits_for_a_busy_model_not_for_max_wait() -> None:
    limits = Limits(BatchingSettings(dispatch="timed", max_wait_ms=5))
    group = group_opened_at(10.0, 3)
    in_flight = Outlook(ready_at=10.050, fixed_s=0.020, arrivals_per_s=10.0)
    assert decide([group], limits, 1, False, 10.010, lambda _: in_flight) == 10.050
    assert decide([group], limits, 1, False, 10.050, lambda _: in_flight) == (group, "model_ready")
    # Full batches do not wait; nor does anything before the model is learned (adaptive).
    full = Limits(BatchingSettings(dispatch="timed", max_wait_ms=5, max_batch_size=3))
    assert decide([group], full, 1, False, 10.010, lambda _: in_flight) == (group, "full")
    unknown = Outlook(ready_at=None, fixed_s=0.0, arrivals_per_s=0.0)
    assert decide([group], limits, 1, False, 10.010, lambda _: unknown) == (group, "timeout")
