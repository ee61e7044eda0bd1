"""The model server's per-batch metrics, added up without a lock and read when scraped.

prometheus_client takes a lock for each counter increment and histogram observation: five
a batch. Only one thread at a time runs a batch (the worker, or the loop's thread for a lone
batch while the worker is idle), so plain numbers suffice; a scrape reads them as they are,
as it reads prometheus_client's values, each under its own lock. The series are those a
`Histogram` and a `Counter` with the same names, help and labels expose.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence

import prometheus_client.metrics
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

BATCH_SIZE_BUCKETS = tuple(float(2**power) for power in range(11))  # 1, 2, 4, ... 1024
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ERROR_KINDS = ("invalid_item", "infer")


class _Histogram:
    """One labelled histogram's counts, each bucket's alone (+Inf last), and its sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # The first bound at or above the value, as prometheus_client's `value <= bound`.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, name: str, help_text: str, model: str, created: float | None) -> Metric:
        edges = [*map(floatToGoString, self.bounds), "+Inf"]
        running, buckets = 0, []
        for edge, count in zip(edges, self.counts, strict=True):
            running += count
            buckets.append((edge, float(running)))
        family = HistogramMetricFamily(name, help_text, labels=["model"])
        family.add_metric([model], buckets, self.sum)
        if created is not None:
            family.samples.append(Sample(f"{name}_created", {"model": model}, created))
        return family


class BatchTally(Collector):
    """Batch sizes and durations, items and errors by kind, of one model."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._created = time.time()
        self._sizes = _Histogram(BATCH_SIZE_BUCKETS)
        self._durations = _Histogram(DURATION_BUCKETS)
        self._items = 0.0
        self._errors = dict.fromkeys(ERROR_KINDS, 0.0)

    def observe_batch(self, size: int, seconds: float, invalid: int, failed: int) -> None:
        """Called by the thread that ran the batch, one batch at a time."""
        self._sizes.observe(size)
        self._durations.observe(seconds)
        self._items += size
        if invalid or failed:
            self._errors["invalid_item"] += invalid
            self._errors["infer"] += failed

    def collect(self) -> Iterator[Metric]:
        # prometheus_client's switch (PROMETHEUS_DISABLE_CREATED_SERIES), as its metrics read it.
        created = self._created if prometheus_client.metrics._use_created else None
        yield self._sizes.family(
            "carpool_model_batch_size", "Items per batch run by the model.", self.model, created
        )
        yield self._durations.family(
            "carpool_model_batch_duration_seconds",
            "Time to run one batch: preprocess, infer, postprocess and any isolation retries.",
            self.model,
            created,
        )
        items = CounterMetricFamily(
            "carpool_model_items", "Items received in batches, valid or not.", labels=["model"]
        )
        items.add_metric([self.model], self._items, created=created)
        yield items
        errors = CounterMetricFamily(
            "carpool_model_errors",
            "Items answered with an error, by kind: invalid_item (400) or infer (500).",
            labels=["model", "kind"],
        )
        for kind, count in self._errors.items():
            errors.add_metric([self.model, kind], count, created=created)
        yield errors
