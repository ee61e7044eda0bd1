"""Start a real Prometheus for a test, scraping local targets every second, and query it.

    with run_prometheus(tmp_path, {"sidecar": ["127.0.0.1:8080"]}) as prom:
        prom.wait_for_targets(timeout_s=30)               # every target scraped and up
        series = prom.query('sum(rate(carpool_requests_total[10s]))')   # instant vector
        matrix = prom.query_range(expr, start, end, step_s=1.0)

`run_prometheus(tmp_path, jobs, scrape_interval_s=1)` runs `.cache/tools/bin/prometheus` on a
free 127.0.0.1 port with its storage under `tmp_path`, waits for `/-/ready`, and stops it
(SIGTERM, then SIGKILL) on exit. `prom.log()` returns its output, for assertion messages.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from carpool import processes
from carpool.processes import free_port

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / ".cache" / "tools" / "bin" / "prometheus"

# One element of a Prometheus result: {"metric": {labels}, "value": [t, "v"]} for a vector,
# {"metric": {labels}, "values": [[t, "v"], ...]} for a matrix.
Series = dict[str, Any]


class QueryError(AssertionError):
    """Prometheus refused a query (bad PromQL); the message carries its error text."""


@dataclass(frozen=True)
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str, params: Mapping[str, str], timeout_s: float = 10.0) -> Any:
        """GET /api/v1/<path>; return `data`, or raise QueryError with Prometheus' message."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(
                f"{self.url}/api/v1/{path}?{query}", timeout=timeout_s
            ) as r:
                body = json.load(r)
        except urllib.error.HTTPError as error:
            body = json.load(error)
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """An instant query: one sample per series, at `at` (default: now)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", params)
        result: list[Series] = data["result"] if data["resultType"] in {"vector", "matrix"} else []
        return result

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """A range query, as Grafana runs a panel: one series per label set, `values` in order."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step_s)}
        result: list[Series] = self.api("query_range", params)["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets", {"state": "active"})["activeTargets"]
        return active

    def wait_for_targets(self, timeout_s: float = 30.0) -> None:
        """Until every configured target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return
            time.sleep(0.2)
        raise AssertionError(f"Prometheus targets not up after {timeout_s}s: {self.targets()}")


def _config(
    jobs: Mapping[str, Sequence[str]],
    scrape_interval_s: float,
    labels: Mapping[str, Mapping[str, str]],
) -> str:
    """prometheus.yml as JSON (a subset of YAML): one static job per name, with its labels."""
    interval = f"{int(scrape_interval_s * 1000)}ms"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": name,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [
                    {"targets": list(targets), "labels": dict(labels.get(name, {}))}
                ],
            }
            for name, targets in jobs.items()
        ],
    }
    return json.dumps(config, indent=2)


@contextmanager
def run_prometheus(
    tmp_path: Path,
    jobs: Mapping[str, Sequence[str]],
    scrape_interval_s: float = 1.0,
    timeout_s: float = 30.0,
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[Prometheus]:
    """`labels`: target labels per job, as Kubernetes discovery adds namespace and pod."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    config = folder / "prometheus.yml"
    config.write_text(_config(jobs, scrape_interval_s, labels or {}))
    port = free_port()
    args = [
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    log_path = folder / "prometheus.log"
    process = processes.spawn(args, log_path)
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log_path)
    try:
        _wait_ready(prometheus, timeout_s)
        yield prometheus
    finally:
        _stop(prometheus)


def _wait_ready(prometheus: Prometheus, timeout_s: float) -> None:
    ready = f"{prometheus.url}/-/ready"
    try:
        processes.wait_ready(
            [prometheus.process], lambda: processes.http_ok(ready), timeout_s, "prometheus"
        )
    except processes.NotReady as error:
        raise AssertionError(f"{error}:\n{prometheus.log()}") from None


def _stop(prometheus: Prometheus, timeout_s: float = 10.0) -> None:
    processes.stop(prometheus.process, timeout_s)


def _handler(body: bytes) -> type[BaseHTTPRequestHandler]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every second would flood the test output

    return Metrics


@contextmanager
def static_exporter(body: bytes) -> Iterator[str]:
    """A `/metrics` endpoint on 127.0.0.1 serving the exposition text `body`; yields host:port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(body))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
