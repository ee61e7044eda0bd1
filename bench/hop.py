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
does), or text-embedding (all-MiniLM-L6-v2 on the CPU, its forward pass's own CPU time
counted on the worker thread and taken off: `forward_timed.py`), served by this tree and by
each `--baseline` (an older checkout: its .venv, or this
interpreter with its sources first on the path; named by its folder), loaded alike by
framed batches, A B C A B C.

    python bench/hop.py model-cpu --baseline /tmp/before --baseline /tmp/main --batch 32

Both print one line per variant and level: the median over rounds, and every round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import click
import forward_timed
import numpy as np
import psutil
import servers

from carpool import processes
from carpool.contract.wire import BYTES, Tensor
from carpool.loadgen import runner, workload
from carpool.loadgen.report import CellResult
from carpool_sidecar.client import ModelClient

PIPELINE_ENV = "CARPOOL_MODEL_PIPELINE"
BENCH_DIR = Path(__file__).resolve().parent


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
                figures[name].append(
                    (await _hop_round(client, server, items, clients, seconds))[:3]
                )
            finally:
                await client.close()
    return figures


async def _hop_round(
    client: ModelClient,
    server: psutil.Process,
    items: list[dict[str, Tensor]],
    clients: int,
    seconds: float,
) -> tuple[float, float, float, int]:
    sent = 0

    async def sender(deadline: float) -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            await client.infer(items, 60.0)
            sent += len(items)

    server_before, client_before = _cpu(server), time.process_time()
    started = time.monotonic()
    await asyncio.gather(*(sender(started + seconds) for _ in range(clients)))
    wall = time.monotonic() - started
    client_cpu, server_cpu = time.process_time() - client_before, _cpu(server) - server_before
    return sent / wall, client_cpu / sent * 1e6, server_cpu / sent * 1e6, sent


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
@click.option("--handler", type=click.Choice(["stand-in", "text-embedding"]), default="stand-in")
@click.option("--handler-options", default=None, help="[default: preset=fast for stand-in]")
@click.option("--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="short")
@click.option(
    "--baseline",
    "baselines",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    multiple=True,
    help="an older checkout, measured beside this tree (repeatable)",
)
def model_cpu(
    rounds: int,
    seconds: float,
    clients: int,
    batch: int,
    handler: str,
    handler_options: str | None,
    text_length: str,
    baselines: tuple[Path, ...],
) -> None:
    """A model server's CPU microseconds per item outside the forward pass, this tree and
    each --baseline."""
    trees = {tree.resolve().name: _tree_command(tree.resolve()) for tree in baselines}
    if len(trees) < len(baselines) or "this" in trees:
        raise click.UsageError("name each --baseline by a folder of its own (not 'this')")
    trees["this"] = (processes.carpool_command(), {})
    with (
        tempfile.TemporaryDirectory(prefix="carpool-model-cpu-") as folder,
        contextlib.ExitStack() as stack,
    ):
        servers_by_name = {}
        for name, (command, env) in trees.items():
            socket, forward = Path(folder) / f"{name}.sock", Path(folder) / f"{name}.forward"
            args = [*command, "model-server", "--socket", str(socket), "--torch-threads", "1"]
            args += ["--max-batch-size", str(batch)]
            if handler == "stand-in":
                args += [
                    "--handler",
                    handler,
                    "--handler-options",
                    handler_options or "preset=fast",
                ]
            else:
                # Warm-up at the longest text, every batch size on one thread, outlasts the
                # readiness wait on a loaded machine; the rounds run short texts alike.
                args += [
                    "--handler",
                    "forward_timed:ForwardTimedEmbedding",
                    "--warmup-seconds",
                    "1",
                ]
                args += ["--handler-options", handler_options] if handler_options else []
                path = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(BENCH_DIR)]))
                env = {**env, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
                env[forward_timed.FILE_ENV] = str(forward)
            server = processes.spawn(args, Path(folder) / f"{name}.log", env)
            stack.callback(processes.stop, server, 10.0)
            servers_by_name[name] = (socket, server.pid, forward)
        items = _items(handler, batch, text_length)
        figures = asyncio.run(_model_cpu_rounds(servers_by_name, rounds, seconds, clients, items))
    for name, runs in figures.items():
        click.echo(
            f"{name:>8}: items/s {_median(runs, 0):>8.0f}  model server us/item "
            f"{_median(runs, 2):>6.1f}  rounds {[round(run[2], 1) for run in runs]}"
        )
    for name in trees:
        if name != "this":
            ratios = [
                this[2] / base[2] for this, base in zip(figures["this"], figures[name], strict=True)
            ]
            click.echo(
                f"this/{name}: model server CPU per item {statistics.median(ratios):.2f}x "
                f"(paired by round: {min(ratios):.2f}-{max(ratios):.2f})"
            )


def _tree_command(tree: Path) -> tuple[list[str], dict[str, str]]:
    """How to run another checkout's carpool: its own .venv, else this interpreter with its
    sources ahead of this tree's on the import path."""
    python = tree / ".venv" / "bin" / "python"
    if python.exists():
        return [str(python), "-m", "carpool"], {}
    sources = [str(tree / part / "src") for part in ("carpool", "model_server", "sidecar")]
    return processes.carpool_command(), {"PYTHONPATH": os.pathsep.join(sources)}


def _items(handler: str, batch: int, text_length: str) -> list[dict[str, Tensor]]:
    if handler == "stand-in":
        return [
            {"input": Tensor.from_numpy(np.arange(4, dtype=np.float32) + index)}
            for index in range(batch)
        ]
    texts = workload.text_items(batch, text_length, random.Random(0))  # type: ignore[arg-type]
    return [{"text": Tensor(BYTES, (1,), [text.encode()])} for text in texts]


async def _model_cpu_rounds(
    servers_by_name: dict[str, tuple[Path, int, Path]],
    rounds: int,
    seconds: float,
    clients: int,
    items: list[dict[str, Tensor]],
) -> dict[str, list[tuple[float, float, float]]]:
    """Per server and round: items/s, this process's and the server's CPU us per item, the
    server's less its forward pass's where the handler counts it."""
    for socket, _, _ in servers_by_name.values():
        await _until_ready(ModelClient(f"unix://{socket}"))
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers_by_name}
    for _ in range(rounds):
        for name, (socket, pid, forward) in servers_by_name.items():
            client = ModelClient(f"unix://{socket}")
            try:
                await client.infer(items, 60.0)  # connects
                before = forward_timed.read_total(str(forward))
                rate, client_us, server_us, sent = await _hop_round(
                    client, psutil.Process(pid), items, clients, seconds
                )
                forward_us = (forward_timed.read_total(str(forward)) - before) / sent * 1e6
                figures[name].append((rate, client_us, server_us - forward_us))
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
