"""`carpool serve` at its edges: a port another server holds, and a SIGTERM under load.

One implementation for the quick tests (`test_serve_edges.py`) and the soaks
(`bench/soak.py serve_port`, `bench/soak.py serve_drain`). `carpool serve --handler toy`
runs as a user runs it: the console script, from a folder outside the repository. The other
server is the kind a user forgets in another terminal: it answers every GET with 200, the
readiness probe included.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import psutil
from reliability.traffic import Outcome, call, rows_for, statuses
from support.sidecar import Sidecar

from carpool import processes
from carpool.processes import free_port, http_ok

POLL_S = 0.02
START_TIMEOUT_S = 60.0
_RESTART = re.compile(r"sidecar (?:exited with \d+|was killed by signal \d+) after [\d.]+ s; "
                      r"restarting in ([\d.]+) s")  # fmt: skip


@dataclass(frozen=True)
class PortPlan:
    runs: int = 1  # each: the HTTP port taken, the gRPC port taken, the port taken on a restart
    fails_within_s: float = 10.0  # start -> exit 1: Python's start-up and the check
    restarts: int = 3  # the port stays taken for this many restarts of the sidecar
    ready_again_within_s: float = 15.0  # the port free again -> ready: back-off plus start-up


@dataclass(frozen=True)
class DrainPlan:
    runs: int = 3
    clients: int = 64  # half open a connection per request, half keep theirs alive
    busy_s: float = 1.0  # load before the SIGTERM
    lag_s: float = 0.3  # the clients go on sending this long after it
    exit_within_s: float = 10.0


@dataclass
class TakenRun:
    """`carpool serve` started on a port another server holds."""

    which: str  # "--port" or "--grpc-port"
    exit_code: int | None = None
    seconds: float = 0.0
    output: str = ""


@dataclass
class StolenRun:
    """The sidecar killed once ready, and its port taken before the restart."""

    delays_s: list[float] = field(default_factory=list)  # each restart's back-off
    said_ready: bool = False  # carpool serve's log after the kill
    ready_again_s: float = float("inf")  # port free again -> the pair ready
    log: str = ""


@dataclass
class PortReport:
    taken: list[TakenRun] = field(default_factory=list)
    stolen: list[StolenRun] = field(default_factory=list)


@dataclass
class DrainRun:
    outcomes: list[Outcome] = field(default_factory=list)
    sigterm_at: float = 0.0
    exit_code: int | None = None
    exit_seconds: float = 0.0


class _AlwaysReady(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"ready": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def other_server(port: int) -> Iterator[None]:
    """Another HTTP server on 127.0.0.1:`port`, ready to every probe."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _AlwaysReady)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _command(port: int, grpc_port: int) -> list[str]:
    script = Path(sys.executable).parent / "carpool"
    command = [str(script), "serve", "--handler", "toy", "--torch-threads", "1"]
    return [*command, "--port", str(port), "--grpc-port", str(grpc_port)]


def _start(folder: Path, port: int, grpc_port: int) -> tuple[subprocess.Popen[bytes], Path]:
    log = folder / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            _command(port, grpc_port), stdout=out, stderr=subprocess.STDOUT, cwd=folder
        )
    return process, log


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def run_ports(folder: Path, plan: PortPlan) -> PortReport:
    report = PortReport()
    for index in range(plan.runs):
        for which in ("--port", "--grpc-port"):
            run_folder = folder / f"taken-{which.strip('-')}-{index}"
            run_folder.mkdir()
            report.taken.append(_taken(run_folder, which, plan))
        run_folder = folder / f"stolen-{index}"
        run_folder.mkdir()
        report.stolen.append(_stolen(run_folder, plan))
    return report


def _taken(folder: Path, which: str, plan: PortPlan) -> TakenRun:
    run = TakenRun(which)
    held = free_port()
    port, grpc_port = (held, free_port()) if which == "--port" else (free_port(), held)
    with other_server(held):
        started = time.monotonic()
        process, log = _start(folder, port, grpc_port)
        try:
            with suppress(subprocess.TimeoutExpired):
                run.exit_code = process.wait(plan.fails_within_s * 3)
        finally:
            run.seconds = time.monotonic() - started
            processes.stop(process, 30)
    run.output = log.read_text(errors="replace")
    return run


def _stolen(folder: Path, plan: PortPlan) -> StolenRun:
    run = StolenRun()
    port = free_port()
    ready_url = f"http://127.0.0.1:{port}/v2/health/ready"
    process, log = _start(folder, port, free_port())
    try:
        if not _wait_for(lambda: " ready at " in log.read_text(errors="replace"), START_TIMEOUT_S):
            run.log = log.read_text(errors="replace")
            return run
        mark = len(log.read_text(errors="replace"))
        sidecar = next(
            c for c in psutil.Process(process.pid).children() if "sidecar" in c.cmdline()
        )
        sidecar.kill()
        sidecar.wait(10)
        with other_server(port):
            _wait_for(
                lambda: (
                    len(_RESTART.findall(log.read_text(errors="replace")[mark:])) >= plan.restarts
                ),
                START_TIMEOUT_S,
            )
        freed_at = time.monotonic()
        if _wait_for(lambda: http_ok(ready_url, 1.0), plan.ready_again_within_s * 2):
            run.ready_again_s = time.monotonic() - freed_at
        after = log.read_text(errors="replace")[mark:]
        run.delays_s = [float(delay) for delay in _RESTART.findall(after)]
        run.said_ready = " ready at " in after
        run.log = after
    finally:
        processes.stop(process, 30)
    return run


