"""Request metrics: answers counted by protocol and code, each model in its own series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from carpool.engine.metrics import SidecarMetrics


def answers(registry: CollectorRegistry, model: str, protocol: str, code: str) -> float | None:
    labels = {"model": model, "protocol": protocol, "code": code}
    return registry.get_sample_value("carpool_requests_total", labels)


def durations(registry: CollectorRegistry, model: str, protocol: str) -> float | None:
    labels = {"model": model, "protocol": protocol}
    return registry.get_sample_value("carpool_request_duration_seconds_count", labels)


def test_answers_add_up_by_protocol_and_code_and_stay_with_their_model() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = SidecarMetrics(first, "a"), SidecarMetrics(second, "b")
    for _ in range(3):
        a.answered(200, 0.01, "rest")
    a.answered(429, 0.001, "rest")
    a.answered(200, 0.02, "grpc")
    b.answered(200, 0.01, "rest")
    assert answers(first, "a", "rest", "200") == 3
    assert answers(first, "a", "rest", "429") == 1
    assert answers(first, "a", "grpc", "200") == 1
    assert durations(first, "a", "rest") == 4
    assert durations(first, "a", "grpc") == 1
    assert answers(second, "b", "rest", "200") == 1
    assert answers(second, "b", "rest", "429") is None
    assert durations(second, "b", "rest") == 1
