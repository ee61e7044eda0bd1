"""A machine whose speed changes: batch times and the lateness margin follow it within
seconds, as they must when other work takes the cores and gives them back."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from carpool.contract.wire import BatchTiming
from carpool.engine.batch_queue import BatchQueue
from carpool.engine.errors import Late
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.objective import Objective
from carpool.engine.pending import BatchKey
from carpool.engine.scheduling import Limits
from carpool.engine.settings import BatchingSettings
from carpool.engine.timeline import ModelTimeline


def run(timeline: ModelTimeline, clock: float, size: int, seconds: float) -> float:
    """One batch at the worker from `clock`; when it is answered."""
    token = timeline.sent(size, None, clock)
    timeline.answered(token, clock + seconds, BatchTiming(0.0, seconds), learn=True)
    return clock + seconds


def took(size: int, slowdown: float) -> float:
    return slowdown * (0.010 + 0.004 * size)


def test_batch_times_follow_a_model_that_slows_down_and_recovers() -> None:
    timeline = ModelTimeline()
    clock = 0.0
    # Every size from 1 to 16, many times over: the line is learned well.
    for _ in range(20):
        for size in range(1, 17):
            clock = run(timeline, clock, size, took(size, 1.0))
    assert timeline.worker.predict(16, None) == pytest.approx(took(16, 1.0), rel=0.05)
    # Other work takes the cores: batches take twice as long, and under the load only full
    # and nearly full batches run. Within a second and a half their predictions follow, and
    # again once the cores are given back.
    for slowdown in (2.0, 1.0):
        began = clock
        while clock < began + 1.5:
            for size in (12, 16):
                clock = run(timeline, clock, size, took(size, slowdown))
        for size in (12, 16):
            predicted = timeline.worker.predict(size, None)
            assert predicted == pytest.approx(took(size, slowdown), rel=0.15), (slowdown, size)


def test_a_model_that_slows_as_a_whole_is_followed_within_a_few_batches_of_any_size() -> None:
    """Batches of every size in turn, so that no size is seen twice in the slow spell: the
    third batch at twice the time sets the pace for every size."""
    timeline = ModelTimeline()
    clock = 0.0
    for _ in range(20):
        for size in range(1, 17):
            clock = run(timeline, clock, size, took(size, 1.0))
    for size in (3, 9, 14):
        clock = run(timeline, clock, size, took(size, 2.0))
    for size in (1, 8, 16):
        predicted = timeline.worker.predict(size, None)
        assert predicted == pytest.approx(took(size, 2.0), rel=0.1), size


def test_one_stalled_batch_among_a_slowed_model_moves_nothing() -> None:
    timeline = ModelTimeline()
    clock = 0.0
    for _ in range(10):
        for size in (4, 8):
            clock = run(timeline, clock, size, took(size, 2.0))
    clock = run(timeline, clock, 8, 1.0)  # a pause of the whole process
    for size in (4, 8):
        clock = run(timeline, clock, size, took(size, 2.0))
    for size in (4, 8):
        assert timeline.worker.predict(size, None) == pytest.approx(took(size, 2.0), rel=0.1)


OBJECTIVE_S = 0.200


@pytest.mark.parametrize("answers_per_s", [5, 0])
def test_a_late_spell_is_forgotten_within_seconds(answers_per_s: int) -> None:
    """Batches take 120 ms: with a margin past 80 ms a request is refused. A spell of answers
    300 ms late raises the margin to its bound; once answers are on time again, or none come
    (every request refused), requests are admitted again within a second and a half."""
    timeline = ModelTimeline()
    clock = 0.0
    for _ in range(4):
        for size in (1, 2):
            clock = run(timeline, clock, size, 0.120)
    queue = BatchQueue(SidecarMetrics(CollectorRegistry(), "m"), lambda: None, lambda: clock)
    objective = Objective(timeline, queue)
    limits = Limits(BatchingSettings(latency_objective_ms=1000 * OBJECTIVE_S, max_batch_size=8))
    key = BatchKey(None)

    def admitted(now: float) -> bool:
        try:
            objective.admit(limits, 1, key, 0, now + 30, now, now)
        except Late:
            return False
        return True

    assert admitted(clock)
    for _ in range(50):
        clock += 0.02
        objective.answered(clock - 0.300, clock)
    assert not admitted(clock)
    spell_ended = clock
    while clock < spell_ended + 1.5:
        clock += 1 / answers_per_s if answers_per_s else 0.1
        if answers_per_s:
            objective.answered(clock, clock)
    assert admitted(clock)
