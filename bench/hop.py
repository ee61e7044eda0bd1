"""The hop to the model server and the model server's pipeline, in alternating rounds.

`hop`: the sidecar's model client alone, in this process, against a real toy model server:
`--clients` concurrent senders of `--batch`-item batches, the framed stream against
`POST /batch` on the same Unix socket, A B A B. Per variant: items/s, and CPU microseconds
per item of this process (the client's side of the hop) and of the model server.

`pipeline`: a text model through `carpool serve` with the model server's pipeline on and
off, and the unbatched server, each started for its turn in a round; the load generator's
closed loop at each concurrency: items/s and p50.

`model-cpu`: the model server's CPU per item outside the forward pass: the stand-in
accelerator (whose forward pass sleeps with the GIL released, as a wait for GPU kernels
does) served by this tree and by `--baseline` (an older checkout: its .venv, or this
interpreter with its sources first on the path), loaded alike by framed batches, A B A B.

    python bench/hop.py model-cpu --baseline /tmp/old-checkout --batch 32 --clients 2

Both print one line per variant and level: the median over rounds, and every round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import click
import numpy as np
import psutil
import servers

from carpool import processes
from carpool.contract.wire import Tensor
from carpool.loadgen import runner, workload
from carpool.loadgen.report import CellResult
from carpool_sidecar.client import ModelClient

PIPELINE_ENV = "CARPOOL_MODEL_PIPELINE"


@click.group()
def main() -> None:
    """Measure the hop and the pipeline."""


@main.command()
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--seconds", type=float, default=3.0, show_default=True)
@click.option("--clients", type=int, default=2, show_default=True, help="batches in flight")
@click.option("--batch", type=int, default=8, show_default=True, help="items per batch")
def hop(rounds: int, seconds: float, clients: int, batch: int) -> None:
    """Framed stream vs POST /batch, toy model, torch threads 1."""
    with tempfile.TemporaryDirectory(prefix="carpool-hop-") as folder:
        socket = Path(folder) / "model.sock"
        command = processes.carpool_command("model-server", "--handler", "toy")
        command += ["--socket", str(socket), "--torch-threads", "1", "--max-batch-size", "64"]
        server = processes.spawn(command, Path(folder) / "model-server.log")
        try:
            figures = asyncio.run(_hop_rounds(socket, server.pid, rounds, seconds, clients, batch))
        finally:
            processes.stop(server, 10.0)
    for name, runs in figures.items():
        click.echo(
            f"{name:>6}: items/s {_median(runs, 0):>9.0f}  client us/item "
            f"{_median(runs, 1):>6.1f}  server us/item {_median(runs, 2):>6.1f}  "
            f"rounds {[round(r[0]) for r in runs]}"
        )
    framed, http = figures["framed"], figures["http"]
    click.echo(
        f"framed/http: items/s {_median(framed, 0) / _median(http, 0):.2f}x, client CPU per "
        f"item {_median(framed, 1) / _median(http, 1):.2f}x, server CPU per item "
        f"{_median(framed, 2) / _median(http, 2):.2f}x"
    )


async def _hop_rounds(
    socket: Path, server_pid: int, rounds: int, seconds: float, clients: int, batch: int
) -> dict[str, list[tuple[float, float, float]]]:
    url = f"unix://{socket}"
    await _until_ready(ModelClient(url))
    server = psutil.Process(server_pid)
    items = [{"input": Tensor.from_numpy(np.arange(4, dtype=np.float32))}] * batch
    figures: dict[str, list[tuple[float, float, float]]] = {"http": [], "framed": []}
    for _ in range(rounds):
        for name in figures:
            client = ModelClient(url, framed=name == "framed")
            try:
                await client.infer(items, 10.0)  # connects
                figures[name].append(await _hop_round(client, server, items, clients, seconds))
            finally:
                await client.close()
    return figures


async def _hop_round(
    client: ModelClient,
    server: psutil.Process,
    items: list[dict[str, Tensor]],
    clients: int,
    seconds: float,
) -> tuple[float, float, float]:
    sent = 0

    async def sender(deadline: float) -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            await client.infer(items, 10.0)
            sent += len(items)

    server_before, client_before = _cpu(server), time.process_time()
    started = time.monotonic()
    await asyncio.gather(*(sender(started + seconds) for _ in range(clients)))
    wall = time.monotonic() - started
    client_cpu, server_cpu = time.process_time() - client_before, _cpu(server) - server_before
    return sent / wall, client_cpu / sent * 1e6, server_cpu / sent * 1e6


async def _until_ready(client: ModelClient, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not await client.ready():
            if time.monotonic() > deadline:
                raise click.ClickException(f"model server not ready in {timeout_s:g} s")
            await asyncio.sleep(0.2)
    finally:
        await client.close()


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@main.command("model-cpu")
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--seconds", type=float, default=3.0, show_default=True)
@click.option("--clients", type=int, default=2, show_default=True, help="batches in flight")
@click.option("--batch", type=int, default=32, show_default=True, help="items per batch")
@click.option("--handler-options", default="preset=fast", show_default=True)
@click.option(
    "--baseline",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="an older checkout, measured beside this tree",
)
def model_cpu(
    rounds: int,
    seconds: float,
    clients: int,
    batch: int,
    handler_options: str,
    baseline: Path | None,
) -> None:
    """The stand-in's model server: CPU microseconds per item, this tree and --baseline."""
    trees = {"this": (processes.carpool_command(), {})}
    if baseline is not None:
        trees = {"baseline": _tree_command(baseline.resolve()), **trees}
    with (
        tempfile.TemporaryDirectory(prefix="carpool-model-cpu-") as folder,
        contextlib.ExitStack() as stack,
    ):
        servers_by_name = {}
        for name, (command, env) in trees.items():
            socket = Path(folder) / f"{name}.sock"
            args = [*command, "model-server", "--handler", "stand-in", "--socket", str(socket)]
            args += ["--handler-options", handler_options, "--torch-threads", "1"]
            args += ["--max-batch-size", str(batch)]
            server = processes.spawn(args, Path(folder) / f"{name}.log", env)
            stack.callback(processes.stop, server, 10.0)
            servers_by_name[name] = (socket, server.pid)
        figures = asyncio.run(_model_cpu_rounds(servers_by_name, rounds, seconds, clients, batch))
    for name, runs in figures.items():
        click.echo(
            f"{name:>8}: items/s {_median(runs, 0):>8.0f}  model server us/item "
            f"{_median(runs, 2):>6.1f}  rounds {[round(run[2], 1) for run in runs]}"
        )
    if "baseline" in figures:
        ratio = statistics.median(
            this[2] / base[2]
            for this, base in zip(figures["this"], figures["baseline"], strict=True)
        )
        click.echo(f"this/baseline: model server CPU per item {ratio:.2f}x (paired by round)")


