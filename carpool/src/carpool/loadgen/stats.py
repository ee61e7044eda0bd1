"""Latency percentiles and what changed in the sidecar's /metrics during a run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
# (sample name, labels) -> value, e.g. ("carpool_batch_size_bucket", {le="4", model=...}).
Snapshot = dict[tuple[str, Labels], float]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of values, interpolated linearly between ranks."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Seconds, over the successful requests of one cell."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, latencies: Sequence[float]) -> LatencySummary:
        if not latencies:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            count=len(latencies),
            mean=sum(latencies) / len(latencies),
            p50=percentile(latencies, 50),
            p90=percentile(latencies, 90),
            p99=percentile(latencies, 99),
            max=max(latencies),
        )


def parse_metrics(text: str) -> Snapshot:
    """Every sample of a Prometheus text exposition, keyed by name and labels."""
    snapshot: Snapshot = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            snapshot[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return snapshot


def _sum_by(snapshot: Snapshot, name: str, label: str | None) -> dict[str, float]:
    """Samples named `name` summed per value of `label` (or all together under "")."""
    totals: dict[str, float] = {}
    for (sample, labels), value in snapshot.items():
        if sample != name:
            continue
        key = dict(labels).get(label, "") if label is not None else ""
        totals[key] = totals.get(key, 0.0) + value
    return totals


def counter_delta(
    before: Snapshot, after: Snapshot, name: str, label: str | None = None
) -> dict[str, float]:
    """How much a counter grew, per value of `label`; values that did not grow are left out."""
    start = _sum_by(before, name, label)
    delta = {}
    for key, value in _sum_by(after, name, label).items():
        grown = value - start.get(key, 0.0)
        if grown > 0:
            delta[key] = grown
    return delta


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """The observations a histogram received between two snapshots."""

    # (upper bound, cumulative count), ascending, ending with +Inf.
    buckets: list[tuple[float, float]]
    count: float
    total: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Estimate the q-quantile (0..1) as Prometheus' histogram_quantile does.

        Linear within the bucket that holds the rank; the +Inf bucket answers with the
        highest finite bound, since nothing is known above it.
        """
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must be within 0..1, got {q}")
        if not self.count or not self.buckets:
            return math.nan
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound
                width = cumulative - lower_count
                if width <= 0:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / width
            lower_bound, lower_count = bound, cumulative
        return lower_bound


def histogram_delta(before: Snapshot, after: Snapshot, name: str) -> HistogramDelta:
    """The change in histogram `name` (base name, without _bucket), summed over label sets."""

    def buckets(snapshot: Snapshot) -> dict[float, float]:
        counts: dict[float, float] = {}
        for (sample, labels), value in snapshot.items():
            if sample == f"{name}_bucket":
                bound = float(dict(labels)["le"])
                counts[bound] = counts.get(bound, 0.0) + value
        return counts

    start, end = buckets(before), buckets(after)
    cumulative = [(bound, end[bound] - start.get(bound, 0.0)) for bound in sorted(end)]

    def scalar(suffix: str) -> float:
        grown = counter_delta(before, after, f"{name}{suffix}")
        return grown.get("", 0.0)

    return HistogramDelta(cumulative, scalar("_count"), scalar("_sum"))


@dataclass(frozen=True, slots=True)
class BatchStats:
    """How the sidecar batched the requests of one cell."""

    batches: float
    mean_items_per_batch: float
    batches_by_reason: dict[str, float]
    queue_wait_mean: float
    queue_wait_p95: float

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> BatchStats:
        sizes = histogram_delta(before, after, "carpool_batch_size")
        wait = histogram_delta(before, after, "carpool_queue_wait_seconds")
        return cls(
            batches=sizes.count,
            mean_items_per_batch=sizes.mean,
            batches_by_reason=counter_delta(before, after, "carpool_batches_total", "reason"),
            queue_wait_mean=wait.mean,
            queue_wait_p95=wait.quantile(0.95),
        )


def has_batch_metrics(snapshot: Mapping[tuple[str, Labels], float]) -> bool:
    return any(name == "carpool_batch_size_count" for name, _ in snapshot)
