"""Dispatch alone, on a stand-in device: the engine against a real model server, no HTTP front.

    python bench/dispatch_engine.py --handler-options preset=fast --concurrency 1,8,32,128
    python bench/dispatch_engine.py --baseline /tmp/old-checkout     # an older tree beside

On a small machine the end-to-end figures of a fast device are bounded by the HTTP front
and the load generator, which share the cores (bench/dispatch.py). Here the batching engine
and the sidecar's model client run in one process against a real `carpool model-server
--handler stand-in` over its framed socket, and closed-loop callers in that process submit
one item each, then come back after `--turnaround-ms` (the way through a front and a
client): what is left is dispatch, the hop and the model server. Each variant (a tree and
a dispatch policy) runs in a process of its own, with its tree's engine and model server,
in an order that reverses round by round; bench/limit.py measures the stand-in in process.
Prints per variant and concurrency the medians over rounds of items/s, items/s over the
limit at batch size min(c, maxBatchSize), p50, p99 and p99/p50, mean batch and batches by
reason, then ratios paired round by round against the first variant.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson
import servers
from prometheus_client import CollectorRegistry

from carpool import event_loop, processes
from carpool.comma_list import CommaList
from carpool.contract.batching import DISPATCH_MODES
from carpool.contract.wire import BatchTiming, Item, ItemResult, Tensor
from carpool.engine.batcher import Batcher
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings
from carpool.loadgen.stats import percentile
from carpool_sidecar.client import ModelClient

REASONS = ("idle", "model_ready", "timeout", "full")
ITEM: Item = {"input": Tensor.from_numpy(np.arange(4, dtype=np.float32))}
KEY = BatchKey(("input", "FP32", (-1,)), 64)


class Sender:
    """The engine's sender: the sidecar's model client, as the sidecar's forwarder uses it."""

    def __init__(self, client: ModelClient) -> None:
        self._client = client

    async def send(
        self, items: Sequence[Item], timeout_s: float
    ) -> tuple[list[ItemResult], BatchTiming | None]:
        return await self._client.infer(items, timeout_s)


async def _level(
    client: ModelClient, settings: BatchingSettings, callers: int, seconds: float, turnaround: float
) -> dict[str, Any]:
    registry = CollectorRegistry()
    batcher: Batcher[Item, ItemResult] = Batcher(
        settings, Sender(client), SidecarMetrics(registry, "m")
    )
    dispatcher = asyncio.create_task(batcher.run())
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    # Latencies by the precise clock: uvloop's loop.time() counts whole milliseconds.
    warm_until = time.perf_counter() + 1.0
    end = warm_until + seconds

    async def caller() -> None:
        while (started := time.perf_counter()) < end:
            await batcher.submit([ITEM], KEY, loop.time() + 30)
            if started >= warm_until:
                latencies.append(time.perf_counter() - started)
            await asyncio.sleep(turnaround)

    def batches() -> dict[str, float]:
        sample = registry.get_sample_value
        counts = {r: sample("carpool_batches_total", {"model": "m", "reason": r}) for r in REASONS}
        return {"items": sample("carpool_batch_size_sum", {"model": "m"}) or 0.0} | {
            reason: count or 0.0 for reason, count in counts.items()
        }

    tasks = [asyncio.create_task(caller()) for _ in range(callers)]
    await asyncio.sleep(max(0.0, warm_until - time.perf_counter()))
    before = batches()
    await asyncio.gather(*tasks)
    after = batches()
    dispatcher.cancel()
    await asyncio.gather(dispatcher, return_exceptions=True)
    sent = {key: after[key] - before[key] for key in after}
    count = sum(sent[reason] for reason in REASONS)
    return {
        "callers": callers,
        "items_per_second": len(latencies) / seconds,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "batch": sent["items"] / count if count else float("nan"),
        "reasons": {reason: sent[reason] for reason in REASONS},
    }


async def _levels(
    socket: Path,
    settings: BatchingSettings,
    levels: Sequence[int],
    seconds: float,
    turnaround: float,
) -> list[dict[str, Any]]:
    client = ModelClient(f"unix://{socket}")
    try:
        deadline = time.monotonic() + 120
        while not await client.ready():
            if time.monotonic() > deadline:
                raise click.ClickException("model server not ready in 120 s")
            await asyncio.sleep(0.2)
        return [await _level(client, settings, callers, seconds, turnaround) for callers in levels]
    finally:
        await client.close()


@click.group()
def main() -> None:
    """Dispatch on a stand-in device, in process."""


