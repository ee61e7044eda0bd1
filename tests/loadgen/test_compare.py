"""bench/compare.py: its command line, and how it pairs rounds into ratios."""

from __future__ import annotations

import importlib.util
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import orjson
import psutil
import pytest

from carpool.loadgen.report import CellResult
from carpool.loadgen.stats import LatencySummary

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    # bench/ holds scripts, not a package: load the file itself.
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


summary = _load("summary")


def test_compare_help_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / "compare.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for option in ("--model", "--concurrency", "--rounds", "--torch-threads", "--peers"):
        assert option in done.stdout
    for peer in ("ray", "litserve", "mlserver", "bentoml", "none"):
        assert peer in done.stdout


def _measurement(variant: str, round_number: int, rps: float, p50: float, level: int = 8) -> object:
    cell = CellResult(
        mode="concurrency",
        level=level,
        requests=int(rps * 10),
        ok=int(rps * 10),
        errors={},
        wall_seconds=10.0,
        throughput_rps=rps,
        items_per_second=rps,
        latency=LatencySummary(1, p50, p50, p50, p50, p50),
        loadgen_cpu_percent=10.0,
    )
    return summary.Measurement(variant, round_number, level, cell, 5.0, 0.0)


def test_ratios_pair_each_round_with_the_same_round() -> None:
    # Round 2 ran on a machine twice as fast for everybody: pairing cancels it.
    measurements = [
        _measurement("unbatched", 1, 100, 0.010),
        _measurement("carpool", 1, 300, 0.012),
        _measurement("unbatched", 2, 200, 0.005),
        _measurement("carpool", 2, 600, 0.006),
    ]
    limits = [summary.Limit(1, 8, 400.0), summary.Limit(2, 8, 800.0)]
    ratios = summary.paired_ratios(measurements, limits, 32)
    assert ratios["throughput carpool/unbatched"][8] == summary.Spread(3.0, 3.0, 3.0)
    assert ratios["items/s carpool/limit at batch"][8].median == pytest.approx(0.75)
    assert ratios["p50 carpool/unbatched"][8].median == pytest.approx(1.2)
    assert "throughput carpool/ray" not in ratios
    table = summary.medians(measurements)
    assert table["carpool"][8]["requests_per_second"] == summary.Spread(450.0, 300.0, 600.0)
    # 5 CPU seconds over 10 s is half a core.
    assert table["carpool"][8]["requests_per_front_core"].median == pytest.approx(900.0)
    assert math.isnan(summary.Spread.of([]).median)


def test_every_variant_meets_the_limit_at_the_batch_its_clients_can_form() -> None:
    # The model does 100 items/s one at a time, 400 in batches of 8 and 800 in batches of
    # 32 (its best); 8 clients can form batches of 8 at most, 64 clients of 32 (the max).
    limits = [summary.Limit(1, size, rate) for size, rate in ((1, 100), (8, 400), (32, 800))]
    measurements = [
        _measurement("carpool", 1, 300, 0.02, level=8),
        _measurement("carpool", 1, 720, 0.08, level=64),
        _measurement("litserve", 1, 200, 0.03, level=8),
        _measurement("litserve", 1, 600, 0.10, level=64),
    ]
    ratios = summary.paired_ratios(measurements, limits, 32)
    assert ratios["items/s carpool/limit at batch"][8].median == pytest.approx(300 / 400)
    assert ratios["items/s carpool/limit at batch"][64].median == pytest.approx(720 / 800)
    assert ratios["items/s carpool/best limit"][8].median == pytest.approx(300 / 800)
    assert ratios["items/s litserve/limit at batch"][8].median == pytest.approx(200 / 400)
    assert ratios["items/s litserve/best limit"][64].median == pytest.approx(600 / 800)
    # Every peer is set against carpool, throughput and latency, at every concurrency.
    assert ratios["throughput carpool/litserve"][8].median == pytest.approx(1.5)
    assert ratios["throughput carpool/litserve"][64].median == pytest.approx(1.2)
    assert ratios["p50 carpool/litserve"][64].median == pytest.approx(0.8)
    assert summary.best_size(limits) == 32


def test_every_variant_is_set_against_the_forward_only_ceiling() -> None:
    # The forward pass alone does 1,000 items/s at batch 8: carpool's 300 use 0.3 of the device.
    limits = [summary.Limit(1, 8, 400.0, 1000.0), summary.Limit(1, 32, 800.0)]
    measurements = [_measurement("carpool", 1, 300, 0.02, level=8)]
    ratios = summary.paired_ratios(measurements, limits, 32)
    assert ratios["items/s carpool/forward at batch"][8].median == pytest.approx(0.3)
    # Where limit.py gave no forward figure (32 here), there is no forward curve entry.
    assert summary.forward_curve(limits) == {8: summary.Spread(1000.0, 1000.0, 1000.0)}
    text = summary.render_text(measurements, limits, _SETTINGS)
    assert "batch   8: 400.0 (400.0-400.0)  forward 1000.0" in text