def port_summary(report: PortReport) -> str:
    lines = [
        f"{run.which} taken: exit {run.exit_code} after {run.seconds:.2f} s: "
        f"{run.output.strip().splitlines()[-1:] or ''}"
        for run in report.taken
    ]
    lines += [
        f"port taken at the sidecar's restart: back-off {run.delays_s} s; ready "
        f"{run.ready_again_s:.2f} s after the port was free"
        for run in report.stolen
    ]
    return "\n".join(lines)


def port_broken_promises(report: PortReport, plan: PortPlan) -> list[str]:
    broken = []
    for run in report.taken:
        lines = run.output.strip().splitlines()
        flag_port = re.search(r"port (\d+)", run.output)
        if run.exit_code != 1 or run.seconds >= plan.fails_within_s:
            broken.append(f"{run.which} taken: exit {run.exit_code} after {run.seconds:.2f} s")
        if " ready at " in run.output:
            broken.append(f"{run.which} taken: said ready: {run.output[-500:]!r}")
        if len(lines) != 1 or flag_port is None or run.which not in run.output:
            broken.append(f"{run.which} taken: not one line naming the port: {lines[-5:]}")
    for stolen in report.stolen:
        delays = stolen.delays_s
        if len(delays) < plan.restarts or any(b != 2 * a for a, b in itertools.pairwise(delays)):
            broken.append(f"port taken at a restart: back-off {delays}, not doubling")
        if stolen.said_ready:
            broken.append("port taken at a restart: carpool serve said ready again")
        if stolen.ready_again_s >= plan.ready_again_within_s:
            broken.append(f"ready {stolen.ready_again_s:.2f} s after the port was free again")
    return broken


def run_drains(folder: Path, plan: DrainPlan) -> list[DrainRun]:
    runs = []
    for index in range(plan.runs):
        run_folder = folder / f"drain-{index}"
        run_folder.mkdir()
        runs.append(asyncio.run(_drain(run_folder, plan, index)))
    return runs


async def _drain(folder: Path, plan: DrainPlan, index: int) -> DrainRun:
    run = DrainRun()
    port = free_port()
    process, log = _start(folder, port, free_port())
    try:
        ready = await asyncio.to_thread(
            _wait_for, lambda: " ready at " in log.read_text(errors="replace"), START_TIMEOUT_S
        )
        assert ready, log.read_text(errors="replace")
        target = Sidecar(process, f"http://127.0.0.1:{port}", "toy", log, "")
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as new,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as kept,
        ):
            stop = asyncio.Event()
            clients = [
                asyncio.create_task(
                    _client(
                        kept if i % 2 else new, target, random.Random(index * 100 + i), stop, run
                    )
                )
                for i in range(plan.clients)
            ]
            await asyncio.sleep(plan.busy_s)
            run.sigterm_at = time.monotonic()
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(plan.lag_s)
            stop.set()
            with suppress(subprocess.TimeoutExpired):
                run.exit_code = await asyncio.to_thread(process.wait, plan.exit_within_s * 3)
            run.exit_seconds = time.monotonic() - run.sigterm_at
            await asyncio.gather(*clients)
    finally:
        processes.stop(process, 30)
    return run


async def _client(
    http: aiohttp.ClientSession,
    target: Sidecar,
    rng: random.Random,
    stop: asyncio.Event,
    run: DrainRun,
) -> None:
    while not stop.is_set():
        outcome = await call(http, target, rows_for(rng, 1), 30)
        run.outcomes.append(outcome)
        if outcome.status is None:
            await asyncio.sleep(0.01)  # refused: the port is closed; do not spin


def _before(run: DrainRun) -> list[Outcome]:
    return [outcome for outcome in run.outcomes if outcome.started < run.sigterm_at]


def drain_summary(runs: list[DrainRun]) -> str:
    lines = []
    for run in runs:
        before = _before(run)
        after = [o for o in run.outcomes if o.started >= run.sigterm_at]
        lines.append(
            f"sent before the SIGTERM: {len(before)} {dict(statuses(before))}; after it: "
            f"{len(after)} {dict(statuses(after))}; exit {run.exit_code} after "
            f"{run.exit_seconds:.2f} s"
        )
    return "\n".join(lines)


def drain_broken_promises(runs: list[DrainRun], plan: DrainPlan) -> list[str]:
    broken = []
    for run in runs:
        if run.exit_code != 0 or run.exit_seconds >= plan.exit_within_s:
            broken.append(f"exit {run.exit_code} after {run.exit_seconds:.2f} s")
        for outcome in _before(run):
            if outcome.status != 200 or not outcome.correct:
                broken.append(
                    f"sent {run.sigterm_at - outcome.started:.3f} s before the SIGTERM: "
                    f"{outcome.status} {outcome.error}"
                )
    return broken
