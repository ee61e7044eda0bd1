"""A latency objective under overload: with it against without, on one server, in turns.

    python bench/objective.py --handler stand-in --handler-options preset=slow
    python bench/objective.py --handler text-embedding --torch-threads 1   # MiniLM, this CPU

One `carpool serve` with a settings file, switched between no objective and
`--objective-ms` by the live reload (`timeoutMs` is `--timeout-ms` in both, so that requests
that wait too long get 504 rather than waiting 30 s). Its capacity is measured first (64
closed-loop clients, no objective, no deadline); then each round loads both variants in
turn, in an order that reverses round by round, each load first 3 s unrecorded: a Poisson
load at `--overload` times the capacity, and bursts (`--burst-factor` times a mean rate of
`--burst-base` times the capacity, for 1 s in every 10). Prints per variant and load the
medians over rounds: the share of requests answered within the objective, that of answered
requests (as the client and as the sidecar time them), 429s and how long they took, 504s.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import click
import servers

from carpool.loadgen import runner, workload
from carpool.loadgen.loops import LoopResult, closed_loop, open_loop, poisson_arrivals

SETTLE_S = 1.5
WARMUP_S = 3.0
CAPACITY_CLIENTS = 64


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    within: float  # share of all requests answered 200 within the objective
    within_answered: float  # share of 200s within it
    refused: int  # 429
    refused_p50_ms: float
    refused_p99_ms: float
    expired: int  # 504
    answered_per_s: float
    sidecar_within: float  # share of the 200s within the objective as the sidecar timed them


async def answers(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """The sidecar's counts so far: requests answered 200, and those within the objective."""
    snapshot = await runner.read_metrics(session, url + "/metrics")
    assert snapshot is not None
    ok = sum(
        value
        for (name, labels), value in snapshot.items()
        if name == "carpool_requests_total" and ("code", "200") in labels
    )
    within = sum(
        value
        for (name, _), value in snapshot.items()
        if name == "carpool_requests_within_objective_total"
    )
    return ok, within


