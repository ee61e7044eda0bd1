"""A latency objective under overload: with it against without, on one server, in turns.

    python bench/objective.py --handler stand-in --handler-options preset=slow
    python bench/objective.py --handler text-embedding --torch-threads 1   # MiniLM, this CPU

One `carpool serve` with a settings file, switched between no objective and
`--objective-ms` by the live reload (`timeoutMs` is `--timeout-ms` in both, so that requests
that wait too long get 504 rather than waiting 30 s). Its capacity is measured first (64
closed-loop clients, fewer for requests of many items so that no more than 512 are queued;
no objective, no deadline); then each round loads both variants in
turn, in an order that reverses round by round, each load first 3 s unrecorded: a Poisson
load at `--overload` times the capacity, and bursts (`--burst-factor` times a mean rate of
`--burst-base` times the capacity, for 1 s in every 10). Prints per variant and load the
medians over rounds: the share of requests answered within the objective, that of answered
requests (as the client and as the sidecar time them), 429s and how long they took, 504s.

A refusal's time is given three ways: at the client from when the request was due (what a
caller of an open loop sees), at the client from when the load generator sent it (its own
lateness in sending left out), and at the sidecar (`carpool_refusal_seconds`: from the
handler's start to the 429, quantiles as the upper bound of their histogram bucket); beside
them, how late the load generator's own event loop wakes from a 1 ms sleep meanwhile (the
part of the client's figures that is the client's).
`--items` sends that many items in each request, to overload in items a model too fast to
overload in requests. `--baseline` (an older checkout with its own .venv) runs its `carpool
serve` beside this tree's, with and without the objective in the same turns, at the rate
measured on this tree's.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import click
import servers

from carpool.loadgen import runner, workload
from carpool.loadgen.loops import LoopResult, Send, closed_loop, open_loop, poisson_arrivals

SETTLE_S = 1.5
WARMUP_S = 3.0
CAPACITY_CLIENTS = 64
# Items the capacity's closed loop keeps queued at most: below maxQueueItems' 1,024.
CAPACITY_ITEMS = 512


QUANTILES = (0.5, 0.95, 0.99, 1.0)
PROBE_S = 0.001


@dataclass(frozen=True, slots=True)
class Spread:
    """Milliseconds at QUANTILES (nan when there are none)."""

    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: list[float]) -> Spread:
        ordered = sorted(seconds)
        if not ordered:
            return cls(*(math.nan for _ in QUANTILES))
        return cls(*(1000 * ordered[round(q * (len(ordered) - 1))] for q in QUANTILES))

    def __str__(self) -> str:
        return f"{self.p50:.1f}/{self.p95:.1f}/{self.p99:.1f}/{self.max:.1f}"


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    within: float  # share of all requests answered 200 within the objective
    within_answered: float  # share of 200s within it
    refused: int  # 429
    refused_due: Spread  # at the client, from when the request was due
    refused_sent: Spread  # at the client, from when it was sent
    refused_sidecar: Spread  # at the sidecar (histogram bucket bounds)
    client_lag: Spread  # how late the load generator's loop woke from 1 ms sleeps
    expired: int  # 504
    answered_per_s: float
    sidecar_within: float  # share of the 200s within the objective as the sidecar timed them


@dataclass(frozen=True, slots=True)
class Counts:
    """The sidecar's counts so far."""

    ok: float  # answered 200
    within: float  # of those, within the objective
    refusal_buckets: dict[float, float]  # carpool_refusal_seconds: upper bound -> cumulative