def test_the_results_on_disk_follow_every_measurement(tmp_path: Path) -> None:
    measurements = [_measurement("unbatched", 1, 100, 0.010)]
    summary.write(tmp_path, measurements, [], _SETTINGS)
    first = orjson.loads((tmp_path / "results.json").read_bytes())
    assert [m["variant"] for m in first["measurements"]] == ["unbatched"]
    measurements.append(_measurement("carpool", 1, 300, 0.012))
    text = summary.write(tmp_path, measurements, [], _SETTINGS)
    second = orjson.loads((tmp_path / "results.json").read_bytes())
    assert [m["variant"] for m in second["measurements"]] == ["unbatched", "carpool"]
    assert (tmp_path / "summary.txt").read_text() == text + "\n"
    assert "throughput carpool/unbatched" in text
    # Replaced whole, nothing left beside.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results.json", "summary.txt"]


def test_a_limit_missing_at_a_batch_size_leaves_that_ratio_out() -> None:
    limits = [summary.Limit(1, 32, 800.0)]
    measurements = [_measurement("carpool", 1, 300, 0.02, level=8)]
    ratios = summary.paired_ratios(measurements, limits, 32)
    assert "items/s carpool/limit at batch" not in ratios
    assert ratios["items/s carpool/best limit"][8].median == pytest.approx(300 / 800)


def test_the_limit_curve_takes_medians_over_rounds() -> None:
    limits = [summary.Limit(1, 8, 400.0), summary.Limit(2, 8, 500.0), summary.Limit(3, 8, 900.0)]
    assert summary.limit_curve(limits) == {8: summary.Spread(500.0, 400.0, 900.0)}
    assert summary.best_size([]) is None


_SETTINGS = {
    "handler": "toy", "device": "cpu", "torch_threads": 1, "max_batch_size": 32,
    "max_wait_ms": 5.0, "rounds": 1, "duration_seconds": 10.0,
}  # fmt: skip


def test_summary_outputs(tmp_path: Path) -> None:
    measurements = [
        _measurement("unbatched", 1, 100, 0.010),
        _measurement("carpool", 1, 300, 0.012),
    ]
    settings = {
        "handler": "toy", "device": "cpu", "torch_threads": 1, "max_batch_size": 32,
        "max_wait_ms": 5.0, "rounds": 1, "duration_seconds": 10.0,
    }  # fmt: skip
    limits = [summary.Limit(1, 1, 100.0), summary.Limit(1, 8, 400.0)]
    text = summary.render_text(measurements, limits, settings)
    assert "torch threads 1" in text
    assert "throughput carpool/unbatched" in text
    assert "batch   8: 400.0" in text
    document = summary.to_json(measurements, limits, settings)
    assert document["schema"] == "carpool.compare/v1"
    assert document["ratios"]["throughput carpool/unbatched"]["8"]["median"] == 3.0
    assert document["ratios"]["items/s carpool/limit at batch"]["8"]["median"] == 0.75
    assert document["limit_curve"]["8"]["median"] == 400.0
    assert document["best_batch_size"] == 8
    path = tmp_path / "compare.png"
    summary.plot(measurements, limits, 32, path, "t")
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_trivial_comparison_runs_both_servers_and_meters_the_front(tmp_path: Path) -> None:
    command = [sys.executable, str(BENCH_DIR / "compare.py"), "--model", "trivial"]
    command += ["--rounds", "1", "--duration", "1", "--warmup", "0.3", "--concurrency", "4"]
    command += ["--results", str(tmp_path), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    document = orjson.loads((tmp_path / "results.json").read_bytes())
    assert document["settings"]["torch_threads"] == 1
    by_variant = {m["variant"]: m for m in document["measurements"]}
    assert set(by_variant) == {"unbatched", "carpool"}
    for measurement in by_variant.values():
        assert measurement["cell"]["ok"] > 0 and measurement["cell"]["errors"] == {}
        assert measurement["front_cpu_seconds"] > 0
        assert measurement["requests_per_front_core"] > 0
    # Only carpool has a model server apart from its front, and batch figures.
    assert by_variant["carpool"]["model_cpu_seconds"] > 0
    assert by_variant["carpool"]["cell"]["batching"]["batches"] > 0
    assert by_variant["unbatched"]["model_cpu_seconds"] == 0
    assert by_variant["unbatched"]["cell"]["batching"] is None
    assert "throughput carpool/unbatched" in (tmp_path / "summary.txt").read_text()
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_stopped_comparison_keeps_what_it_measured(tmp_path: Path) -> None:
    # Stopped during the carpool variant's turn, after the unbatched server's two cells.
    command = [sys.executable, str(BENCH_DIR / "compare.py"), "--model", "trivial"]
    command += ["--rounds", "1", "--duration", "1", "--warmup", "0", "--concurrency", "2,4"]
    command += ["--results", str(tmp_path), "--quiet"]
    results = tmp_path / "results.json"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        measured: list[dict[str, object]] = []
        deadline = time.monotonic() + 90
        while len(measured) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            if results.exists():
                measured = orjson.loads(results.read_bytes())["measurements"]
        servers = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=90)
    assert process.returncode == 130, err.decode()
    assert b"stopped: what was measured is in" in err
    kept = orjson.loads(results.read_bytes())["measurements"]
    assert [(m["variant"], m["concurrency"]) for m in kept[:2]] == [
        ("unbatched", 2),
        ("unbatched", 4),
    ]
    assert all(m["cell"]["ok"] > 0 for m in kept)
    # The server in its turn was stopped with the run, none of its processes left behind.
    assert not [(server.pid, _state(server)) for server in servers if _alive(server)]


def _state(process: psutil.Process) -> str:
    try:
        return f"{process.status()} {process.cmdline()}"
    except psutil.NoSuchProcess:
        return "gone"


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (one whose parent is gone may wait for a reaper a while)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
