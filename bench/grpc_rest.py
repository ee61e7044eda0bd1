"""gRPC against REST binary through one carpool sidecar on the trivial (toy) model.

    python bench/grpc_rest.py                    # 5 rounds, 64 clients, 6 s per cell

One `carpool serve --handler toy` serves both protocols. Each round loads it over REST
(Open Inference Protocol with the binary tensor extension) and over gRPC (raw contents),
in an order that alternates round by round, after one warm-up per protocol. A cell's
figure of merit is requests answered per second of the sidecar's CPU time (psutil, every
process of the tree but the model server): what one sidecar core can carry. Medians
and ranges over rounds land in `--results` as summary.md and results.json.
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import orjson

# Sibling modules of this script; bench/ is a folder of scripts, not a package.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers

from carpool import processes
from carpool.loadgen import runner, workload
from carpool.sidecar.config import BatchingSettings

DEFAULTS = BatchingSettings()
PROTOCOLS: tuple[workload.Protocol, ...] = ("oip-binary", "grpc")


@dataclass(frozen=True, slots=True)
class Cell:
    protocol: str
    round: int
    requests_per_second: float
    sidecar_cpu_seconds: float
    requests_per_core_second: float
    p50_ms: float
    p99_ms: float
    mean_items_per_batch: float | None


async def _cell(
    server: servers.Running,
    grpc_target: str,
    protocol: workload.Protocol,
    round_number: int,
    concurrency: int,
    duration: float,
) -> Cell:
    prepared = workload.build(workload.WorkloadSpec(protocol=protocol, payload="toy"))
    settings = runner.RunSettings(
        url=server.url,
        mode="concurrency",
        levels=(concurrency,),
        duration=duration,
        metrics_url=server.url + "/metrics",
        warmup_seconds=0,
        progress=False,
        grpc_target=grpc_target if protocol == "grpc" else None,
    )
    before = server.cpu_seconds()["front"]
    [result] = await runner.run(settings, prepared)
    cpu = server.cpu_seconds()["front"] - before
    return Cell(
        protocol=protocol,
        round=round_number,
        requests_per_second=result.throughput_rps,
        sidecar_cpu_seconds=cpu,
        requests_per_core_second=result.ok / cpu if cpu > 0 else 0.0,
        p50_ms=1000 * result.latency.p50,
        p99_ms=1000 * result.latency.p99,
        mean_items_per_batch=result.batching.mean_items_per_batch if result.batching else None,
    )


async def _rounds(
    server: servers.Running,
    grpc_target: str,
    rounds: int,
    concurrency: int,
    duration: float,
    warmup: float,
) -> list[Cell]:
    for protocol in PROTOCOLS:
        await _cell(server, grpc_target, protocol, 0, concurrency, warmup)
    cells = []
    for round_number in range(1, rounds + 1):
        order = PROTOCOLS if round_number % 2 else PROTOCOLS[::-1]
        for protocol in order:
            cell = await _cell(server, grpc_target, protocol, round_number, concurrency, duration)
            click.echo(
                f"round {round_number}: {protocol:10s} {cell.requests_per_second:8.0f} req/s, "
                f"{cell.requests_per_core_second:8.0f} per sidecar core",
                err=True,
            )
            cells.append(cell)
    return cells


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def summarise(cells: list[Cell]) -> str:
    """A Markdown table: medians and ranges per protocol, and the paired per-core ratio."""
    lines = [
        "| protocol | requests/s | requests/s per sidecar core | p50 ms | p99 ms | items/batch |",
        "|---|---|---|---|---|---|",
    ]
    for protocol in PROTOCOLS:
        mine = [cell for cell in cells if cell.protocol == protocol]
        batch = [cell.mean_items_per_batch for cell in mine if cell.mean_items_per_batch]
        lines.append(
            f"| {protocol} | {_median_range([c.requests_per_second for c in mine])} "
            f"| {_median_range([c.requests_per_core_second for c in mine])} "
            f"| {statistics.median(c.p50_ms for c in mine):.1f} "
            f"| {statistics.median(c.p99_ms for c in mine):.1f} "
            f"| {statistics.median(batch):.1f} |"
            if batch
            else f"| {protocol} | no answers | | | | |"
        )
    by_round: dict[int, dict[str, Cell]] = {}
    for cell in cells:
        by_round.setdefault(cell.round, {})[cell.protocol] = cell
    ratios = [
        pair["grpc"].requests_per_core_second / pair["oip-binary"].requests_per_core_second
        for pair in by_round.values()
        if pair["oip-binary"].requests_per_core_second
    ]
    if ratios:
        lines.append("")
        lines.append(
            f"gRPC/REST binary, requests per sidecar core, paired by round: "
            f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
        )
    return "\n".join(lines)


@click.command()
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--duration", type=float, default=6.0, show_default=True, help="Seconds per cell.")
@click.option("--warmup", type=float, default=2.0, show_default=True, help="Per protocol, once.")
@click.option("--ready-timeout", type=float, default=120.0, show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=None)
def main(
    rounds: int,
    concurrency: int,
    duration: float,
    warmup: float,
    ready_timeout: float,
    results: Path | None,
) -> None:
    """gRPC against REST binary: requests/s per sidecar core on the toy model."""
    settings = servers.ModelSettings(
        handler="toy",
        model_name="toy",
        device="cpu",
        torch_threads=1,
        max_batch_size=DEFAULTS.max_batch_size,
        max_wait_ms=DEFAULTS.max_wait_ms,
    )
    grpc_port = processes.free_port()
    carpool = servers.carpool(settings)
    variant = servers.Variant(carpool.name, (*carpool.command, "--grpc-port", str(grpc_port)))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    results = results or servers.REPO_DIR / ".cache" / "bench" / f"grpc-rest-{stamp}"
    results.mkdir(parents=True, exist_ok=True)
    with servers.started(variant, results / "carpool.log", ready_timeout) as server:
        cells = asyncio.run(
            _rounds(server, f"127.0.0.1:{grpc_port}", rounds, concurrency, duration, warmup)
        )
    table = summarise(cells)
    (results / "summary.md").write_text(table + "\n")
    document = {
        "settings": {
            **asdict(settings),
            "rounds": rounds,
            "concurrency": concurrency,
            "duration_seconds": duration,
            "warmup_seconds": warmup,
        },
        "cells": [asdict(cell) for cell in cells],
    }
    (results / "results.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    click.echo(table)
    click.echo(f"results: {results}", err=True)


if __name__ == "__main__":
    main()
