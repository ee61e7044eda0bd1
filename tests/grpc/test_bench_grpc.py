"""`carpool bench --protocol grpc` against a real sidecar: every call reaches the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from support.sidecar import metric, run_pair


def test_bench_over_grpc_counts_calls_and_batches(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy") as pair:
        report = tmp_path / "bench.json"
        command = [sys.executable, "-m", "carpool", "bench", "--url", pair.sidecar.url]
        command += ["--protocol", "grpc", "--grpc-target", pair.sidecar.grpc, "--payload", "toy"]
        command += ["--concurrency", "8", "--requests", "300", "--batch-per-request", "2"]
        command += ["--warmup", "0", "--quiet", "--json", str(report)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + pair.sidecar.log()
        answered = metric(pair.sidecar, "carpool_requests_total", protocol="grpc", code="200")
    [cell] = orjson.loads(report.read_bytes())["cells"]
    assert cell["ok"] == 300 and cell["errors"] == {}
    assert answered == 300
    batching = cell["batching"]
    assert batching["batches"] * batching["mean_items_per_batch"] == pytest.approx(600)


def test_bench_over_grpc_reports_refusals_by_status(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy") as pair:
        report = tmp_path / "bench.json"
        command = [sys.executable, "-m", "carpool", "bench", "--url", pair.sidecar.url]
        command += ["--protocol", "grpc", "--grpc-target", pair.sidecar.grpc]
        command += ["--model-name", "absent", "--concurrency", "2", "--requests", "10"]
        command += ["--warmup", "0", "--quiet", "--json", str(report)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        # Counted and reported, and a run where nothing succeeded is a failed run.
        assert done.returncode == 1, done.stderr
        assert "no request succeeded at c=2" in done.stderr
    [cell] = orjson.loads(report.read_bytes())["cells"]
    assert cell["ok"] == 0 and cell["errors"] == {"404": 10}
