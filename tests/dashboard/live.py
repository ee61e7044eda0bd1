"""A live carpool stack under load, scraped by a real Prometheus every second.

    with live_metrics(tmp_path, load_seconds=12) as run:
        run.prometheus.query_range(expr, run.start, run.end, step_s=1)

Starts two models, each a toy model server with variable-length input (ragged_handler.py) and
its sidecar (`support.sidecar.run_pair`), and Prometheus scraping all four. The busy model `toy`
gets `carpool bench` for a bounded time alongside a few clients sending items of varying length
(so batches get padded), plus a few malformed requests so that rejection counters move; the
quiet model gets one slow client, so that per-model panels have two models to keep apart. Then
each model gets bursts of requests more than its queue holds, so that it refuses some (429).
Everything is stopped on exit.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from support.model_server import free_port
from support.prometheus import Prometheus, run_prometheus
from support.sidecar import run_pair

MODEL = "toy"
QUIET_MODEL = "quiet"
HERE = Path(__file__).resolve().parent
# The toy model with variable-length input (see ragged_handler.py): batches get padded.
HANDLER = "ragged_handler:RaggedHandler"
SCRAPE_INTERVAL_S = 1.0
# Grafana's $__rate_interval for a 1 s scrape interval is 4 s; a little more smooths the plots.
RATE_INTERVAL = "10s"
# The run ends this long after its last request: a rate over IDLE_RATE_INTERVAL at the end of the
# run sees no traffic, and has samples enough (3) to tell 0 from nothing even if one scrape is late.
IDLE_S = 4 * SCRAPE_INTERVAL_S
IDLE_RATE_INTERVAL = "3s"
RAGGED_CLIENTS = 4
QUIET_PAUSE_S = 0.05
# Each sidecar's --max-queue-items: more than the load's clients keep queued, less than a burst.
MAX_QUEUE_ITEMS = 32
# A burst: this many requests of MAX_QUEUE_ITEMS items at once, sent until one is refused.
BURST_REQUESTS = 16
BURST_TRIES = 20


@dataclass(frozen=True)
class LiveRun:
    prometheus: Prometheus
    start: float  # unix seconds, before the load
    end: float  # unix seconds, after the last scrape of the load


def _post(sidecar_url: str, body: bytes, model: str = MODEL) -> int:
    request = urllib.request.Request(
        f"{sidecar_url}/v2/models/{model}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            status: int = reply.status
    except urllib.error.HTTPError as error:
        status = error.code
    return status


def _bad_requests(sidecar_url: str, count: int) -> None:
    """Malformed inference requests: each one is a 400 and a bad_request rejection."""
    for _ in range(count):
        assert _post(sidecar_url, b"{not json") == 400


def _ragged_requests(sidecar_url: str, seconds: float, seed: int) -> int:
    """Requests of 5 to 8 values (one length bucket) until `seconds` pass; returns the count."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < deadline and sent < 10_000:
        length = rng.randint(5, 8)
        tensor = {"name": "input", "datatype": "FP32", "shape": [1, length], "data": [1.0] * length}
        assert _post(sidecar_url, json.dumps({"inputs": [tensor]}).encode()) == 200
        sent += 1
    return sent


def _quiet_requests(sidecar_url: str, seconds: float) -> int:
    """One client, one 4-value item at a time with a pause between, until `seconds` pass."""
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}
    body = json.dumps({"inputs": [tensor]}).encode()
    deadline = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < deadline and sent < 1_000:
        assert _post(sidecar_url, body, QUIET_MODEL) == 200
        sent += 1
        time.sleep(QUIET_PAUSE_S)
    return sent


def _refused_bursts(sidecar_url: str, model: str) -> int:
    """Bursts of BURST_REQUESTS requests that each fill the queue, until some are refused (429);
    returns how many were."""
    tensor = {
        "name": "input",
        "datatype": "FP32",
        "shape": [MAX_QUEUE_ITEMS, 4],
        "data": [1.0] * (4 * MAX_QUEUE_ITEMS),
    }
    body = json.dumps({"inputs": [tensor]}).encode()
    with ThreadPoolExecutor(max_workers=BURST_REQUESTS) as pool:
        for _ in range(BURST_TRIES):
            statuses = list(
                pool.map(lambda _: _post(sidecar_url, body, model), range(BURST_REQUESTS))
            )
            assert set(statuses) <= {200, 429}, statuses
            if 429 in statuses:
                return statuses.count(429)
    raise AssertionError(f"{model}: {BURST_TRIES} bursts and no request refused")


def _load(sidecar_url: str, quiet_url: str, seconds: float, concurrency: int) -> None:
    """`carpool bench` (fixed-length items) alongside a few clients sending ragged items, and
    one slow client of the quiet model."""
    args = [sys.executable, "-m", "carpool", "bench", "--url", sidecar_url]
    args += ["--model-name", MODEL, "--payload", "toy", "--quiet", "--metrics-url", "none"]
    args += ["--concurrency", str(concurrency), "--duration", str(seconds), "--warmup", "0"]
    bench = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with ThreadPoolExecutor(max_workers=RAGGED_CLIENTS + 1) as pool:
            quiet = pool.submit(_quiet_requests, quiet_url, seconds)
            counts = pool.map(
                lambda seed: _ragged_requests(sidecar_url, seconds, seed), range(RAGGED_CLIENTS)
            )
            sent = sum(counts)
            quiet_sent = quiet.result()
        output, _ = bench.communicate(timeout=seconds + 60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 0, f"carpool bench failed:\n{output}"
    assert sent > 0 and quiet_sent > 0


@contextmanager
def live_metrics(
    tmp_path: Path, load_seconds: float = 12.0, concurrency: int = 16
) -> Iterator[LiveRun]:
    metrics_ports = {MODEL: free_port(), QUIET_MODEL: free_port()}
    env = {"PYTHONPATH": str(HERE)}
    bounded = ("--max-queue-items", str(MAX_QUEUE_ITEMS))
    quiet_path = tmp_path / QUIET_MODEL
    quiet_path.mkdir()
    with (
        run_pair(
            tmp_path,
            HANDLER,
            # An objective no request misses: the latency objective's panels have data.
            "--latency-objective-ms",
            "10000",
            *bounded,
            model_args=("--metrics-port", str(metrics_ports[MODEL])),
            env=env,
            model=MODEL,
        ) as pair,
        run_pair(
            quiet_path,
            HANDLER,
            *bounded,
            model_args=("--metrics-port", str(metrics_ports[QUIET_MODEL])),
            env=env,
            model=QUIET_MODEL,
        ) as quiet,
    ):
        sidecar = pair.sidecar.url
        jobs = {
            "sidecar": [url.removeprefix("http://") for url in (sidecar, quiet.sidecar.url)],
            "model-server": [f"127.0.0.1:{port}" for port in metrics_ports.values()],
        }
        with run_prometheus(tmp_path, jobs, scrape_interval_s=SCRAPE_INTERVAL_S) as prometheus:
            prometheus.wait_for_targets(timeout_s=30)
            start = time.time()
            _bad_requests(sidecar, 3)
            _load(sidecar, quiet.sidecar.url, load_seconds, concurrency)
            _refused_bursts(sidecar, MODEL)
            _refused_bursts(quiet.sidecar.url, QUIET_MODEL)
            _bad_requests(sidecar, 3)
            # Let the last samples of the load be scraped, and end on a quiet stretch.
            time.sleep(IDLE_S)
            yield LiveRun(prometheus, start, time.time())
