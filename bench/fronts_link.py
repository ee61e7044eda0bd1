"""What front processes add per request: the link to the batching process, both sides.

    python bench/fronts_link.py --clients 64 --seconds 3 --rounds 3

The model is free (a sender that echoes each item at once), so what is measured is the
sidecar's own work past parsing, in alternating rounds:
`in-process`: callers in one process submit one-item requests to the engine itself, as the
data plane of a one-process sidecar does; `link`: the same callers submit through a
RemoteBatcher over a socket pair to a child process that runs the engine behind the hub, as
a front process does. Per variant: requests/s, and CPU microseconds per request of this
process (the caller's side) and of the child (the batching process's side).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
import time
from collections.abc import Sequence

import click
import numpy as np
import psutil
from prometheus_client import CollectorRegistry

from carpool import event_loop
from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.contract.wire import BatchTiming, Item, ItemResult, Tensor
from carpool.engine.batcher import Batcher
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings
from carpool_sidecar.build import Sidecar, build_sidecar
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.fronts import link
from carpool_sidecar.fronts.hub import Hub
from carpool_sidecar.fronts.remote import RemoteBatcher

TOY = ModelMetadata(
    name="toy",
    platform="echo",
    inputs=(TensorSpec("input", "FP32", (4,)),),
    outputs=(TensorSpec("output", "FP32", (4,)),),
    max_batch_size=32,
)
KEY = BatchKey((("input", "FP32", (4,)),))
ITEM: Item = {"input": Tensor.from_numpy(np.arange(4, dtype=np.float32))}
CONFIG = SidecarConfig(model_name="toy", model_server="unix:///nonexistent")


class Echo:
    """A model that takes no time: each item's input back as its output."""

    async def send(
        self, items: Sequence[Item], timeout_s: float
    ) -> tuple[list[ItemResult], BatchTiming | None]:
        return [ItemResult(outputs={"output": item["input"]}) for item in items], None


def engine(registry: CollectorRegistry) -> Batcher[Item, ItemResult]:
    return Batcher(BatchingSettings(), Echo(), SidecarMetrics(registry, "toy"))


async def load(
    submit: Batcher[Item, ItemResult] | RemoteBatcher, clients: int, seconds: float
) -> int:
    """One-item requests from `clients` closed-loop callers for `seconds`: how many."""
    done = 0
    stop_at = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            deadline = time.monotonic() + 5.0
            (result,) = await submit.submit([ITEM], KEY, deadline, nbytes=16)
            assert result.outputs is not None
            done += 1

    await asyncio.gather(*(caller() for _ in range(clients)))
    return done


async def in_process(clients: int, seconds: float) -> tuple[int, float]:
    batcher = engine(CollectorRegistry())
    dispatcher = asyncio.create_task(batcher.run())
    try:
        started = time.process_time()
        count = await load(batcher, clients, seconds)
        return count, time.process_time() - started
    finally:
        dispatcher.cancel()


async def through_link(clients: int, seconds: float) -> tuple[int, float, float]:
    ours, theirs = socket.socketpair()
    with theirs:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "hub", str(theirs.fileno()), pass_fds=[theirs.fileno()]
        )
    channel = await link.connect(ours)
    ready = asyncio.Event()
    remote = RemoteBatcher(channel, BatchingSettings(), CollectorRegistry(), lambda _: ready.set())
    reading = asyncio.create_task(remote.run())
    try:
        await ready.wait()
        them = psutil.Process(child.pid)
        theirs_before = sum(them.cpu_times()[:2])
        started = time.process_time()
        count = await load(remote, clients, seconds)
        return count, time.process_time() - started, sum(them.cpu_times()[:2]) - theirs_before
    finally:
        channel.close()
        await asyncio.wait_for(child.wait(), 10)
        await asyncio.gather(reading, return_exceptions=True)


async def hub(fd: int) -> None:
    """The child: the engine behind the hub, until the link closes."""
    registry = CollectorRegistry()
    built = build_sidecar(CONFIG, registry)
    sidecar = Sidecar(
        config=CONFIG, registry=registry, metrics=built.metrics, dataplane=built.dataplane,
        reading=built.reading, converter=built.converter, sending=built.sending,
        client=built.client, state=built.state,
        batcher=Batcher(BatchingSettings(), Echo(), built.metrics), settings_file=None,
    )  # fmt: skip
    sidecar.state.ready, sidecar.state.metadata = True, TOY
    dispatcher = asyncio.create_task(sidecar.batcher.run())
    try:
        await Hub(sidecar).serve(await link.connect(socket.socket(fileno=fd)))
    finally:
        dispatcher.cancel()
        await sidecar.close()


@click.command()
@click.option("--clients", default=64, show_default=True)
@click.option("--seconds", default=3.0, show_default=True)
@click.option("--rounds", default=3, show_default=True)
def main(clients: int, seconds: float, rounds: int) -> None:
    """Per request: CPU microseconds of the caller's and the batching process's side."""
    rows: dict[str, list[tuple[float, float, float]]] = {"in-process": [], "link": []}
    for number in range(rounds):
        for variant in ("in-process", "link") if number % 2 == 0 else ("link", "in-process"):
            if variant == "in-process":
                count, ours = event_loop.run(in_process(clients, seconds))
                theirs = 0.0
            else:
                count, ours, theirs = event_loop.run(through_link(clients, seconds))
            rows[variant].append((count / seconds, 1e6 * ours / count, 1e6 * theirs / count))
    click.echo(f"{clients} clients, one-item requests, {rounds} rounds of {seconds:g} s; medians")
    for variant, cells in rows.items():
        rate, ours_us, theirs_us = (
            statistics.median(column) for column in zip(*cells, strict=True)
        )
        click.echo(
            f"{variant:10s} {rate:8.0f} requests/s  caller {ours_us:5.1f} us/request  "
            f"batching process {theirs_us:5.1f} us/request"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["hub"]:
        event_loop.run(hub(int(sys.argv[2])))
    else:
        main()
