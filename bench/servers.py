"""The servers the comparison runs: how to start each one, wait for it, and meter its CPU.

Every server is a subprocess on 127.0.0.1 answering the same Open Inference Protocol JSON
request; each is started for its turn in a round and stopped after it, so only one runs at
a time. The peers (bench/peers.py) are started the same way from their own venvs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import click
import psutil

from carpool import processes
from carpool.comma_list import CommaList
from carpool.contract.batching import DISPATCH_MODES
from carpool.loadgen import workload

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
READY_PATH = "/v2/health/ready"


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """What every variant is given alike."""

    handler: str
    model_name: str
    device: str
    torch_threads: int
    max_batch_size: int
    max_wait_ms: float
    # The handler's own `--handler-options` (the stand-in's timing), for every variant alike.
    handler_options: str = ""
    dtype: str = "fp32"
    # The model's file or folder (`--model-path`), for handlers that read one.
    model_path: str = ""


# Handlers sent four floats (`--payload toy`); every other one is sent text, as MiniLM takes.
FLOAT_HANDLERS = ("toy", "stand-in")


def oip_json_load(
    handler: str,
    text_length: workload.TextLength,
    items: int = 1,
    protocol: workload.Protocol = "oip-json",
) -> list[workload.PreparedRequest]:
    """The OIP JSON requests for `handler` of `items` items each: four floats an item for the
    float handlers, else texts; with `protocol` oip-binary, their data as binary tensor data
    after a JSON header."""
    floats = handler in FLOAT_HANDLERS
    return workload.build(
        workload.WorkloadSpec(
            protocol=protocol,
            payload="toy" if floats else "text",
            model_name=handler,
            input_name="input" if floats else "text",
            text_length=text_length,
            batch_per_request=items,
        )
    )


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    # Command line without the port, which is chosen at start.
    command: tuple[str, ...]
    # Answers 200 once the model is loaded.
    ready_path: str = READY_PATH
    # Added to the environment the server starts with.
    env: Mapping[str, str] = field(default_factory=dict)


# bench/ on every variant's import path: a handler may live there (large_encoder).
BENCH_PATH = {"PYTHONPATH": str(BENCH_DIR)}


def unbatched(settings: ModelSettings) -> Variant:
    return Variant(
        "unbatched",
        (
            sys.executable,
            str(BENCH_DIR / "unbatched_server.py"),
            *model_arguments(settings, batched=False),
        ),
        env=BENCH_PATH,
    )


def carpool(settings: ModelSettings) -> Variant:
    # No gRPC port: the comparison is over HTTP, and a fixed port may be taken by another run.
    command = (*processes.carpool_command("serve"), "--grpc-port", "0")
    return Variant("carpool", (*command, *model_arguments(settings, batched=True)), env=BENCH_PATH)


def model_arguments(settings: ModelSettings, batched: bool) -> tuple[str, ...]:
    """The command-line options every variant takes alike.

    Batching options are given explicitly (at carpool's defaults unless asked otherwise) so
    that every batching variant gets exactly the same maximum batch size and wait.
    """
    common = (
        "--handler",
        settings.handler,
        "--model-name",
        settings.model_name,
        "--device",
        settings.device,
        "--torch-threads",
        str(settings.torch_threads),
        "--dtype",
        settings.dtype,
    )
    if settings.handler_options:
        common += ("--handler-options", settings.handler_options)
    if settings.model_path:
        common += ("--model-path", settings.model_path)
    if not batched:
        return common
    return (
        *common,
        "--max-batch-size",
        str(settings.max_batch_size),
        "--max-wait-ms",
        f"{settings.max_wait_ms:g}",
    )


def limit_command(
    settings: ModelSettings, text_length: str, sizes: tuple[int, ...] = ()
) -> list[str]:
    """bench/limit.py for the model every variant serves, on the same text mix; at `sizes`,
    or at every size up to the max batch size."""
    command = [
        sys.executable,
        str(BENCH_DIR / "limit.py"),
        "--handler",
        settings.handler,
        "--device",
        settings.device,
        "--torch-threads",
        str(settings.torch_threads),
        "--dtype",
        settings.dtype,
        "--max-batch-size",
        str(settings.max_batch_size),
        "--text-length",
        text_length,
    ]
    if settings.handler_options:
        command += ["--handler-options", settings.handler_options]
    if sizes:
        command += ["--sizes", ",".join(map(str, sizes))]
    return command


def limit_rates(stdout: str) -> dict[int, float]:
    """Items/s by batch size from bench/limit.py's rows (size, ms per batch, items/s,
    forward items/s); the header lines are skipped."""
    rows = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0].isdigit():
            rows[int(fields[0])] = float(fields[2])
    return rows


def variant_options(command: Callable[..., None]) -> Callable[..., None]:
    """`--policies` (dispatch policies to run) and `--baseline` (an older checkout with its
    own .venv, run beside this tree at every policy)."""
    command = click.option(
        "--baseline",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
        help="an older checkout with its own .venv, run beside this tree at every policy",
    )(command)
    return click.option(
        "--policies",
        type=CommaList(click.Choice(DISPATCH_MODES)),
        default="timed,adaptive",
        show_default=True,
    )(command)


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
        return self._by_role(lambda process: sum(process.cpu_times()[:2]))

    def waited_seconds(self) -> dict[str, float]:
        """Time so far the server's processes were ready to run and waited for a core
        (`waited_seconds`), by the roles of `cpu_seconds`."""
        return self._by_role(waited_seconds)

    def _by_role(self, measure: Callable[[psutil.Process], float]) -> dict[str, float]:
        totals = {"front": 0.0, "model": 0.0}
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return totals
        for process in tree:
            try:
                role = "model" if "model-server" in process.cmdline() else "front"
                totals[role] += measure(process)
            except psutil.NoSuchProcess:
                continue
        return totals


def waited_seconds(process: psutil.Process) -> float:
    """Seconds the process's threads have so far been ready to run and waited for a core,
    from Linux's schedstat (0 where the kernel keeps none): on cores shared with other
    work, a process that waits shows here, not in its CPU time."""
    tasks = Path(f"/proc/{process.pid}/task")
    waited = 0
    try:
        for task in tasks.iterdir():
            with suppress(OSError):  # a thread that ended meanwhile
                waited += int((task / "schedstat").read_text().split()[1])
    except FileNotFoundError:
        if not process.is_running():
            raise psutil.NoSuchProcess(process.pid) from None
    return waited / 1e9


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
        {**OFFLINE, **variant.env},
        start_new_session=True,
        # Set in the child before exec, so that its own children inherit it.
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    running = Running(variant.name, f"http://127.0.0.1:{port}", process, log_path)
    try:
        ready = running.url + variant.ready_path
        try:
            processes.wait_ready(
                [process], lambda: processes.http_ok(ready), timeout_s, variant.name
            )
        except processes.NotReady as error:
            log = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{error}; log {log_path}:\n{log}") from None
        yield running
    finally:
        with _signals_deferred():
            _stop(process)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """A Ctrl-C or SIGTERM during the block takes effect after it: raised in the middle of a
    server's stop, it would leave the server running. (Blocking the signals would not do:
    the kernel hands them to another thread, and Python raises them in the main one anyway.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread takes signals, and only it may set their handlers
        return
    received: list[int] = []
    stopping = (signal.SIGINT, signal.SIGTERM)
    previous = {
        signum: signal.signal(signum, lambda got, _: received.append(got)) for signum in stopping
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM to the server's session, then SIGKILL to whatever of its tree is left.

    The tree is listed first: `carpool serve` puts its children in sessions of their own,
    and the peers start many processes, so the process group alone would miss some.
    """
    try:
        tree = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    processes.stop(process, timeout_s, group=True)
    for child in tree:
        with suppress(psutil.NoSuchProcess):
            child.kill()