async def counts(session: aiohttp.ClientSession, url: str) -> Counts:
    snapshot = await runner.read_metrics(session, url + "/metrics")
    assert snapshot is not None
    ok = within = 0.0
    buckets: dict[float, float] = {}
    for (name, labels), value in snapshot.items():
        if name == "carpool_requests_total" and ("code", "200") in labels:
            ok += value
        elif name == "carpool_requests_within_objective_total":
            within += value
        elif name == "carpool_refusal_seconds_bucket":
            bound = float(dict(labels)["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    return Counts(ok, within, buckets)


def bucket_spread(before: Counts, after: Counts) -> Spread:
    """Quantiles of the refusals between two counts: each its bucket's upper bound."""
    cumulative = sorted(
        (bound, after.refusal_buckets[bound] - before.refusal_buckets.get(bound, 0.0))
        for bound in after.refusal_buckets
    )
    total = cumulative[-1][1] if cumulative else 0.0
    if not total:
        return Spread.of([])
    return Spread(*(1000 * next(b for b, c in cumulative if c >= q * total) for q in QUANTILES))


class LoopLag:
    """How late this event loop wakes from PROBE_S sleeps, while it runs."""

    def __init__(self) -> None:
        self.late: list[float] = []

    async def run(self) -> None:
        while True:
            asked = time.monotonic() + PROBE_S
            await asyncio.sleep(PROBE_S)
            self.late.append(time.monotonic() - asked)


class TimedSend:
    """`send`, keeping each request's status and round trip from when it was sent."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.round_trips: list[tuple[int, float]] = []

    async def __call__(self, index: int) -> int:
        started = time.monotonic()
        status = await self._send(index)
        self.round_trips.append((status, time.monotonic() - started))
        return status


def figures(
    result: LoopResult,
    round_trips: list[tuple[int, float]],
    before: Counts,
    after: Counts,
    objective_s: float,
    lag: list[float],
) -> Figures:
    ok = [o.latency for o in result.outcomes if o.status == 200]
    refused = [o for o in result.outcomes if o.status == 429]
    count = len(result.outcomes)
    return Figures(
        requests=count,
        within=sum(latency <= objective_s for latency in ok) / count,
        within_answered=sum(latency <= objective_s for latency in ok) / max(1, len(ok)),
        refused=len(refused),
        refused_due=Spread.of([o.latency for o in refused]),
        refused_sent=Spread.of([took for status, took in round_trips if status == 429]),
        refused_sidecar=bucket_spread(before, after),
        client_lag=Spread.of(lag),
        expired=sum(o.status == 504 for o in result.outcomes),
        answered_per_s=len(ok) / result.wall_seconds,
        sidecar_within=(after.within - before.within) / max(1, after.ok - before.ok),
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


@dataclass(frozen=True, slots=True)
class Server:
    """A running `carpool serve` of one tree, and the settings file it reloads."""

    tree: str  # "" for this one
    url: str
    settings_path: Path


async def run(running: list[Server], prepared: list[workload.PreparedRequest], plan: Plan) -> None:
    clients = min(CAPACITY_CLIENTS, CAPACITY_ITEMS // prepared[0].items)
    objective_ms, timeout_ms, duration = plan.objective_ms, plan.timeout_ms, plan.duration
    connector = aiohttp.TCPConnector(limit=4096)
    async with aiohttp.ClientSession(connector=connector) as session:
        sends = {
            server.tree: TimedSend(runner.make_sender(session, server.url, prepared))
            for server in running
        }
        for server in running:
            # No deadline while the capacity is measured: 504s would understate it.
            write(server.settings_path, 0, 30_000)
        await asyncio.sleep(SETTLE_S)
        for send in sends.values():
            await closed_loop(send, clients, duration=2.0)  # warm-up
        measured = await closed_loop(sends[running[0].tree], clients, duration=duration)
        ok = sum(o.status == 200 for o in measured.outcomes)
        capacity = ok / measured.wall_seconds
        print(f"capacity: {capacity:.1f} requests/s at {clients} clients", flush=True)
        rng = random.Random(0)
        results: dict[tuple[str, str], list[Figures]] = {}
        for number in range(plan.rounds):
            variants = [
                (server, f"{server.tree}{name}", objective)
                for server in running
                for name, objective in (("none", 0.0), (f"{objective_ms:g} ms", objective_ms))
            ]
            for server, name, objective in variants if number % 2 == 0 else variants[::-1]:
                url, send = server.url, sends[server.tree]
                write(server.settings_path, objective, timeout_ms)
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
                    before = await counts(session, url)
                    send.round_trips.clear()
                    lag = LoopLag()
                    probe = asyncio.create_task(lag.run())
                    result = await open_loop(send, arrivals)
                    probe.cancel()
                    after = await counts(session, url)
                    got = figures(
                        result, send.round_trips, before, after, objective_ms / 1000, lag.late
                    )
                    results.setdefault((load, name), []).append(got)
                    print(
                        f"round {number + 1} {load:>12} objective {name:>12}: {got} "
                        f"({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
                    await closed_loop(send, 1, duration=1.0)
        med = statistics.median
        print("\nmedians over rounds:")
        for (load, name), runs in results.items():
            print(
                f"{load:>12} objective {name:>12}: requests {med(r.requests for r in runs):6.0f}"
                f"  within {objective_ms:g} ms {100 * med(r.within for r in runs):5.1f} %"
                f" (of answered {100 * med(r.within_answered for r in runs):5.1f} %,"
                f" as the sidecar times them {100 * med(r.sidecar_within for r in runs):5.1f} %)"
                f"  answered/s {med(r.answered_per_s for r in runs):7.1f}"
                f"  429 {med(r.refused for r in runs):6.0f}"
                f"  504 {med(r.expired for r in runs):6.0f}"
            )
            for what in ("refused_due", "refused_sent", "refused_sidecar", "client_lag"):
                spreads = [getattr(r, what) for r in runs]
                spread = Spread(
                    *(med(getattr(one, q) for one in spreads) for q in ("p50", "p95", "p99", "max"))
                )
                print(f"{'':>12}   ms p50/p95/p99/max, {what}: {spread}")


@click.command()
@click.option("--handler", default="stand-in", show_default=True)
@click.option("--handler-options", default="preset=slow", show_default=True)
@click.option("--torch-threads", default=1, show_default=True)
@click.option("--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="short")
@click.option("--items", default=1, show_default=True, help="items in each request")
@click.option("--binary", is_flag=True, help="their data as binary tensor data, not JSON")
@click.option("--max-batch-size", default=32, show_default=True)
@click.option("--objective-ms", default=200.0, show_default=True)
@click.option("--timeout-ms", default=1000.0, show_default=True)
@click.option("--rounds", default=2, show_default=True)
@click.option("--duration", default=6.0, show_default=True, help="seconds of Poisson load")
@click.option("--overload", default=1.5, show_default=True, help="times the capacity")
@click.option("--burst-base", default=0.5, show_default=True, help="times the capacity")
@click.option("--burst-factor", default=10.0, show_default=True)
@click.option("--burst-seconds", default=20.0, show_default=True)
@click.option(
    "--baseline",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="an older checkout with its own .venv, run beside this tree in the same turns",
)
def main(
    handler: str,
    handler_options: str,
    torch_threads: int,
    text_length: workload.TextLength,
    items: int,
    binary: bool,
    max_batch_size: int,
    objective_ms: float,
    timeout_ms: float,
    rounds: int,
    duration: float,
    overload: float,
    burst_base: float,
    burst_factor: float,
    burst_seconds: float,
    baseline: Path | None,
) -> None:
    settings = servers.ModelSettings(
        handler,
        handler,
        "cpu",
        torch_threads,
        max_batch_size,
        5.0,
        "" if handler != "stand-in" else handler_options,
    )
    protocol: workload.Protocol = "oip-binary" if binary else "oip-json"
    prepared = servers.oip_json_load(handler, text_length, items, protocol)
    carpool = servers.carpool(settings).command
    trees = {"": carpool}
    if baseline is not None:
        python = str(baseline / ".venv" / "bin" / "python")
        trees["base "] = (python, "-m", "carpool", *carpool[carpool.index("serve") :])
    print(
        f"{handler} {settings.handler_options} torch threads {torch_threads}, {items} "
        f"items a request ({protocol}), maxBatchSize {max_batch_size}"
    )
    plan = Plan(
        objective_ms, timeout_ms, rounds, duration, overload, burst_base, burst_factor,
        burst_seconds,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="carpool-objective-") as folder, ExitStack() as stack:
        serving = []
        for index, (tree, command) in enumerate(trees.items()):
            settings_path = Path(folder) / f"batching-{index}.json"
            write(settings_path, 0, timeout_ms)
            variant = servers.Variant("carpool", (*command, "--config-file", str(settings_path)))
            log_path = Path(folder) / f"serve-{index}.log"
            server = stack.enter_context(servers.started(variant, log_path, timeout_s=300))
            serving.append(Server(tree, server.url, settings_path))
        asyncio.run(run(serving, prepared, plan))


if __name__ == "__main__":
    main()
