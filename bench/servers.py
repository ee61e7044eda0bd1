"""The servers the comparison runs: how to start each one, wait for it, and meter its CPU.

Every server is a subprocess on 127.0.0.1 serving the same Open Inference Protocol JSON API;
each is started for its turn in a round and stopped after it, so only one runs at a time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

from carpool import processes

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RAY_VENV = REPO_DIR / ".cache" / "ray-venv"
READY_PATH = "/v2/health/ready"
# The CPU wheel: any looser torch spec downloads gigabytes of CUDA packages.
TORCH_SPEC = "torch==2.13.0"


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """What every variant is given alike."""

    handler: str
    model_name: str
    device: str
    torch_threads: int
    max_batch_size: int
    max_wait_ms: float


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    # Command line without the port, which is chosen at start.
    command: tuple[str, ...]


def unbatched(settings: ModelSettings) -> Variant:
    return Variant(
        "unbatched",
        (
            sys.executable,
            str(BENCH_DIR / "unbatched_server.py"),
            *_common(settings),
        ),
    )


def carpool(settings: ModelSettings) -> Variant:
    # Batching flags are given explicitly (at carpool's defaults unless asked otherwise)
    # so that Ray gets exactly the same maximum batch size and wait.
    return Variant(
        "carpool",
        (
            *processes.carpool_command("serve"),
            *_common(settings),
            "--max-batch-size",
            str(settings.max_batch_size),
            "--max-wait-ms",
            f"{settings.max_wait_ms:g}",
        ),
    )


def ray(settings: ModelSettings, python: Path) -> Variant:
    return Variant(
        "ray",
        (
            str(python),
            str(BENCH_DIR / "ray_app.py"),
            *_common(settings),
            "--max-batch-size",
            str(settings.max_batch_size),
            "--max-wait-ms",
            f"{settings.max_wait_ms:g}",
        ),
    )


def _common(settings: ModelSettings) -> tuple[str, ...]:
    return (
        "--handler",
        settings.handler,
        "--model-name",
        settings.model_name,
        "--device",
        settings.device,
        "--torch-threads",
        str(settings.torch_threads),
    )


def ray_python(install: bool) -> Path | None:
    """The Ray venv's interpreter, with this tree's carpool in it; None if the venv is absent.

    `install` builds the venv first when it is missing.
    """
    python = RAY_VENV / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    if not python.exists():
        if not install:
            return None
        subprocess.run([sys.executable, "-P", "-m", "venv", str(RAY_VENV)], check=True)
        subprocess.run([*pip, TORCH_SPEC], check=True)
        subprocess.run([*pip, "ray[serve]"], check=True)
        _install_carpool(pip, "[embedding]")
    # Every run: Ray must run the same carpool code as the other variants, not a stale copy.
    _install_carpool([*pip, "--no-deps", "--force-reinstall"], "")
    return python


def _install_carpool(pip: list[str], extras: str) -> None:
    # Built from a copy, so the build leaves no build/ or egg-info behind in the working tree.
    with tempfile.TemporaryDirectory(prefix="carpool-src-") as folder:
        source = Path(folder) / "carpool"
        skip = shutil.ignore_patterns(".venv", ".cache", ".git", "build", "*.egg-info")
        shutil.copytree(REPO_DIR, source, ignore=skip)
        subprocess.run([*pip, f"{source}{extras}"], check=True)


OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True, slots=True)
class Running:
    variant: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time so far of the server's processes: the model server apart from the front.

        In `carpool serve` the model server is the child whose command line says so; every
        other process of the tree (the sidecar, a supervisor) counts as the front.
        """
        totals = {"front": 0.0, "model": 0.0}
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return totals
        for process in tree:
            try:
                times = process.cpu_times()
                role = "model" if "model-server" in process.cmdline() else "front"
            except psutil.NoSuchProcess:
                continue
            totals[role] += times.user + times.system
        return totals


@contextmanager
def started(
    variant: Variant, log_path: Path, timeout_s: float, cpus: frozenset[int] | None = None
) -> Iterator[Running]:
    """Run the variant until the block exits; ready (or raise, with its log) on entry.

    With `cpus`, the server and every process it starts run on those CPUs only.
    """
    port = processes.free_port()
    process = processes.spawn(
        [*variant.command, "--port", str(port)],
        log_path,
        OFFLINE,
        start_new_session=True,
        # Set in the child before exec, so that its own children inherit it.
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    running = Running(variant.name, f"http://127.0.0.1:{port}", process, log_path)
    try:
        ready = running.url + READY_PATH
        try:
            processes.wait_ready(
                [process], lambda: processes.http_ok(ready), timeout_s, variant.name
            )
        except processes.NotReady as error:
            log = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{error}; log {log_path}:\n{log}") from None
        yield running
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM to the server's session, then SIGKILL to whatever of its tree is left.

    The tree is listed first: `carpool serve` puts its children in sessions of their own,
    and Ray starts many processes, so the process group alone would miss some.
    """
    try:
        tree = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    processes.stop(process, timeout_s, group=True)
    for child in tree:
        with suppress(psutil.NoSuchProcess):
            child.kill()
