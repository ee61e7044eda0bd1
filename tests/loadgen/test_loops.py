"""The closed and open loops, in process, with a send that needs no server."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics

import pytest

from carpool.loadgen.loops import closed_loop, open_loop, poisson_arrivals


def test_poisson_schedule_has_the_asked_rate_and_exponential_gaps() -> None:
    arrivals = poisson_arrivals(200.0, random.Random(7), duration=50.0)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # 10,000 expected arrivals: the count is within a few standard deviations (sqrt(n)=100).
    assert 9_600 < len(arrivals) < 10_400
    assert all(0 < t < 50.0 for t in arrivals)
    assert arrivals == sorted(arrivals)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 200, rel=0.03)
    # Exponential: standard deviation equals the mean, and P(gap > mean) = 1/e.
    assert statistics.stdev(gaps) == pytest.approx(mean, rel=0.05)
    longer = sum(gap > mean for gap in gaps) / len(gaps)
    assert longer == pytest.approx(0.3679, abs=0.02)


def test_poisson_schedule_is_repeatable_and_bounded_by_count() -> None:
    first = poisson_arrivals(50.0, random.Random(1), requests=100)
    assert first == poisson_arrivals(50.0, random.Random(1), requests=100)
    assert len(first) == 100
    assert first != poisson_arrivals(50.0, random.Random(2), requests=100)
    with pytest.raises(ValueError, match="duration, a request count"):
        poisson_arrivals(50.0, random.Random(1))


async def test_closed_loop_never_exceeds_its_concurrency_and_sends_exactly_the_count() -> None:
    in_flight = 0
    peak = 0
    seen: list[int] = []

    async def send(index: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        seen.append(index)
        return 503 if index % 10 == 0 else 200

    result = await closed_loop(send, 8, requests=200)
    assert len(result.outcomes) == 200
    assert sorted(seen) == list(range(200))
    assert peak == 8
    assert sum(outcome.status == 503 for outcome in result.outcomes) == 20
    assert all(outcome.latency > 0 for outcome in result.outcomes)


async def test_closed_loop_stops_starting_requests_at_its_duration() -> None:
    async def send(index: int) -> int:
        await asyncio.sleep(0.01)
        return 200

    result = await closed_loop(send, 4, duration=0.3)
    assert all(outcome.due < 0.3 for outcome in result.outcomes)
    # At most 4 workers * 30 requests; a handful only would mean it stopped early.
    assert 12 < len(result.outcomes) <= 4 * 31
    assert result.wall_seconds < 1.0


async def test_open_loop_does_not_wait_for_slow_answers() -> None:
    # Every answer takes 0.2 s, but requests keep arriving on schedule meanwhile.
    async def send(index: int) -> int:
        await asyncio.sleep(0.2)
        return 200

    arrivals = [0.01 * i for i in range(20)]
    result = await open_loop(send, arrivals)
    assert len(result.outcomes) == 20
    assert sorted(outcome.due for outcome in result.outcomes) == arrivals
    # Closed-loop at one client would need 20 * 0.2 s = 4 s.
    assert result.wall_seconds < 2.0
