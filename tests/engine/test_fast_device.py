"""Timed dispatch in front of a fast device: the stand-in of a GPU, 2 ms + 0.05 ms per item.

A lone caller never waits for company, whatever came before; a batch that takes a second
does not make later batches wait beyond maxWait once the model could start them; the
oldest group goes first; and what dispatch learns of the model shrugs off outliers.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from support.timed_model import TimedModel, load, running
from support.virtual_time import EXACT_S, on_virtual_time

from carpool.contract.wire import BatchTiming
from carpool.engine.batch_queue import Group
from carpool.engine.durations import BucketedFit, DurationFit
from carpool.engine.pending import BatchKey, PendingRequest
from carpool.engine.scheduling import Limits, Outlook, decide
from carpool.engine.settings import BatchingSettings
from carpool.engine.timeline import ModelTimeline


def fast(**options: object) -> TimedModel:
    return TimedModel(fixed_s=0.002, per_item_s=0.00005, **options)  # type: ignore[arg-type]


# On virtual time: the host's timers, late on loaded cores, decide nothing, and what these
# tests measure is the engine's decisions alone.
@on_virtual_time
async def test_a_lone_caller_after_a_crowd_never_waits_for_company() -> None:
    model = fast()
    async with running(model, max_wait_ms=5) as served:
        await load(served, 32, 0.4)
        # The crowd's last callers are counted on for two turnarounds: then they are gone.
        await load(served, 1, 0.05)
        crowd = served.batches("timeout")
        latencies = await load(served, 1, 0.5)
    # A closed-loop caller cannot bring company while its own request waits, and the crowd
    # has gone: each of its batches leaves as it comes, and takes the model's time alone.
    assert served.batches("timeout") == crowd
    lone = model.ran[-len(latencies) :]
    assert len(lone) > 100
    assert all(batch.size == 1 for batch in lone)
    assert max(batch.sent - batch.submitted for batch in lone) < EXACT_S
    assert max(latencies) < model.fixed_s + model.per_item_s + EXACT_S


@pytest.mark.parametrize(
    "outliers",
    [{"slow": {0: 1.0}}, {"first_run_s": 0.2}],
    ids=["the first batch takes 1 s", "each size's first batch takes 0.2 s"],
)
@on_virtual_time
async def test_outlier_batches_delay_no_later_batch_beyond_max_wait(
    outliers: dict[str, object],
) -> None:
    """Batches that take far longer than the others (a GPU's first run of a shape) teach
    nothing that makes the batches after them wait: each starts within maxWait of when the
    model could have started it, the later of its oldest item's arrival and the end of the
    batch before it."""
    # A long hop: a model server predicted to be busy for longer than it is idles for the
    # hop there and back before the next batch reaches it.
    max_wait_s, hop_s = 0.005, 0.030
    model = fast(hop_s=hop_s, **outliers)
    async with running(model, max_wait_ms=1000 * max_wait_s) as served:
        await load(served, 8, 3.0)
    # From the slowest batch on, once the first batches have taught the hop.
    slowest = max(model.ran, key=lambda batch: batch.finished - batch.started)
    assert slowest.finished - slowest.started >= 0.2
    settled = max(model.ran.index(slowest), 8)
    later = list(zip(model.ran[settled:], model.ran[settled + 1 :], strict=False))
    assert len(later) > 20
    delays = [
        batch.started - max(before.finished, batch.submitted + hop_s / 2) for before, batch in later
    ]
    assert max(delays) <= max_wait_s + EXACT_S, sorted(delays)[-5:]


def group_of(key: BatchKey, opened_at: float, count: int) -> Group:
    group = Group(key)
    future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
    request = PendingRequest([opened_at] * count, key, 0, math.inf, future, opened_at, 0)
    request.seq = int(opened_at * 1000)
    group.push(request)
    return group


async def test_the_oldest_group_goes_first_and_a_full_younger_one_waits() -> None:
    limits = Limits(BatchingSettings(dispatch="timed", max_batch_size=4))
    rare = group_of(BatchKey(("x",), 1024), 10.000, 1)
    common = group_of(BatchKey(("x",), 64), 10.001, 4)
    busy = Outlook(ready_at=10.050, fixed_s=0.002, arrivals_per_s=0.0)
    # The model is busy: the rare bucket's request waits for it, and the full batch of the
    # common bucket, younger, waits behind it rather than taking the model first.
    assert decide([common, rare], limits, 1, False, 10.010, lambda _: busy) == 10.050
    assert decide([common, rare], limits, 1, False, 10.050, lambda _: busy) == (
        rare,
        "model_ready",
    )
    # Adaptive dispatch sends full batches first and bounds the wait of the others by maxWait.
    adaptive = Limits(BatchingSettings(dispatch="adaptive", max_batch_size=4))
    assert decide([common, rare], adaptive, 1, False, 10.002, lambda _: busy) == (common, "full")


def test_an_outlier_first_sample_is_forgotten_after_two_more() -> None:
    fit = DurationFit()
    fit.record(1, 1.0, 1.0)  # the first batch of the process: kernels compiled, memory grown
    fit.record(1, 0.0021, 1.0021)
    fit.record(1, 0.0020, 1.0041)
    assert fit.predict(1) == pytest.approx(0.002, rel=0.1)


def test_a_new_size_that_stalls_moves_the_line_a_bounded_step() -> None:
    fit = DurationFit()
    clock = 0.0
    for _ in range(16):
        for size in (1, 2, 4, 8):
            clock += 0.002 + 0.0001 * size
            fit.record(size, 0.002 + 0.0001 * size, clock)
    clock += 1.0
    fit.record(16, 1.0, clock)  # a shape the device has not run before
    # Held within twice what the line predicts, and weighed as one sample of one size.
    assert fit.predict(16) < 2 * (0.002 + 0.0016)
    assert fit.predict(1) == pytest.approx(0.0021, rel=0.2)
    for _ in range(4):
        clock += 0.0036
        fit.record(16, 0.0036, clock)
    assert fit.predict(16) == pytest.approx(0.0036, rel=0.1)


def test_lengths_are_learned_per_bucket() -> None:
    fit = BucketedFit()
    clock = 0.0
    for _ in range(8):
        for size in (1, 4, 8):
            clock += 0.050
            fit.record(size, 64, 0.002 + 0.0001 * size, clock)
            fit.record(size, 1024, 0.010 + 0.002 * size, clock)
    assert fit.predict(8, 64) == pytest.approx(0.0028, rel=0.05)
    assert fit.predict(8, 1024) == pytest.approx(0.026, rel=0.05)
    assert fit.fixed_s(1024) == pytest.approx(0.010, rel=0.05)
    # A bucket not seen yet, or seen at one size only, is predicted from every batch.
    assert fit.predict(8, 256) == fit.pooled.predict(8)
    fit.record(2, 256, 0.5, clock + 0.5)
    assert fit.predict(8, 256) == fit.pooled.predict(8)


def test_a_bucket_learned_alone_keeps_its_line_once_another_comes() -> None:
    fit = BucketedFit()
    clock = 0.0
    for bucket, fixed, per_item in ((64, 0.002, 0.0001), (1024, 0.010, 0.002)):
        for _ in range(8):
            for size in (1, 4, 8):
                clock += 0.050
                fit.record(size, bucket, fixed + per_item * size, clock)
    assert fit.predict(8, 64) == pytest.approx(0.0028, rel=0.05)
    assert fit.predict(8, 1024) == pytest.approx(0.026, rel=0.05)


def test_one_slow_round_trip_does_not_move_the_hop() -> None:
    timeline = ModelTimeline()
    for answered_at in [0.003 * n for n in range(1, 20)]:
        token = timeline.sent(1, None, answered_at - 0.003)
        # 2 ms on the worker, 1 ms of hop; one answer comes a second late (a paused loop).
        late = 1.0 if answered_at == 0.003 * 10 else 0.0
        timeline.answered(token, answered_at + late, BatchTiming(0.0, 0.002), learn=True)
    assert timeline.hop_s() == pytest.approx(0.001, rel=0.01)
