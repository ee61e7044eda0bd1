"""Start a real `carpool model-server` process for a test, and talk to it.

    with run_model_server(tmp_path, "toy") as server:       # waits until /readyz is 200
        results = await post_batch(server, [item, ...])      # list[ItemResult], same order
        status, body = http_get(server, "/metrics")

`run_model_server(tmp_path, handler, *extra_args, tcp=False, metrics_port=False, env=None,
wait_ready=True, timeout_s=60)` listens on `tmp_path/model.sock` (or a free 127.0.0.1 port
with `tcp=True`), always with `--torch-threads 1`, and is stopped (SIGTERM, then SIGKILL)
on exit. `server.log()` returns the process output, for assertion messages. Extra
environment (e.g. PYTHONPATH for a `module:Class` handler from tests/support) goes in `env`.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from carpool import processes
from carpool.contract import wire
from carpool.processes import free_port

__all__ = ["free_port"]  # re-exported: tests import it from here

SUPPORT_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ModelServer:
    process: subprocess.Popen[bytes]
    socket: Path | None  # the data listener's Unix socket, or None with tcp=True
    url: str  # base URL of the data listener (over the socket when there is one)
    metrics_url: str | None  # base URL of the probe listener, with metrics_port=True
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def http_get(server: ModelServer, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """A blocking GET on the data listener: (status, body)."""
    connection = _connection(server, timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


async def post_body(
    server: ModelServer | Path, body: bytes, timeout_s: float = 30.0
) -> tuple[int, bytes]:
    """POST raw bytes to /batch: (status, body). For malformed-body tests."""
    socket_path, url = _target(server)
    connector = aiohttp.UnixConnector(path=str(socket_path)) if socket_path else None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        headers = {"Content-Type": wire.CONTENT_TYPE}
        async with session.post(f"{url}/batch", data=body, headers=headers) as response:
            return response.status, await response.read()


async def post_batch(
    server: ModelServer | Path, items: Sequence[wire.Item], timeout_s: float = 30.0
) -> list[wire.ItemResult]:
    """Send one batch; return one result per item, in order. Raises on a non-200 answer."""
    status, body = await post_body(server, wire.encode_request(items), timeout_s)
    if status != 200:
        raise AssertionError(f"/batch answered {status}: {body[:500]!r}")
    return wire.decode_response(body)


@contextmanager
def run_model_server(
    tmp_path: Path,
    handler: str = "toy",
    *extra_args: str,
    tcp: bool = False,
    metrics_port: bool = False,
    env: Mapping[str, str] | None = None,
    wait_ready: bool = True,
    timeout_s: float = 60.0,
) -> Iterator[ModelServer]:
    args = processes.carpool_command("model-server", "--handler", handler)
    args += ["--torch-threads", "1", *extra_args]
    socket_path: Path | None = None
    if tcp:
        port = free_port()
        args += ["--port", str(port)]
        url = f"http://127.0.0.1:{port}"
    else:
        socket_path = tmp_path / "model.sock"
        args += ["--socket", str(socket_path)]
        url = "http://localhost"
    metrics_url = None
    if metrics_port:
        probe_port = free_port()
        args += ["--metrics-port", str(probe_port)]
        metrics_url = f"http://127.0.0.1:{probe_port}"
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    log_path = tmp_path / f"model-server-{len(list(tmp_path.glob('model-server-*.log')))}.log"
    process = processes.spawn(args, log_path, offline)
    server = ModelServer(process, socket_path, url, metrics_url, log_path)
    try:
        if wait_ready:
            wait_until_ready(server, timeout_s)
        yield server
    finally:
        stop(server)


def wait_until_ready(server: ModelServer, timeout_s: float = 60.0) -> None:
    def ready() -> bool:
        try:
            return http_get(server, "/readyz", timeout_s=2.0)[0] == 200
        except OSError:
            return False  # not listening yet

    try:
        processes.wait_ready([server.process], ready, timeout_s, "model server")
    except processes.NotReady as error:
        raise AssertionError(f"{error}:\n{server.log()}") from None


def stop(server: ModelServer, timeout_s: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it lingers; returns the exit code."""
    return processes.stop(server.process, timeout_s)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout_s: float) -> None:
        super().__init__("localhost", timeout=timeout_s)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self.socket_path))
        self.sock = sock


def _connection(server: ModelServer, timeout_s: float) -> http.client.HTTPConnection:
    if server.socket is not None:
        return _UnixConnection(server.socket, timeout_s)
    host, _, port = server.url.removeprefix("http://").partition(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout_s)


def _target(server: ModelServer | Path) -> tuple[Path | None, str]:
    if isinstance(server, Path):
        return server, "http://localhost"
    return server.socket, server.url
