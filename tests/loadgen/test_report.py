"""The JSON document scripts read and the PNG plot."""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from carpool.loadgen.report import BenchReport, CellResult, plot, render_text, write_json
from carpool.loadgen.stats import BatchStats, LatencySummary


def _cell(level: float, batching: BatchStats | None) -> CellResult:
    return CellResult(
        mode="concurrency",
        level=level,
        requests=100,
        ok=98,
        errors={"503": 2},
        wall_seconds=2.0,
        throughput_rps=49.0,
        items_per_second=49.0,
        latency=LatencySummary.of([0.01, 0.02, 0.05]),
        loadgen_cpu_percent=12.5,
        batching=batching,
    )


def _report() -> BenchReport:
    stats = BatchStats(
        batches=10,
        mean_items_per_batch=9.8,
        batches_by_reason={"full": 4, "timeout": 6},
        queue_wait_mean=0.003,
        queue_wait_p95=math.nan,
    )
    return BenchReport(
        {"url": "http://127.0.0.1:1", "mode": "concurrency"},
        [
            _cell(1, None),
            _cell(8, stats),
        ],
    )


def test_json_report_schema(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    write_json(_report(), path)
    document = orjson.loads(path.read_bytes())
    assert document["schema"] == "carpool.bench/v1"
    assert document["settings"]["mode"] == "concurrency"
    first, second = document["cells"]
    assert set(first) == {
        "mode", "level", "requests", "ok", "errors", "wall_seconds", "throughput_rps",
        "items_per_second", "latency", "loadgen_cpu_percent", "batching",
    }  # fmt: skip
    assert set(first["latency"]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert first["errors"] == {"503": 2}
    assert first["batching"] is None
    assert second["batching"]["batches_by_reason"] == {"full": 4, "timeout": 6}
    # NaN is not JSON: it travels as null.
    assert second["batching"]["queue_wait_p95"] is None


def test_text_report_names_errors_and_batching() -> None:
    text = render_text(_report())
    assert "503:2" in text
    assert "items/batch" in text and "9.80" in text
    assert "full=4 timeout=6" in text


def test_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "bench.png"
    plot({"carpool": _report().cells, "baseline": _report().cells}, path, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
