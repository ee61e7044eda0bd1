"""The model server's per-batch metrics scrape as prometheus_client's own Histogram and Counter."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from carpool_model_server.batch_tally import BATCH_SIZE_BUCKETS, DURATION_BUCKETS, ERROR_KINDS
from carpool_model_server.metrics import ModelMetrics

# Sizes and seconds on, between, below and past the bounds; errors of each kind, and none.
BATCHES = [(1, 0.001, 0, 0), (3, 0.0007, 1, 0), (32, 0.0101, 0, 2), (1024, 10.0, 0, 0)]
BATCHES += [(2000, 30.0, 5, 7), (4, 0.25, 0, 0)]


def _created_stripped(text: bytes) -> str:
    """The exposition with the creation times (each series' own clock reading) left out."""
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1", text.decode())


def test_scrape_equals_prometheus_clients_histograms_and_counters() -> None:
    tallied = ModelMetrics.create("m")
    registry = CollectorRegistry()
    size = Histogram(
        "carpool_model_batch_size",
        "Items per batch run by the model.",
        ["model"],
        buckets=BATCH_SIZE_BUCKETS,
        registry=registry,
    ).labels("m")
    duration = Histogram(
        "carpool_model_batch_duration_seconds",
        "Time to run one batch: preprocess, infer, postprocess and any isolation retries.",
        ["model"],
        buckets=DURATION_BUCKETS,
        registry=registry,
    ).labels("m")
    items = Counter(
        "carpool_model_items",
        "Items received in batches, valid or not.",
        ["model"],
        registry=registry,
    ).labels("m")
    errors = Counter(
        "carpool_model_errors",
        "Items answered with an error, by kind: invalid_item (400) or infer (500).",
        ["model", "kind"],
        registry=registry,
    )
    by_kind = [errors.labels("m", kind) for kind in ERROR_KINDS]
    expected_before = _created_stripped(generate_latest(registry))

    def gpu_free(text: bytes) -> str:
        return _created_stripped(text).split("# HELP carpool_model_gpu")[0]

    assert gpu_free(generate_latest(tallied.registry)) == expected_before
    for batch, seconds, invalid, failed in BATCHES:
        tallied.observe_batch(batch, seconds, invalid, failed)
        size.observe(batch)
        duration.observe(seconds)
        items.inc(batch)
        by_kind[0].inc(invalid)
        by_kind[1].inc(failed)
    assert gpu_free(generate_latest(tallied.registry)) == _created_stripped(
        generate_latest(registry)
    )
