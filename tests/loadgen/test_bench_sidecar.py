"""`carpool bench` against a real sidecar and model server (toy model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from support.sidecar import Pair, run_pair


def _bench(pair: Pair, tmp_path: Path, *args: str) -> dict[str, object]:
    report = tmp_path / "bench.json"
    command = [sys.executable, "-m", "carpool", "bench", "--url", pair.sidecar.url]
    command += ["--payload", "toy", "--warmup", "0", "--quiet", "--json", str(report), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + pair.sidecar.log()
    document: dict[str, object] = orjson.loads(report.read_bytes())
    return document


def test_closed_loop_counts_requests_and_reads_batching_from_metrics(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy") as pair:
        plot = tmp_path / "bench.png"
        document = _bench(
            pair, tmp_path, "--concurrency", "8", "--requests", "300", "--duration", "20",
            "--plot", str(plot),
        )  # fmt: skip
    [cell] = document["cells"]  # type: ignore[misc]
    assert cell["requests"] == 300 and cell["ok"] == 300
    assert cell["errors"] == {}
    assert cell["latency"]["count"] == 300
    batching = cell["batching"]
    assert batching is not None, "no batch figures parsed from the sidecar's /metrics"
    # Every item of the cell went into exactly one batch, and nothing else did.
    assert batching["batches"] * batching["mean_items_per_batch"] == pytest.approx(300)
    assert sum(batching["batches_by_reason"].values()) == batching["batches"]
    assert batching["queue_wait_mean"] >= 0
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_open_loop_with_several_items_per_request(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy") as pair:
        document = _bench(
            pair, tmp_path, "--rate", "200", "--requests", "60", "--batch-per-request", "3",
            "--protocol", "oip-binary",
        )  # fmt: skip
    [cell] = document["cells"]  # type: ignore[misc]
    assert cell["mode"] == "rate" and cell["level"] == 200
    assert cell["ok"] == 60, cell["errors"]
    assert cell["items_per_second"] == pytest.approx(3 * cell["throughput_rps"])
    assert cell["batching"]["batches"] * cell["batching"]["mean_items_per_batch"] == pytest.approx(
        180
    )
