"""One scrape for the whole sidecar: the batching process's metrics and every front's.

Counters and histograms add up over the processes, those of fronts that exited included
(their counts as last gathered), so that a front's restart never reads as a counter reset.
A gauge is the batching process's, which keeps the engine's, unless the fronts each hold a
share of it (SUMMED_GAUGES).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.registry import Collector

from carpool.engine.metrics import UNSENT_ANSWER_BYTES_METRIC

# Gauges of what each process holds itself: the pod's figure is their sum.
SUMMED_GAUGES = frozenset({UNSENT_ANSWER_BYTES_METRIC})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def merge(own: Sequence[Metric], fronts: Iterable[Sequence[Metric]]) -> list[Metric]:
    """`own`'s families, each sample added up with the fronts' of the same name and labels
    (a gauge not summed: the first one's, `own`'s); a sample only a front has is added."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, float]] = {}
    for metrics in [own, *fronts]:
        for family in metrics:
            families.setdefault(family.name, family)
            kept = values.setdefault(family.name, {})
            summed = family.type != "gauge" or family.name in SUMMED_GAUGES
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in kept:
                    kept[key] = sample.value
                elif sample.name.endswith("_created"):
                    kept[key] = min(kept[key], sample.value)
                elif summed:
                    kept[key] += sample.value
    merged = []
    for name, family in families.items():
        whole = Metric(name, family.documentation, family.type, family.unit)
        for (sample_name, labels), value in values[name].items():
            whole.add_sample(sample_name, dict(labels), value)
        merged.append(whole)
    return merged


def counts(families: Iterable[Metric]) -> list[Metric]:
    """The counters and histograms of `families`, without the gauges: what a process that
    exited leaves in the pod's figures."""
    return [family for family in families if family.type != "gauge"]


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(own: Sequence[Metric], fronts: Iterable[Sequence[Metric]]) -> bytes:
    """The Prometheus text of `merge`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merge(own, fronts)))
    return generate_latest(registry)
