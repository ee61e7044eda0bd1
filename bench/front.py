"""The sidecar's own cost per request: requests per sidecar CPU-second on the toy model.

    python bench/front.py                                  # this tree, uvloop and asyncio
    python bench/front.py --baseline /tmp/old-checkout     # ... and an older tree beside it
    python bench/front.py --loops uvloop --fronts 1,2      # one front process against two

Every variant is a `carpool serve --handler toy` (torch threads 1, batching defaults, REST
and gRPC), all started at once and loaded one at a time. A round loads each variant over
each protocol in turn, in an order that reverses round by round, after one warm-up cell
each. A cell's figure of merit is requests answered per second of CPU time of the server's
front processes (psutil: every process of the tree but the model server): what one sidecar
core carries, steady even when other work shares the machine. `--baseline` names a checkout
with its own `.venv` (made by `make setup` there), run as it is. Medians, ranges and
ratios paired by round land in `--results` as summary.md and results.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import statistics
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import click
import orjson
import psutil

# Sibling modules of this script; bench/ is a folder of scripts, not a package.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers

from carpool import processes
from carpool.engine.settings import BatchingSettings
from carpool.event_loop import ENV as EVENT_LOOP_ENV
from carpool.loadgen import runner, workload

DEFAULTS = BatchingSettings()
PROTOCOLS: tuple[workload.Protocol, ...] = ("oip-binary", "oip-json", "grpc")


@dataclass(frozen=True, slots=True)
class Cell:
    variant: str
    protocol: str
    round: int
    requests_per_second: float
    sidecar_cpu_seconds: float
    requests_per_core_second: float
    # Of the sidecar's CPU, that of the process that batches (with front processes: the one
    # whose share bounds how far more fronts can take the sidecar).
    batching_cpu_seconds: float
    p50_ms: float
    mean_items_per_batch: float | None


@dataclass(frozen=True, slots=True)
class Target:
    server: servers.Running
    grpc_target: str


def _variant(
    name: str, python: str, grpc_port: int, event_loop: str | None, fronts: int
) -> servers.Variant:
    env = () if event_loop is None else ("env", f"{EVENT_LOOP_ENV}={event_loop}")
    command = (
        *env, python, "-m", "carpool", "serve", "--handler", "toy", "--model-name", "toy",
        "--device", "cpu", "--torch-threads", "1", "--grpc-port", str(grpc_port),
        *(("--front-processes", str(fronts)) if fronts > 1 else ()),
    )  # fmt: skip
    return servers.Variant(name, command)


async def _cell(
    target: Target, protocol: workload.Protocol, round_number: int, clients: int, seconds: float
) -> Cell:
    prepared = workload.build(workload.WorkloadSpec(protocol=protocol, payload="toy"))
    settings = runner.RunSettings(
        url=target.server.url,
        mode="concurrency",
        levels=(clients,),
        duration=seconds,
        metrics_url=target.server.url + "/metrics",
        warmup_seconds=0,
        progress=False,
        grpc_target=target.grpc_target if protocol == "grpc" else None,
    )
    before, batching_before = target.server.cpu_seconds()["front"], _batching_cpu(target)
    [result] = await runner.run(settings, prepared)
    cpu = target.server.cpu_seconds()["front"] - before
    return Cell(
        variant=target.server.variant,
        protocol=protocol,
        round=round_number,
        requests_per_second=result.throughput_rps,
        sidecar_cpu_seconds=cpu,
        requests_per_core_second=result.ok / cpu if cpu > 0 else 0.0,
        batching_cpu_seconds=_batching_cpu(target) - batching_before,
        p50_ms=1000 * result.latency.p50,
        mean_items_per_batch=result.batching.mean_items_per_batch if result.batching else None,
    )


def _batching_cpu(target: Target) -> float:
    """CPU seconds so far of the `carpool sidecar` process (not of its front processes)."""
    for process in psutil.Process(target.server.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "sidecar" in process.cmdline():
                times = process.cpu_times()
                return times.user + times.system
    return 0.0


async def _rounds(
    targets: list[Target],
    protocols: list[workload.Protocol],
    rounds: int,
    clients: int,
    seconds: float,
    warmup: float,
) -> list[Cell]:
    pairs = [(target, protocol) for target in targets for protocol in protocols]
    for target, protocol in pairs:
        await _cell(target, protocol, 0, clients, warmup)
    cells = []
    for round_number in range(1, rounds + 1):
        for target, protocol in pairs if round_number % 2 else pairs[::-1]:
            cell = await _cell(target, protocol, round_number, clients, seconds)
            click.echo(
                f"round {round_number}: {cell.variant:8s} {protocol:10s} "
                f"{cell.requests_per_second:7.0f} req/s, "
                f"{cell.requests_per_core_second:7.0f} per sidecar CPU-second",
                err=True,
            )
            cells.append(cell)
    return cells


def _median_range(values: list[float], digits: int = 0) -> str:
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _per_core(cells: list[Cell], variant: str, protocol: str) -> dict[int, float]:
    return {
        cell.round: cell.requests_per_core_second
        for cell in cells
        if cell.variant == variant and cell.protocol == protocol
    }


def _paired(top: dict[int, float], bottom: dict[int, float]) -> str:
    ratios = [top[key] / bottom[key] for key in top.keys() & bottom.keys() if bottom[key]]
    return _median_range(ratios, 2) if ratios else "-"


def summarise(cells: list[Cell], variants: list[str], protocols: list[workload.Protocol]) -> str:
    """Markdown: per variant and protocol the medians, then ratios paired by round."""
    lines = [
        "| variant | protocol | requests/s per sidecar CPU-second | requests/s | p50 ms "
        "| items/batch | batching process's share of sidecar CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        for protocol in protocols:
            mine = [c for c in cells if c.variant == variant and c.protocol == protocol]
            batch = [c.mean_items_per_batch for c in mine if c.mean_items_per_batch]
            share = [c.batching_cpu_seconds / c.sidecar_cpu_seconds for c in mine]
            lines.append(
                f"| {variant} | {protocol} "
                f"| {_median_range([c.requests_per_core_second for c in mine])} "
                f"| {statistics.median(c.requests_per_second for c in mine):.0f} "
                f"| {statistics.median(c.p50_ms for c in mine):.1f} "
                f"| {statistics.median(batch) if batch else 0:.1f} "
                f"| {statistics.median(share):.2f} |"
            )
    lines += ["", "Per sidecar CPU-second, paired by round (median, range):", ""]
    for variant in variants:
        grpc, rest = _per_core(cells, variant, "grpc"), _per_core(cells, variant, "oip-binary")
        if grpc and rest:
            lines.append(f"- {variant}: gRPC/REST binary {_paired(grpc, rest)}")
    first = variants[0]
    for variant in variants[1:]:
        for protocol in protocols:
            lines.append(
                f"- {variant}/{first}, {protocol}: "
                f"{_paired(_per_core(cells, variant, protocol), _per_core(cells, first, protocol))}"
            )
    return "\n".join(lines)


@click.command()
@click.option("--rounds", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--duration", type=float, default=5.0, show_default=True, help="Seconds per cell.")
@click.option("--warmup", type=float, default=1.0, show_default=True, help="Per cell, once.")
@click.option(
    "--baseline",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Another checkout with its own .venv, measured beside this tree as 'baseline'.",
)
@click.option(
    "--loops",
    default="uvloop,asyncio",
    show_default=True,
    help=f"This tree's variants: comma-separated {EVENT_LOOP_ENV} values.",
)
@click.option(
    "--fronts",
    default="1",
    show_default=True,
    help="comma-separated front process counts (`--front-processes`), a variant each",
)
@click.option("--protocols", default=",".join(PROTOCOLS), show_default=True, help="comma-separated")
@click.option("--ready-timeout", type=float, default=120.0, show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=None)
def main(
    rounds: int,
    concurrency: int,
    duration: float,
    warmup: float,
    baseline: Path | None,
    loops: str,
    fronts: str,
    protocols: str,
    ready_timeout: float,
    results: Path | None,
) -> None:
    """Requests per sidecar CPU-second on the toy model, by variant and protocol."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    results = results or servers.REPO_DIR / ".cache" / "bench" / f"front-{stamp}"
    results.mkdir(parents=True, exist_ok=True)
    here = processes.carpool_command()[0]
    counts = [int(count) for count in fronts.split(",")]
    plan = [
        (loop if count == 1 else f"{loop}-{count}fronts", here, loop, count)
        for loop in loops.split(",")
        if loop
        for count in counts
    ]
    if baseline is not None:
        python = str(baseline.resolve() / ".venv" / "bin" / "python")
        plan.insert(0, ("baseline", python, None, 1))
    chosen = [cast(workload.Protocol, name) for name in protocols.split(",") if name]
    if unknown := set(chosen) - set(PROTOCOLS):
        raise click.BadParameter(f"unknown {sorted(unknown)}; choose from {PROTOCOLS}")
    with ExitStack() as stack:
        targets = []
        for name, python, event_loop, count in plan:
            grpc_port = processes.free_port()
            variant = _variant(name, python, grpc_port, event_loop, count)
            server = stack.enter_context(
                servers.started(variant, results / f"{name}.log", ready_timeout)
            )
            targets.append(Target(server, f"127.0.0.1:{grpc_port}"))
        cells = asyncio.run(_rounds(targets, chosen, rounds, concurrency, duration, warmup))
    table = summarise(cells, [name for name, *_ in plan], chosen)
    (results / "summary.md").write_text(table + "\n")
    document = {
        "settings": {
            "rounds": rounds,
            "concurrency": concurrency,
            "duration_seconds": duration,
            "variants": [name for name, *_ in plan],
            "torch_threads": 1,
        },
        "cells": [asdict(cell) for cell in cells],
    }
    (results / "results.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    click.echo(table)
    click.echo(f"results: {results}", err=True)


if __name__ == "__main__":
    main()
