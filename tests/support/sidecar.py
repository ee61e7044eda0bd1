"""Start a real `carpool sidecar` (with its model server) for a test, and read its metrics.

    with run_pair(tmp_path, "toy", "--max-batch-size", "4") as pair:   # both ready
        async with aiohttp.ClientSession() as http:
            status, body = await infer(http, pair.sidecar, [[1, 2, 3, 4]])
        assert metric(pair.sidecar, "carpool_batches_total", reason="idle") == 1

`run_pair(tmp_path, handler, *sidecar_args, model_args=(), env=None)` starts the model
server with `support.model_server.run_model_server` on `tmp_path/model.sock`, then the
sidecar on a free 127.0.0.1 port, and waits until the sidecar says ready.
`run_sidecar(tmp_path, model_url, *args)` starts only a sidecar, for tests that stop and
restart the model server under it. Processes are stopped (SIGTERM, then SIGKILL) on exit;
`sidecar.log()` returns the sidecar's output for assertion messages.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from carpool import processes
from carpool.processes import free_port
from support.model_server import ModelServer, http_get, run_model_server


@dataclass(frozen=True)
class Sidecar:
    process: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    model: str
    log_path: Path
    grpc: str  # its gRPC front, 127.0.0.1:PORT (none listens if args gave --grpc-port 0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass(frozen=True)
class Pair:
    model_server: ModelServer
    sidecar: Sidecar


def get(sidecar: Sidecar, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """A blocking GET: (status, body); never raises on 4xx/5xx."""
    try:
        with urllib.request.urlopen(sidecar.url + path, timeout=timeout_s) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def metric(sidecar: Sidecar, name: str, **labels: str) -> float:
    """The value of one sample of the sidecar's /metrics (0 when absent), label model implied."""
    return served_metric(sidecar.url, sidecar.model, name, **labels)


def served_metric(url: str, model: str, name: str, **labels: str) -> float:
    """`metric` of the sidecar at `url`, however it was started (e.g. by `carpool serve`)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5.0) as reply:
        body = reply.read()
    wanted = {"model": model, **labels}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                return float(sample.value)
    return 0.0


def wait_for(
    condition: Callable[[], object], timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Poll a zero-argument callable until it returns true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


def v2_body(rows: Sequence[Sequence[float]], **extra: Any) -> dict[str, Any]:
    """An OIP v2 JSON request for the toy model: one FP32 row of 4 per item."""
    shape = [len(rows), len(rows[0]) if rows else 0]
    data = [value for row in rows for value in row]
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": shape, "data": data}],
        **extra,
    }


async def infer(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    rows: Sequence[Sequence[float]],
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> tuple[int, Any]:
    """POST a toy v2 JSON request through the sidecar: (status, decoded JSON body)."""
    url = f"{sidecar.url}/v2/models/{sidecar.model}/infer"
    async with http.post(url, json=v2_body(rows, **extra), headers=headers) as reply:
        return reply.status, await reply.json(content_type=None)


@contextmanager
def run_sidecar(
    tmp_path: Path,
    model_url: str,
    *args: str,
    model: str = "toy",
    wait_ready: bool = True,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[Sidecar]:
    port = free_port()
    # A free gRPC port unless the test chose one: sidecars of one run never share 8081.
    grpc_port = str(free_port())
    if "--grpc-port" in args:
        grpc_port = args[args.index("--grpc-port") + 1]
    command = processes.carpool_command("sidecar", "--model-name", model)
    command += ["--model-server", model_url, "--port", str(port), "--grpc-port", grpc_port, *args]
    log_path = tmp_path / f"sidecar-{len(list(tmp_path.glob('sidecar-*.log')))}.log"
    process = processes.spawn(command, log_path, env)
    url = f"http://127.0.0.1:{port}"
    sidecar = Sidecar(process, url, model, log_path, f"127.0.0.1:{grpc_port}")
    try:
        _wait_until_up(sidecar, "/v2/health/ready" if wait_ready else "/v2/health/live", timeout_s)
        yield sidecar
    finally:
        stop(sidecar)


@contextmanager
def run_pair(
    tmp_path: Path,
    handler: str = "toy",
    *sidecar_args: str,
    model_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    model: str = "toy",
    sidecar_env: Mapping[str, str] | None = None,
) -> Iterator[Pair]:
    """Model server (`--model-name model`, environment `env`) and sidecar (`sidecar_env`),
    both ready."""
    with (
        run_model_server(tmp_path, handler, "--model-name", model, *model_args, env=env) as server,
        run_sidecar(
            tmp_path, f"unix://{server.socket}", *sidecar_args, model=model, env=sidecar_env
        ) as sidecar,
    ):
        yield Pair(server, sidecar)


def stop(sidecar: Sidecar, timeout_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL if it lingers; returns the exit code."""
    return processes.stop(sidecar.process, timeout_s)


def _wait_until_up(sidecar: Sidecar, path: str, timeout_s: float) -> None:
    up = sidecar.url + path
    try:
        processes.wait_ready([sidecar.process], lambda: processes.http_ok(up), timeout_s, "sidecar")
    except processes.NotReady as error:
        raise AssertionError(f"{error} ({path}):\n{sidecar.log()}") from None


def model_items(server: ModelServer) -> float:
    """Items the model server has run (its carpool_model_items_total)."""
    status, body = http_get(server, "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "carpool_model_items_total":
                return float(sample.value)
    return 0.0


async def until(sidecar: Sidecar, name: str, value: float) -> None:
    """Wait, off the event loop, until the sidecar's metric `name` reads `value`."""
    await asyncio.to_thread(
        wait_for, lambda: metric(sidecar, name) == value, 10.0, f"{name} == {value}"
    )