def _tree_command(tree: Path) -> tuple[list[str], dict[str, str]]:
    """How to run another checkout's carpool: its own .venv, else this interpreter with its
    sources ahead of this tree's on the import path."""
    python = tree / ".venv" / "bin" / "python"
    if python.exists():
        return [str(python), "-m", "carpool"], {}
    sources = [str(tree / part / "src") for part in ("carpool", "model_server", "sidecar")]
    return processes.carpool_command(), {"PYTHONPATH": os.pathsep.join(sources)}


async def _model_cpu_rounds(
    servers_by_name: dict[str, tuple[Path, int]],
    rounds: int,
    seconds: float,
    clients: int,
    batch: int,
) -> dict[str, list[tuple[float, float, float]]]:
    items = [
        {"input": Tensor.from_numpy(np.arange(4, dtype=np.float32) + index)}
        for index in range(batch)
    ]
    for socket, _ in servers_by_name.values():
        await _until_ready(ModelClient(f"unix://{socket}"))
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers_by_name}
    for _ in range(rounds):
        for name, (socket, pid) in servers_by_name.items():
            client = ModelClient(f"unix://{socket}")
            try:
                await client.infer(items, 10.0)  # connects
                round_figures = await _hop_round(
                    client, psutil.Process(pid), items, clients, seconds
                )
                figures[name].append(round_figures)
            finally:
                await client.close()
    return figures


@main.command()
@click.option("--handler", default="text-embedding", show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--seconds", type=float, default=8.0, show_default=True)
@click.option("--levels", default="1,8,32,64", show_default=True)
@click.option("--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="short")
def pipeline(handler: str, rounds: int, seconds: float, levels: str, text_length: str) -> None:
    """carpool with the pipeline on and off, and the unbatched server."""
    settings = servers.ModelSettings(handler, handler, "cpu", 1, 32, 5.0)
    carpool = servers.carpool(settings)
    variants = {
        "unbatched": (servers.unbatched(settings), "true"),
        "pipeline": (carpool, "true"),
        "no-pipeline": (dataclasses.replace(carpool, name="no-pipeline"), "false"),
    }
    prepared = workload.build(
        workload.WorkloadSpec(
            payload="text",
            model_name=handler,
            input_name="text",
            text_length=text_length,  # type: ignore[arg-type]
        )
    )
    concurrency = tuple(int(level) for level in levels.split(","))
    cells: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="carpool-pipeline-") as folder:
        for number in range(rounds):
            for name, (variant, on) in variants.items():
                log_path = Path(folder) / f"{name}-{number}.log"
                with _env(PIPELINE_ENV, on), servers.started(variant, log_path, 300.0) as running:
                    measured = asyncio.run(_load(running.url, concurrency, prepared, seconds))
                for level, cell in zip(concurrency, measured, strict=True):
                    figures = (cell.items_per_second, cell.latency.p50 * 1e3)
                    cells.setdefault((name, level), []).append(figures)
    for (name, level), runs in sorted(cells.items(), key=lambda pair: (pair[0][1], pair[0][0])):
        click.echo(
            f"c={level:<3} {name:>11}: items/s {_median(runs, 0):>7.1f}  p50 ms "
            f"{_median(runs, 1):>6.2f}  rounds {[(round(i), round(p, 2)) for i, p in runs]}"
        )


async def _load(
    url: str, levels: tuple[int, ...], prepared: list[workload.PreparedRequest], seconds: float
) -> list[CellResult]:
    warm = runner.RunSettings(url, "concurrency", (max(levels),), 2.0, progress=False)
    await runner.run(warm, prepared)
    settings = runner.RunSettings(
        url, "concurrency", levels, seconds, warmup_seconds=0, progress=False
    )
    return await runner.run(settings, prepared)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """The variant's processes inherit it; `carpool serve` passes it to its model server."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _median(runs: Sequence[tuple[float, ...]], index: int) -> float:
    return statistics.median(run[index] for run in runs)


if __name__ == "__main__":
    main()
