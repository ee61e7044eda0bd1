"""Percentiles and the /metrics deltas behind the batching figures of a report."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from carpool.engine.metrics import SidecarMetrics
from carpool.loadgen.stats import (
    BatchStats,
    LatencySummary,
    counter_delta,
    histogram_delta,
    parse_metrics,
    percentile,
)


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100, shuffled order must not matter
    values.reverse()
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 90) == 3.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile(values, 101)


def test_latency_summary_of_nothing_is_nan_not_an_error() -> None:
    empty = LatencySummary.of([])
    assert empty.count == 0 and math.isnan(empty.p99)
    summary = LatencySummary.of([0.01, 0.02, 0.03, 0.04])
    assert summary.count == 4
    assert summary.mean == pytest.approx(0.025)
    assert summary.max == 0.04


def _scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_batch_stats_cover_only_what_happened_between_snapshots() -> None:
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, "toy")
    # Before the cell: traffic that must not count.
    metrics.batch_sent("timeout", 1)
    metrics.queue_wait.observe(2.0)
    before = parse_metrics(_scrape(registry))

    for size in (4, 4, 8, 16):
        metrics.batch_sent("full" if size == 16 else "timeout", size)
    for wait in [0.0008] * 18 + [0.02, 0.02]:
        metrics.queue_wait.observe(wait)
    after = parse_metrics(_scrape(registry))

    stats = BatchStats.between(before, after)
    assert stats.batches == 4
    assert stats.mean_items_per_batch == pytest.approx(8.0)
    assert stats.batches_by_reason == {"timeout": 3, "full": 1}
    assert stats.queue_wait_mean == pytest.approx((18 * 0.0008 + 0.04) / 20)
    # 95% of 20 = rank 19, inside the (0.01, 0.025] bucket that holds the two slow waits.
    assert 0.01 < stats.queue_wait_p95 <= 0.025


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    before = parse_metrics("")
    after = parse_metrics(
        "# TYPE d histogram\n"
        'd_bucket{le="1.0"} 10\n'
        'd_bucket{le="2.0"} 30\n'
        'd_bucket{le="+Inf"} 40\n'
        "d_count 40\n"
        "d_sum 70\n"
    )
    delta = histogram_delta(before, after, "d")
    assert delta.count == 40 and delta.mean == pytest.approx(1.75)
    assert delta.quantile(0.25) == pytest.approx(1.0)
    assert delta.quantile(0.5) == pytest.approx(1.5)
    # Ranks in the +Inf bucket answer with the highest finite bound.
    assert delta.quantile(0.99) == 2.0
    assert math.isnan(histogram_delta(before, before, "d").quantile(0.5))


def test_counter_delta_sums_label_sets_and_drops_unchanged_values() -> None:
    before = parse_metrics(
        '# TYPE r counter\nr_total{code="200",model="a"} 5\nr_total{code="503",model="a"} 1\n'
    )
    after = parse_metrics(
        "# TYPE r counter\n"
        'r_total{code="200",model="a"} 12\n'
        'r_total{code="200",model="b"} 3\n'
        'r_total{code="503",model="a"} 1\n'
    )
    assert counter_delta(before, after, "r_total", "code") == {"200": 10}
    assert counter_delta(before, after, "r_total") == {"": 10}
