"""`carpool serve`: the model server and the sidecar as two local processes over a UDS.

The same pair the operator puts in a pod: the sidecar on TCP, the model server on a Unix
socket in a temporary folder. Once the pair was ready, a child that exits is restarted with
backoff, as a kubelet restarts a container (`carpool.supervisor`); meanwhile the sidecar
answers 503. SIGINT/SIGTERM stop the children (sidecar first, so it drains). If `carpool
serve` itself is killed, even by SIGKILL, the kernel kills the children
(`processes.spawn(die_with_parent=True)`) and a guard removes the folder
(`carpool.guarded_folder`).

Its ports must be its own (`carpool.ports`): one another server holds is refused before
anything starts, and the pair counts as ready only while its sidecar listens on them, so
another server's answer to the readiness probe neither makes it say ready nor ends a crash
loop's back-off.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import NoReturn

import click

from carpool import ports, processes
from carpool.contract import pod
from carpool.demo import report_lines, run_demo
from carpool.guarded_folder import guarded_folder
from carpool.knob_flags import knob_arguments, knob_options
from carpool.supervisor import Supervised

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 40.0
# How often a running pair is checked for a child that exited on its own.
WATCH_S = 0.2
# Model server flags handed on as given; --max-batch-size goes to both processes.
MODEL_FLAGS = [
    "handler-options", "model-path", "device", "dtype", "torch-threads", "max-batch-size",
]  # fmt: skip
# No load balancer to wait for locally, but a request already sent when the signal comes
# (in the listen backlog, or on a kept-alive connection) is read only on a later turn of
# the sidecar's loop: with no delay at all, closing the port reset it or answered 503.
DRAIN_DELAY_S = 0.5


@click.command("serve")
@click.option("--handler", required=True, help="model server handler, e.g. text-embedding")
@click.option("--handler-options", help="the handler's own key=value,... (e.g. stand-in's)")
@click.option("--model-name", help="name in URLs (default: the handler name)")
@click.option(
    "--model-path",
    help="the model's file (torchscript, torch-export) or folder (text-embedding, "
    "text-classification, image-classification, text-generation)",
)
@click.option("--device", help="auto | cpu | cuda:N (model server default: auto)")
@click.option("--dtype", help="fp32 | fp16 | bf16 (model server default: fp32; fp16 needs CUDA)")
@click.option("--torch-threads", type=int, help="torch intra-op threads (default: torch's)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--grpc-port", default=pod.GRPC_PORT, show_default=True, type=int, help="0: no gRPC")
@click.option(
    "--front-processes",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="sidecar processes that serve REST (>1: one more runs the batching)",
)
@knob_options(None)
@click.option(
    "--config-file",
    type=click.Path(dir_okay=False),
    help="the sidecar's batching settings JSON, reloaded live (as `carpool tune` rewrites it)",
)
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
    front_processes: int,
    config_file: str | None,
    demo_load: bool,
    demo_clients: int,
    demo_seconds: float,
    demo_requests: int,
    **passed: object,
) -> None:
    """Run a model server and its sidecar locally, as in a pod."""
    name = model_name or handler
    listening = {"--port": port} | ({"--grpc-port": grpc_port} if grpc_port else {})
    if grpc_port == port:
        _fail(f"--grpc-port {port} is --port too; give each its own")
    for flag, number in listening.items():
        if (why := ports.taken(host, number)) is not None:
            _fail(
                f"port {number} on {host} is taken ({why}): another server listens there; "
                f"choose another with {flag}"
            )
    model = ["model-server", "--handler", handler, "--model-name", name]
    sidecar = ["sidecar", "--model-name", name, "--host", host, "--port", str(port)]
    sidecar += ["--grpc-port", str(grpc_port), "--drain-delay-seconds", str(DRAIN_DELAY_S)]
    sidecar += ["--front-processes", str(front_processes)]
    model += _flags(passed, MODEL_FLAGS)
    sidecar += knob_arguments(passed)
    if config_file is not None:
        sidecar += ["--config-file", config_file]
    demo = Demo(demo_clients, demo_seconds, demo_requests) if demo_load else None
    if demo is not None:
        threads = passed["torch_threads"] or "torch default"
        click.echo(f"demo load: {demo.clients} clients, torch threads: {threads}")
    sys.exit(_serve(model, sidecar, f"http://{host}:{port}", name, demo, list(listening.values())))


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


def _serve(
    model_args: list[str],
    sidecar_args: list[str],
    url: str,
    name: str,
    demo: Demo | None,
    owned: list[int],
) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with guarded_folder("carpool-") as folder, ExitStack() as children:
        socket = folder / "model.sock"
        # Entered in this order, so the sidecar stops (and drains) before its model server.
        model = _child(children, "model server", *model_args, "--socket", str(socket))
        sidecar = _child(children, "sidecar", *sidecar_args, "--model-server", f"unix://{socket}")
        ready_url = f"{url}/v2/health/ready"

        def ready() -> bool:
            # Our sidecar's answer only: not another server's on a port it took meanwhile.
            mine = all(ports.listens(sidecar.process.pid, port) for port in owned)
            return mine and processes.http_ok(ready_url)

        try:
            if not processes.wait_ready(
                [model.process, sidecar.process], ready, READY_TIMEOUT_S, "carpool", stop
            ):
                # A signal is a stop asked for, whenever it comes: as clean as after ready.
                click.echo("carpool: stopped before the model was ready", err=True)
                return 0
        except processes.NotReady as error:
            # Before the first ready, an exit means a bad flag or model: no restarts.
            click.echo(f"carpool: {error}", err=True)
            return 1
        click.echo(f"carpool: {name!r} ready at {url}/v2/models/{name}/infer", err=True)
        if demo is not None:
            cell = asyncio.run(run_demo(url, name, demo.clients, demo.seconds, demo.requests))
            for line in report_lines(cell):
                click.echo(line)
            return 0 if cell.ok == cell.requests else 1
        # The children are spawned and restarted from this (the main) thread, which outlives
        # them: the kernel's parent-death signal follows the thread that forked.
        while not stop.wait(WATCH_S):
            now = time.monotonic()
            model.tend(now, ready)
            sidecar.tend(now, ready)
        return 0


def _fail(message: str) -> NoReturn:
    """One line saying why `carpool serve` cannot start, before it starts anything; exit 1."""
    _log(message)
    sys.exit(1)


def _child(children: ExitStack, name: str, *args: str) -> Supervised:
    child = Supervised(name, processes.carpool_command(*args), _log, STOP_TIMEOUT_S)
    children.callback(child.stop)
    return child


def _log(message: str) -> None:
    click.echo(f"carpool: {message}", err=True)
