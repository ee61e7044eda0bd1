"""`carpool serve`: the model server and the sidecar as two local processes over a UDS.

The same pair the operator puts in a pod: the sidecar on TCP, the model server on a Unix
socket in a temporary folder. SIGINT/SIGTERM are forwarded (sidecar first, so it drains),
and both children are always stopped on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import click

from carpool.sidecar.demo import report_lines, run_demo

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 40.0
# Batching flags handed to the sidecar as given.
BATCHING_FLAGS = (
    ("max-batch-size", int),
    ("max-wait-ms", float),
    ("max-inflight-batches", int),
    ("max-queue-items", int),
    ("timeout-ms", float),
    ("max-batch-tokens", int),
)
# Model server flags handed on as given; --max-batch-size goes to both processes.
MODEL_FLAGS = ["model-path", "device", "torch-threads", "max-batch-size"]


def _batching_options(function: click.decorators.FC) -> click.decorators.FC:
    for flag, kind in reversed(BATCHING_FLAGS):
        function = click.option(f"--{flag}", type=kind, help="passed to the sidecar")(function)
    return click.option("--dispatch", type=click.Choice(["adaptive", "fixed"]))(function)


@click.command("serve")
@click.option("--handler", required=True, help="model server handler, e.g. text-embedding")
@click.option("--model-name", help="name in URLs (default: the handler name)")
@click.option("--model-path", help="model file, for the torchscript handler")
@click.option("--device", help="auto | cpu | cuda:N (model server default: auto)")
@click.option("--torch-threads", type=int, help="torch intra-op threads (default: torch's)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--grpc-port", default=8081, show_default=True, type=int, help="0: no gRPC")
@_batching_options
@click.option("--demo-load", is_flag=True, help="send a short load, print a report, stop")
@click.option("--demo-clients", default=32, show_default=True, type=int)
@click.option("--demo-seconds", default=5.0, show_default=True, type=float)
@click.option("--demo-requests", default=5000, show_default=True, type=int, help="at most")
def command(
    handler: str,
    model_name: str | None,
    host: str,
    port: int,
    grpc_port: int,
    demo_load: bool,
    demo_clients: int,
    demo_seconds: float,
    demo_requests: int,
    **passed: object,
) -> None:
    """Run a model server and its sidecar locally, as in a pod."""
    name = model_name or handler
    carpool = [sys.executable, "-m", "carpool"]
    model = [*carpool, "model-server", "--handler", handler, "--model-name", name]
    sidecar = [*carpool, "sidecar", "--model-name", name, "--host", host, "--port", str(port)]
    sidecar += ["--grpc-port", str(grpc_port)]
    model += _flags(passed, MODEL_FLAGS)
    sidecar += _flags(passed, [flag for flag, _ in BATCHING_FLAGS] + ["dispatch"])
    demo = Demo(demo_clients, demo_seconds, demo_requests) if demo_load else None
    if demo is not None:
        threads = passed["torch_threads"] or "torch default"
        click.echo(f"demo load: {demo.clients} clients, torch threads: {threads}")
    sys.exit(asyncio.run(_serve(model, sidecar, f"http://{host}:{port}", name, demo)))


@dataclass(frozen=True, slots=True)
class Demo:
    clients: int
    seconds: float
    requests: int


def _flags(values: dict[str, object], flags: list[str]) -> list[str]:
    """`--flag value` for each flag the user gave."""
    args = []
    for flag in flags:
        value = values[flag.replace("-", "_")]
        if value is not None:
            args += [f"--{flag}", str(value)]
    return args


async def _serve(
    model_args: list[str], sidecar_args: list[str], url: str, name: str, demo: Demo | None
) -> int:
    with tempfile.TemporaryDirectory(prefix="carpool-") as folder:
        socket = Path(folder) / "model.sock"
        # New sessions: a terminal's Ctrl-C reaches only us, and we stop the children in order.
        model = await asyncio.create_subprocess_exec(
            *model_args, "--socket", str(socket), start_new_session=True
        )
        sidecar = await asyncio.create_subprocess_exec(
            *sidecar_args, "--model-server", f"unix://{socket}", start_new_session=True
        )
        children = [sidecar, model]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            if not await _wait_ready(url, children, stop):
                return 1
            click.echo(f"carpool: {name!r} ready at {url}/v2/models/{name}/infer", err=True)
            if demo is not None:
                cell = await run_demo(url, name, demo.clients, demo.seconds, demo.requests)
                for line in report_lines(cell):
                    click.echo(line)
                return 0 if cell.ok == cell.requests else 1
            return await _until_stopped(children, stop)
        finally:
            for child in children:
                await _stop(child)


async def _until_stopped(children: list[asyncio.subprocess.Process], stop: asyncio.Event) -> int:
    """0 after a signal; 1 when a child exits on its own."""
    waits = [asyncio.create_task(child.wait()) for child in children]
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([stopping, *waits], return_when=asyncio.FIRST_COMPLETED)
    for task in [stopping, *waits]:
        task.cancel()
    await asyncio.gather(stopping, *waits, return_exceptions=True)
    return 0 if stop.is_set() else 1


async def _wait_ready(
    url: str, children: list[asyncio.subprocess.Process], stop: asyncio.Event
) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while time.monotonic() < deadline and not stop.is_set():
            if any(child.returncode is not None for child in children):
                click.echo("carpool: a child process exited before ready", err=True)
                return False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(f"{url}/v2/health/ready") as reply:
                    if reply.status == 200:
                        return True
            await asyncio.sleep(0.2)
    if not stop.is_set():
        click.echo(f"carpool: not ready after {READY_TIMEOUT_S:.0f} s", err=True)
    return False


async def _stop(child: asyncio.subprocess.Process) -> None:
    if child.returncode is None:
        child.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await child.wait()
        except TimeoutError:
            child.kill()
            await child.wait()