@main.command()
@click.option("--handler-options", required=True)
@click.option("--policy", type=click.Choice(DISPATCH_MODES), required=True)
@click.option("--concurrency", type=CommaList(click.IntRange(min=1)), required=True)
@click.option("--duration", type=float, required=True)
@click.option("--turnaround-ms", type=float, required=True)
@click.option("--max-batch-size", type=int, required=True)
@click.option("--max-wait-ms", type=float, required=True)
def cell(
    handler_options: str,
    policy: str,
    concurrency: tuple[int, ...],
    duration: float,
    turnaround_ms: float,
    max_batch_size: int,
    max_wait_ms: float,
) -> None:
    """One variant at every concurrency, with this interpreter's tree: JSON lines out."""
    settings = BatchingSettings(
        dispatch=policy,  # type: ignore[arg-type]
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
    )
    with tempfile.TemporaryDirectory(prefix="carpool-dispatch-engine-") as folder:
        socket = Path(folder) / "model.sock"
        command = processes.carpool_command(
            "model-server", "--handler", "stand-in", "--handler-options", handler_options
        )
        command += ["--socket", str(socket), "--max-batch-size", str(max_batch_size)]
        server = processes.spawn(command, Path(folder) / "model-server.log")
        try:
            results = event_loop.run(
                _levels(socket, settings, concurrency, duration, turnaround_ms / 1000)
            )
        finally:
            processes.stop(server, 10.0)
    for result in results:
        click.echo(orjson.dumps(result).decode())


@main.command()
@click.option("--handler-options", default="preset=fast", show_default=True)
@click.option("--concurrency", default="1,8,32,128", show_default=True)
@servers.variant_options
@click.option("--rounds", default=3, show_default=True)
@click.option("--duration", default=4.0, show_default=True, help="seconds per level")
@click.option("--turnaround-ms", default=0.5, show_default=True, help="a caller's way back")
@click.option("--max-batch-size", default=32, show_default=True)
@click.option("--max-wait-ms", default=5.0, show_default=True)
def compare(
    handler_options: str,
    concurrency: str,
    policies: tuple[str, ...],
    baseline: Path | None,
    rounds: int,
    duration: float,
    turnaround_ms: float,
    max_batch_size: int,
    max_wait_ms: float,
) -> None:
    """Every variant at every concurrency, in alternating rounds."""
    pythons = {"": sys.executable}
    if baseline is not None:
        pythons["base-"] = str(baseline / ".venv" / "bin" / "python")
    variants = [(prefix + policy, python, policy) for prefix, python in pythons.items()
                for policy in policies]  # fmt: skip
    common = [
        "--handler-options", handler_options, "--concurrency", concurrency,
        "--duration", str(duration), "--turnaround-ms", str(turnaround_ms),
        "--max-batch-size", str(max_batch_size), "--max-wait-ms", str(max_wait_ms),
    ]  # fmt: skip
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    limits: dict[int, list[float]] = {}
    settings = servers.ModelSettings(
        "stand-in", "stand-in", "cpu", 1, max_batch_size, max_wait_ms, handler_options
    )
    for round_number in range(1, rounds + 1):
        for name, python, policy in variants if round_number % 2 else variants[::-1]:
            done = subprocess.run(
                [python, __file__, "cell", "--policy", policy, *common],
                capture_output=True,
                text=True,
                check=True,
                env=processes.environment(),
            )
            for line in done.stdout.splitlines():
                result = orjson.loads(line)
                cells.setdefault((name, result["callers"]), []).append(result)
        limit = subprocess.run(
            servers.limit_command(settings, "short"), capture_output=True, text=True, check=True
        )
        for size, rate in servers.limit_rates(limit.stdout).items():
            limits.setdefault(size, []).append(rate)
        click.echo(f"round {round_number} done", err=True)
    med = statistics.median
    click.echo(
        f"stand-in {handler_options}, {rounds} rounds of {duration:g} s per level, turnaround "
        f"{turnaround_ms:g} ms, maxBatchSize {max_batch_size}, maxWaitMs {max_wait_ms:g}"
    )
    for (name, level), runs in sorted(cells.items()):
        limit = med(limits[min(level, max_batch_size)])
        click.echo(
            f"{name:>14} c={level:<3} items/s {med(r['items_per_second'] for r in runs):7.0f}"
            f"  /limit {med(r['items_per_second'] for r in runs) / limit:.2f}"
            f"  p50 {1000 * med(r['p50'] for r in runs):6.2f} ms"
            f"  p99 {1000 * med(r['p99'] for r in runs):6.2f} ms"
            f"  p99/p50 {med(r['p99'] / r['p50'] for r in runs):4.2f}"
            f"  batch {med(r['batch'] for r in runs):5.2f}  "
            + " ".join(f"{k}={sum(r['reasons'][k] for r in runs):g}" for k in REASONS)
        )
    first = variants[0][0]
    for name, _, _ in variants[1:]:
        for level in (int(part) for part in concurrency.split(",")):
            pairs = zip(cells[(name, level)], cells[(first, level)], strict=True)
            ratios = [(v["items_per_second"] / f["items_per_second"], v["p99"] / f["p99"])
                      for v, f in pairs]  # fmt: skip
            click.echo(
                f"{name}/{first} c={level}: items/s {med(r[0] for r in ratios):.2f}, "
                f"p99 {med(r[1] for r in ratios):.2f}"
            )


if __name__ == "__main__":
    main()
