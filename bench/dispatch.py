"""Timed against adaptive dispatch on one model, in alternating rounds, against its limit.

    python bench/dispatch.py --rounds 3 --duration 5       # MiniLM, short texts, threads 1

Both carpool servers (one per dispatch policy) and an unbatched server run for the whole
run; each round loads them in turn, the unbatched one at one client only (the latency a
lone caller would have without batching), then runs bench/limit.py. Prints per policy and
concurrency the medians over rounds of items/s, items/s over the limit at batch size
min(c, maxBatchSize), mean batch size and p50, and timed/adaptive paired round by round.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import click
import servers

from carpool import processes
from carpool.loadgen import runner, workload
from carpool.loadgen.report import CellResult

POLICIES = ("timed", "adaptive")
REASONS = ("idle", "model_ready", "timeout", "full")


def _limit(settings: servers.ModelSettings, text_length: workload.TextLength) -> dict[int, float]:
    """Items/s of the model in process, by batch size (bench/limit.py)."""
    done = subprocess.run(
        [
            sys.executable,
            str(servers.BENCH_DIR / "limit.py"),
            "--handler",
            settings.handler,
            "--torch-threads",
            str(settings.torch_threads),
            "--text-length",
            text_length,
            "--max-batch-size",
            str(settings.max_batch_size),
        ],
        capture_output=True,
        text=True,
        env=processes.environment(servers.OFFLINE),
        check=True,
    )
    rows = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].isdigit():
            rows[int(fields[0])] = float(fields[2])
    return rows


async def _cells(
    url: str, prepared: list[workload.PreparedRequest], levels: tuple[int, ...], duration: float
) -> list[CellResult]:
    settings = runner.RunSettings(
        url=url,
        mode="concurrency",
        levels=levels,
        duration=duration,
        metrics_url=url + "/metrics",
        warmup_seconds=1.0,
        progress=False,
    )
    return await runner.run(settings, prepared)


@click.command()
@click.option("--handler", default="text-embedding", show_default=True)
@click.option("--torch-threads", default=1, show_default=True)
@click.option("--concurrency", default="1,8,32,64", show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--duration", default=5.0, show_default=True, help="seconds per level")
@click.option("--max-batch-size", default=32, show_default=True)
@click.option("--max-wait-ms", default=5.0, show_default=True)
@click.option("--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="short")
def main(
    handler: str,
    torch_threads: int,
    concurrency: str,
    rounds: int,
    duration: float,
    max_batch_size: int,
    max_wait_ms: float,
    text_length: workload.TextLength,
) -> None:
    levels = tuple(int(level) for level in concurrency.split(","))
    settings = servers.ModelSettings(
        handler, handler, "cpu", torch_threads, max_batch_size, max_wait_ms
    )
    prepared = workload.build(
        workload.WorkloadSpec(
            protocol="oip-json",
            payload="text",
            model_name=handler,
            input_name="text",
            text_length=text_length,
        )
    )
    # No gRPC front: its fixed port would clash between the two.
    carpool = servers.carpool(settings).command
    variants = {
        policy: servers.Variant(policy, (*carpool, "--grpc-port", "0", "--dispatch", policy))
        for policy in POLICIES
    }
    variants["unbatched"] = servers.unbatched(settings)
    # (policy, concurrency) -> one cell per round; limit size -> items/s per round.
    cells: dict[tuple[str, int], list[CellResult]] = {}
    limits: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="carpool-dispatch-") as logs, ExitStack() as stack:
        running = {
            name: stack.enter_context(servers.started(variant, Path(logs) / f"{name}.log", 300))
            for name, variant in variants.items()
        }
        for round_number in range(1, rounds + 1):
            for name, server in running.items():
                loads = (1,) if name == "unbatched" else levels
                for cell in asyncio.run(_cells(server.url, prepared, loads, duration)):
                    cells.setdefault((name, int(cell.level)), []).append(cell)
            for size, rate in _limit(settings, text_length).items():
                limits.setdefault(size, []).append(rate)
            click.echo(f"round {round_number} done", err=True)
    med = statistics.median
    click.echo(
        f"{handler}, torch threads {torch_threads}, {text_length} texts, {rounds} rounds "
        f"of {duration:g} s per level, maxBatchSize {max_batch_size}, "
        f"maxWaitMs {max_wait_ms:g}; medians over rounds"
    )
    by_size = sorted(limits.items())
    click.echo("limit items/s: " + ", ".join(f"b={s} {med(r):.1f}" for s, r in by_size))
    for (name, level), runs in sorted(cells.items()):
        size = min(level, max_batch_size)
        ceiling = limits.get(size, [])
        ratios = [c.items_per_second / limit for c, limit in zip(runs, ceiling, strict=False)]
        stats = [c.batching for c in runs if c.batching]
        batch = [c.mean_items_per_batch for c in stats]
        click.echo(
            f"{name:>9} c={level:<3} items/s {med(c.items_per_second for c in runs):7.1f}"
            f"  /limit(b={size}) {med(ratios) if ratios else float('nan'):.2f}"
            f"  batch {med(batch) if batch else float('nan'):5.2f}"
            f"  p50 {1000 * med(c.latency.p50 for c in runs):7.1f} ms"
            + (
                f"  queue wait {1000 * med(c.queue_wait_mean for c in stats):5.2f} ms  "
                + " ".join(
                    f"{r}={sum(c.batches_by_reason.get(r, 0) for c in stats):g}" for r in REASONS
                )
                if stats
                else ""
            )
        )
    for level in levels:
        pairs = zip(cells[("timed", level)], cells[("adaptive", level)], strict=True)
        ratio = med(t.items_per_second / a.items_per_second for t, a in pairs)
        click.echo(f"timed/adaptive c={level}: items/s {ratio:.2f}")
    if (1 in levels) and ("unbatched", 1) in cells:
        for policy in POLICIES:
            pairs = zip(cells[(policy, 1)], cells[("unbatched", 1)], strict=True)
            click.echo(
                f"{policy}/unbatched p50 at c=1: "
                f"{med(p.latency.p50 / u.latency.p50 for p, u in pairs):.2f}"
            )


if __name__ == "__main__":
    main()
