"""The operator's /metrics, read as Prometheus would."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]  # a metric sample's name and sorted labels


def scrape(port: int) -> dict[Sample, float]:
    """The operator's /metrics on 127.0.0.1:`port`, by sample name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def resyncs(port: int) -> float:
    """Passes of the periodic resync the operator finished."""
    return scrape(port)[("carpool_operator_resyncs_total", ())]
