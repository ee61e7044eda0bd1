"""`carpool serve` as a pod: children restarted after a crash, nothing left after its own death.

One implementation for the quick tests (`test_serving.py`) and the soaks (`bench/soak.py
serve_restart`, `bench/soak.py serve_killed`). `carpool serve --handler toy` runs as a user
runs it: the console script, from a folder that is not the repository.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psutil
from support.sidecar import v2_body

from carpool.processes import free_port, http_ok

POLL_S = 0.02
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RestartPlan:
    model_kills: int = 2
    sidecar_kills: int = 1
    up_seconds: float = 0.5  # serving before each kill: a crash, not a start-up loop
    ready_within_s: float = 5.0  # kill -> ready again, the promise
    answer_503_within_s: float = 1.0  # while the model server is down


@dataclass(frozen=True)
class KilledPlan:
    kills: int = 2
    gone_within_s: float = 2.0  # SIGKILL of the parent -> no child, no folder


@dataclass
class RestartReport:
    ready_again_s: dict[str, list[float]] = field(default_factory=dict)  # child -> each kill
    down_answers: list[tuple[int | None, float]] = field(default_factory=list)
    log: str = ""


@dataclass
class KilledReport:
    gone_s: list[float] = field(default_factory=list)  # each kill; inf when something stayed
    left_behind: list[str] = field(default_factory=list)


@dataclass
class Serve:
    process: subprocess.Popen[str]
    port: int
    log: Path

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v2/health/ready"

    def child(self, subcommand: str) -> psutil.Process:
        """The child running `carpool SUBCOMMAND` (model-server or sidecar)."""
        for child in psutil.Process(self.process.pid).children():
            if subcommand in child.cmdline():
                return child
        raise AssertionError(f"carpool serve has no {subcommand} child; log:\n{self.read_log()}")

    def socket_folder(self) -> Path:
        command = self.child("model-server").cmdline()
        return Path(command[command.index("--socket") + 1]).parent

    def read_log(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def run_serve(folder: Path) -> Iterator[Serve]:
    port = free_port()
    script = Path(sys.executable).parent / "carpool"
    command = [str(script), "serve", "--handler", "toy", "--torch-threads", "1"]
    command += ["--port", str(port), "--grpc-port", str(free_port())]
    env = dict(os.environ)
    log = folder / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=folder
        )
    serve = Serve(process, port, log)
    try:
        # The line a user waits for: before it, a child's exit is a start-up failure.
        _wait(lambda: " ready at " in serve.read_log(), START_TIMEOUT_S, "carpool serve", serve)
        yield serve
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_restarts(folder: Path, plan: RestartPlan) -> RestartReport:
    report = RestartReport()
    with run_serve(folder) as serve:
        for subcommand, kills in (
            ("model-server", plan.model_kills),
            ("sidecar", plan.sidecar_kills),
        ):
            times = report.ready_again_s.setdefault(subcommand, [])
            for _ in range(kills):
                time.sleep(plan.up_seconds)
                serve.child(subcommand).kill()
                killed_at = time.monotonic()
                if subcommand == "model-server":
                    report.down_answers.append(_infer(serve.port))
                _wait(lambda: http_ok(serve.ready_url, 1.0), 60.0, "ready after a kill", serve)
                times.append(time.monotonic() - killed_at)
        report.log = serve.read_log()
    return report


def run_kills(folder: Path, plan: KilledPlan) -> KilledReport:
    report = KilledReport()
    for round_ in range(plan.kills):
        run_folder = folder / f"run-{round_}"
        run_folder.mkdir()
        with run_serve(run_folder) as serve:
            children = psutil.Process(serve.process.pid).children(recursive=True)
            sockets = serve.socket_folder()
            serve.process.kill()
            killed_at = time.monotonic()
            serve.process.wait()

            deadline = killed_at + plan.gone_within_s * 5
            while (left := _left_behind(children, sockets)) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            report.gone_s.append(float("inf") if left else time.monotonic() - killed_at)
            report.left_behind += left
            for child in children:
                if _running(child):
                    child.kill()
    return report


def _left_behind(children: list[psutil.Process], folder: Path) -> list[str]:
    left = [f"pid {child.pid}" for child in children if _running(child)]
    return left + ([str(folder)] if folder.exists() else [])


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _infer(port: int) -> tuple[int | None, float]:
    """One toy request: its status (None: no HTTP answer) and how long it took."""
    url = f"http://127.0.0.1:{port}/v2/models/toy/infer"
    request = urllib.request.Request(url, data=orjson.dumps(v2_body([[1.0, 2.0, 3.0, 4.0]])))
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            status: int | None = reply.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError:
        status = None
    return status, time.monotonic() - started


def _wait(ready: Callable[[], bool], timeout_s: float, what: str, serve: Serve) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if serve.process.poll() is not None:
            raise AssertionError(
                f"carpool serve exited {serve.process.returncode}; log:\n{serve.read_log()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s; log:\n{serve.read_log()}")
        time.sleep(POLL_S)


def restart_summary(report: RestartReport) -> str:
    ready = {name: [f"{s:.2f}" for s in times] for name, times in report.ready_again_s.items()}
    down = [(status, f"{seconds * 1000:.0f} ms") for status, seconds in report.down_answers]
    return f"kill -> ready again (s): {ready}; requests while the model server was down: {down}"


def restart_broken_promises(report: RestartReport, plan: RestartPlan) -> list[str]:
    broken = []
    for name, times in report.ready_again_s.items():
        if times and max(times) >= plan.ready_within_s:
            broken.append(f"{name} kill: ready again after {max(times):.2f} s")
    for status, seconds in report.down_answers:
        if status != 503 or seconds >= plan.answer_503_within_s:
            broken.append(f"with the model server down: {status} after {seconds:.2f} s")
    restarts = report.log.count(" restarted, pid ")
    if restarts != plan.model_kills + plan.sidecar_kills:
        broken.append(f"{restarts} restarts logged for {plan.model_kills + plan.sidecar_kills}")
    return broken


def killed_summary(report: KilledReport) -> str:
    return "SIGKILL of carpool serve -> children and folder gone (s): " + ", ".join(
        f"{s:.2f}" for s in report.gone_s
    )


def killed_broken_promises(report: KilledReport, plan: KilledPlan) -> list[str]:
    broken = []
    if report.left_behind:
        broken.append(f"left behind: {report.left_behind}")
    if len(report.gone_s) != plan.kills or max(report.gone_s) >= plan.gone_within_s:
        broken.append(f"not gone within {plan.gone_within_s} s: {report.gone_s}")
    return broken