def figures(result: LoopResult, objective_s: float, sidecar_within: float) -> Figures:
    ok = [o.latency for o in result.outcomes if o.status == 200]
    refused = sorted(o.latency for o in result.outcomes if o.status == 429)
    count = len(result.outcomes)
    return Figures(
        requests=count,
        within=sum(latency <= objective_s for latency in ok) / count,
        within_answered=sum(latency <= objective_s for latency in ok) / max(1, len(ok)),
        refused=len(refused),
        refused_p50_ms=1000 * refused[len(refused) // 2] if refused else float("nan"),
        refused_p99_ms=1000 * refused[int(0.99 * (len(refused) - 1))] if refused else float("nan"),
        expired=sum(o.status == 504 for o in result.outcomes),
        answered_per_s=len(ok) / result.wall_seconds,
        sidecar_within=sidecar_within,
    )


def bursts(base_rate: float, factor: float, seconds: float, rng: random.Random) -> list[float]:
    """Poisson arrivals at `base_rate`, `factor` times as fast for 1 s in every 10 (from 4 s)."""
    arrivals, now = [], 0.0
    while True:
        rate = base_rate * (factor if now % 10 >= 4 and now % 10 < 5 else 1)
        now += rng.expovariate(rate)
        if now >= seconds:
            return arrivals
        arrivals.append(now)


def write(path: Path, objective_ms: float, timeout_ms: float) -> None:
    document = {"latencyObjectiveMs": objective_ms, "timeoutMs": timeout_ms}
    path.write_text(json.dumps(document))


@dataclass(frozen=True, slots=True)
class Plan:
    objective_ms: float
    timeout_ms: float
    rounds: int
    duration: float  # seconds of Poisson load
    overload: float  # its rate, times the capacity
    burst_base: float  # the mean rate of the bursty load, times the capacity
    burst_factor: float
    burst_seconds: float


async def run(
    url: str, prepared: list[workload.PreparedRequest], settings_path: Path, plan: Plan
) -> None:
    objective_ms, timeout_ms, duration = plan.objective_ms, plan.timeout_ms, plan.duration
    connector = aiohttp.TCPConnector(limit=4096)
    async with aiohttp.ClientSession(connector=connector) as session:
        send = runner.make_sender(session, url, prepared)
        # No deadline while the capacity is measured: 504s would understate it.
        write(settings_path, 0, 30_000)
        await asyncio.sleep(SETTLE_S)
        await closed_loop(send, CAPACITY_CLIENTS, duration=2.0)  # warm-up
        measured = await closed_loop(send, CAPACITY_CLIENTS, duration=duration)
        ok = sum(o.status == 200 for o in measured.outcomes)
        capacity = ok / measured.wall_seconds
        print(f"capacity: {capacity:.1f} requests/s at {CAPACITY_CLIENTS} clients", flush=True)
        rng = random.Random(0)
        results: dict[tuple[str, str], list[Figures]] = {}
        for number in range(plan.rounds):
            variants = [("none", 0.0), (f"{objective_ms:g} ms", objective_ms)]
            for name, objective in variants if number % 2 == 0 else variants[::-1]:
                write(settings_path, objective, timeout_ms)
                await asyncio.sleep(SETTLE_S)
                # Let the queue of the last run drain, and the engine see a few batches.
                await closed_loop(send, 4, duration=1.0)
                loads = {
                    f"poisson {plan.overload:g}x": poisson_arrivals(
                        plan.overload * capacity, rng, duration=duration
                    ),
                    f"bursts {plan.burst_factor:g}x": bursts(
                        plan.burst_base * capacity, plan.burst_factor, plan.burst_seconds, rng
                    ),
                }
                for load, arrivals in loads.items():
                    # Unrecorded, the same load: the engine learns it (with an objective, how
                    # late its answers come against its predictions) as in a steady state.
                    await open_loop(send, [at for at in arrivals if at < WARMUP_S])
                    await closed_loop(send, 1, duration=1.0)
                    started = time.monotonic()
                    ok_before, within_before = await answers(session, url)
                    result = await open_loop(send, arrivals)
                    ok_after, within_after = await answers(session, url)
                    sidecar_within = (within_after - within_before) / max(1, ok_after - ok_before)
                    got = figures(result, objective_ms / 1000, sidecar_within)
                    results.setdefault((load, name), []).append(got)
                    print(
                        f"round {number + 1} {load:>12} objective {name:>7}: {got} "
                        f"({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
                    await closed_loop(send, 1, duration=1.0)
        med = statistics.median
        print("\nmedians over rounds:")
        for (load, name), runs in results.items():
            print(
                f"{load:>12} objective {name:>7}: requests {med(r.requests for r in runs):6.0f}"
                f"  within {objective_ms:g} ms {100 * med(r.within for r in runs):5.1f} %"
                f" (of answered {100 * med(r.within_answered for r in runs):5.1f} %,"
                f" as the sidecar times them {100 * med(r.sidecar_within for r in runs):5.1f} %)"
                f"  answered/s {med(r.answered_per_s for r in runs):7.1f}"
                f"  429 {med(r.refused for r in runs):6.0f}"
                f" in p50 {med(r.refused_p50_ms for r in runs):5.1f} ms"
                f" p99 {med(r.refused_p99_ms for r in runs):5.1f} ms"
                f"  504 {med(r.expired for r in runs):6.0f}"
            )


@click.command()
@click.option("--handler", default="stand-in", show_default=True)
@click.option("--handler-options", default="preset=slow", show_default=True)
@click.option("--torch-threads", default=1, show_default=True)
@click.option("--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="short")
@click.option("--objective-ms", default=200.0, show_default=True)
@click.option("--timeout-ms", default=1000.0, show_default=True)
@click.option("--rounds", default=2, show_default=True)
@click.option("--duration", default=6.0, show_default=True, help="seconds of Poisson load")
@click.option("--overload", default=1.5, show_default=True, help="times the capacity")
@click.option("--burst-base", default=0.5, show_default=True, help="times the capacity")
@click.option("--burst-factor", default=10.0, show_default=True)
@click.option("--burst-seconds", default=20.0, show_default=True)
def main(
    handler: str,
    handler_options: str,
    torch_threads: int,
    text_length: workload.TextLength,
    objective_ms: float,
    timeout_ms: float,
    rounds: int,
    duration: float,
    overload: float,
    burst_base: float,
    burst_factor: float,
    burst_seconds: float,
) -> None:
    settings = servers.ModelSettings(
        handler,
        handler,
        "cpu",
        torch_threads,
        32,
        5.0,
        "" if handler != "stand-in" else handler_options,
    )
    prepared = servers.oip_json_load(handler, text_length)
    with tempfile.TemporaryDirectory(prefix="carpool-objective-") as folder:
        settings_path = Path(folder) / "batching.json"
        write(settings_path, 0, timeout_ms)
        variant = servers.carpool(settings)
        variant = servers.Variant(
            "carpool", (*variant.command, "--config-file", str(settings_path))
        )
        print(f"{handler} {settings.handler_options} torch threads {torch_threads}")
        with servers.started(variant, Path(folder) / "serve.log", timeout_s=300) as server:
            plan = Plan(
                objective_ms, timeout_ms, rounds, duration, overload, burst_base,
                burst_factor, burst_seconds,
            )  # fmt: skip
            asyncio.run(run(server.url, prepared, settings_path, plan))


if __name__ == "__main__":
    main()
