"""Dispatch policies side by side on one model, in alternating rounds, against its limit.

    python bench/dispatch.py --rounds 3 --duration 5       # MiniLM, short texts, threads 1
    python bench/dispatch.py --handler stand-in --handler-options preset=fast \\
        --concurrency 1,8,32,128                           # a GPU's timing, on any machine
    python bench/dispatch.py --baseline /tmp/old-checkout  # ... and an older tree beside it

One `carpool serve` per dispatch policy (and per policy of `--baseline`, a checkout with its
own `.venv`) and an unbatched server run for the whole run; each round loads them in turn,
in an order that reverses round by round, the unbatched one at one client only (the latency
a lone caller would have without batching), then runs bench/limit.py. Prints per variant and
concurrency the medians over rounds of items/s, items/s over the limit at batch size
min(c, maxBatchSize), mean batch size, p50, p99 and p99/p50, the batches by reason, the CPU
seconds per second of the server's front, its model server, the load generator and the
whole machine (whose cores other work may share: is the machine the bound?), the seconds per
second the first three waited for a core (what stalls requests in flight), and ratios
paired round by round: each variant over the first policy, and over the unbatched server
at one client.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click
import psutil
import servers

from carpool import processes
from carpool.loadgen import runner, workload
from carpool.loadgen.report import CellResult

REASONS = ("idle", "model_ready", "timeout", "full")
UNBATCHED = "unbatched"


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU seconds per second during one cell: the server's front (the sidecar, or the
    whole unbatched server), its model server, this load generator, and the whole
    machine's busy time (the cores are shared: the rest is other work's); and the seconds
    per second each side was ready to run and waited for a core (on a machine this
    crowded, requests in flight stall meanwhile: the tail at high concurrency)."""

    front: float
    model: float
    generator: float
    machine: float
    front_waited: float
    model_waited: float
    generator_waited: float


def _busy_seconds() -> float:
    """The whole machine's busy CPU time so far: neither idle nor waiting on I/O, nor
    taken by the hypervisor."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0) - getattr(times, "steal", 0.0)


def _cell(
    server: servers.Running, prepared: list[workload.PreparedRequest], level: int, duration: float
) -> tuple[CellResult, Usage]:
    """One load level, and the CPU each side used and waited for meanwhile."""
    generator = psutil.Process()
    tree, waits = server.cpu_seconds(), server.waited_seconds()
    spent, busy = sum(generator.cpu_times()[:2]), _busy_seconds()
    generator_waits = servers.waited_seconds(generator)
    started = time.monotonic()
    (cell,) = asyncio.run(_cells(server.url, prepared, (level,), duration))
    elapsed = time.monotonic() - started
    after, waits_after = server.cpu_seconds(), server.waited_seconds()
    usage = Usage(
        (after["front"] - tree["front"]) / elapsed,
        (after["model"] - tree["model"]) / elapsed,
        (sum(generator.cpu_times()[:2]) - spent) / elapsed,
        (_busy_seconds() - busy) / elapsed,
        (waits_after["front"] - waits["front"]) / elapsed,
        (waits_after["model"] - waits["model"]) / elapsed,
        (servers.waited_seconds(generator) - generator_waits) / elapsed,
    )
    return cell, usage


def _limit(settings: servers.ModelSettings, text_length: workload.TextLength) -> dict[int, float]:
    """Items/s of the model in process, by batch size (bench/limit.py)."""
    done = subprocess.run(
        servers.limit_command(settings, text_length),
        capture_output=True,
        text=True,
        env=processes.environment(servers.OFFLINE),
        check=True,
    )
    return servers.limit_rates(done.stdout)


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


def _line(
    name: str, level: int, runs: list[CellResult], limits: list[float], usage: list[Usage]
) -> str:
    med = statistics.median
    ratios = [c.items_per_second / limit for c, limit in zip(runs, limits, strict=False)]
    stats = [c.batching for c in runs if c.batching]
    text = (
        f"{name:>14} c={level:<3} items/s {med(c.items_per_second for c in runs):7.1f}"
        f"  /limit {med(ratios) if ratios else float('nan'):.2f}"
        f"  p50 {1000 * med(c.latency.p50 for c in runs):6.2f} ms"
        f"  p99 {1000 * med(c.latency.p99 for c in runs):6.2f} ms"
        f"  p99/p50 {med(c.latency.p99 / c.latency.p50 for c in runs):4.2f}"
    )
    if stats:
        text += (
            f"  batch {med(c.mean_items_per_batch for c in stats):5.2f}"
            f"  queue wait {1000 * med(c.queue_wait_mean for c in stats):5.2f} ms  "
            + " ".join(
                f"{r}={sum(c.batches_by_reason.get(r, 0) for c in stats):g}" for r in REASONS
            )
        )
    return text + (
        f"  cpu front {med(u.front for u in usage):4.2f} model {med(u.model for u in usage):4.2f}"
        f" generator {med(u.generator for u in usage):4.2f}"
        f" machine {med(u.machine for u in usage):4.2f}"
        f"  waited front {med(u.front_waited for u in usage):4.2f}"
        f" model {med(u.model_waited for u in usage):4.2f}"
        f" generator {med(u.generator_waited for u in usage):4.2f}"
    )


@click.command()
@click.option("--handler", default="text-embedding", show_default=True)
@click.option("--handler-options", default="", help="e.g. preset=fast for stand-in")
@click.option("--torch-threads", default=1, show_default=True)
@click.option("--concurrency", default="1,8,32,64", show_default=True)
@servers.variant_options
@click.option("--rounds", default=3, show_default=True)
@click.option("--duration", default=5.0, show_default=True, help="seconds per level")
@click.option("--max-batch-size", default=32, show_default=True)
@click.option("--max-wait-ms", default=5.0, show_default=True)
@click.option("--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="short")
def main(
    handler: str,
    handler_options: str,
    torch_threads: int,
    concurrency: str,
    policies: tuple[str, ...],
    baseline: Path | None,
    rounds: int,
    duration: float,
    max_batch_size: int,
    max_wait_ms: float,
    text_length: workload.TextLength,
) -> None:
    levels = tuple(int(level) for level in concurrency.split(","))
    settings = servers.ModelSettings(
        handler, handler, "cpu", torch_threads, max_batch_size, max_wait_ms, handler_options
    )
    prepared = servers.oip_json_load(handler, text_length)
    # No gRPC front: its fixed port would clash between them.
    carpool = servers.carpool(settings).command
    trees = {"": carpool}
    if baseline is not None:
        python = str(baseline / ".venv" / "bin" / "python")
        trees["base-"] = (python, "-m", "carpool", *carpool[carpool.index("serve") :])
    variants = {
        prefix + policy: servers.Variant(prefix + policy, (*command, "--dispatch", policy))
        for prefix, command in trees.items()
        for policy in policies
    }
    variants[UNBATCHED] = servers.unbatched(settings)
    # (variant, concurrency) -> one cell per round; limit size -> items/s per round.
    cells: dict[tuple[str, int], list[CellResult]] = {}
    limits: dict[int, list[float]] = {}
    usage: dict[tuple[str, int], list[Usage]] = {}
    with tempfile.TemporaryDirectory(prefix="carpool-dispatch-") as logs, ExitStack() as stack:
        running = {
            name: stack.enter_context(servers.started(variant, Path(logs) / f"{name}.log", 300))
            for name, variant in variants.items()
        }
        order = list(running.items())
        for round_number in range(1, rounds + 1):
            for name, server in order if round_number % 2 else order[::-1]:
                loads = (1,) if name == UNBATCHED else levels
                for level in loads:
                    cell, used = _cell(server, prepared, level, duration)
                    cells.setdefault((name, level), []).append(cell)
                    usage.setdefault((name, level), []).append(used)
            for size, rate in _limit(settings, text_length).items():
                limits.setdefault(size, []).append(rate)
            click.echo(f"round {round_number} done", err=True)
    med = statistics.median
    click.echo(
        f"{handler} {handler_options}, torch threads {torch_threads}, {text_length} texts, "
        f"{rounds} rounds of {duration:g} s per level, maxBatchSize {max_batch_size}, "
        f"maxWaitMs {max_wait_ms:g}; medians over rounds"
    )
    by_size = sorted(limits.items())
    click.echo("limit items/s: " + ", ".join(f"b={s} {med(r):.1f}" for s, r in by_size))
    for (name, level), runs in sorted(cells.items()):
        size = min(level, max_batch_size)
        click.echo(_line(name, level, runs, limits.get(size, []), usage[(name, level)]))
    first = next(iter(variants))
    for name in variants:
        if name in (first, UNBATCHED):
            continue
        for level in levels:
            pairs = zip(cells[(name, level)], cells[(first, level)], strict=True)
            ratio = med(v.items_per_second / f.items_per_second for v, f in pairs)
            click.echo(f"{name}/{first} c={level}: items/s {ratio:.2f}")
    if 1 in levels:
        for name in variants:
            if name == UNBATCHED:
                continue
            pairs = list(zip(cells[(name, 1)], cells[(UNBATCHED, 1)], strict=True))
            click.echo(
                f"{name}/unbatched at c=1: p50 "
                f"{med(v.latency.p50 / u.latency.p50 for v, u in pairs):.3f} "
                f"(+{1000 * med(v.latency.p50 - u.latency.p50 for v, u in pairs):.2f} ms), "
                f"items/s {med(v.items_per_second / u.items_per_second for v, u in pairs):.3f}"
            )


if __name__ == "__main__":
    main()
