"""The operator's metrics: what each one counts, and its /metrics listener.

The end-to-end scenario (`test_e2e.py::test_operator_metrics_count_its_work`) reads them from
the running operator; these pin down the bookkeeping and the start-up failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from prometheus_client import CollectorRegistry

from carpool_operator.metrics import OperatorMetrics


def test_every_series_is_there_from_the_start() -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    for result in ("success", "error", "degraded"):
        assert (
            registry.get_sample_value("carpool_operator_reconciles_total", {"result": result}) == 0
        )
    for ready in ("true", "false"):
        assert registry.get_sample_value("carpool_operator_models", {"ready": ready}) == 0


def test_models_gauge_counts_each_model_once_by_its_latest_readiness() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)

    def models(ready: str) -> float | None:
        return registry.get_sample_value("carpool_operator_models", {"ready": ready})

    metrics.saw("ml", "a", ready=False)
    metrics.saw("ml", "a", ready=False)  # a resync of the same model
    metrics.saw("ml", "b", ready=True)
    metrics.saw("other", "a", ready=True)  # same name, another namespace
    assert (models("true"), models("false")) == (2, 1)
    metrics.saw("ml", "a", ready=True)
    assert (models("true"), models("false")) == (3, 0)
    metrics.forget("ml", "a")
    metrics.forget("ml", "never-seen")
    assert (models("true"), models("false")) == (2, 0)


def test_reconciles_and_writes_are_counted_by_label() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.reconciled("success", 0.02)
    metrics.reconciled("degraded", 0.03)
    metrics.wrote("Deployment")
    metrics.wrote("Deployment")
    metrics.wrote("BatchedModel")
    sample = registry.get_sample_value
    assert sample("carpool_operator_reconciles_total", {"result": "success"}) == 1
    assert sample("carpool_operator_reconciles_total", {"result": "degraded"}) == 1
    assert sample("carpool_operator_reconcile_duration_seconds_count") == 2
    assert sample("carpool_operator_writes_total", {"kind": "Deployment"}) == 2
    assert sample("carpool_operator_writes_total", {"kind": "BatchedModel"}) == 1


def test_a_taken_metrics_port_stops_the_operator_with_a_clear_message() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "carpool", "operator", "--liveness", ""]
        command += ["--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
        result = subprocess.run(
            command,
            env={**os.environ, "KUBECONFIG": os.devnull},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr
