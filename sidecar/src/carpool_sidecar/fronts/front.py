"""A front process: `python -m carpool_sidecar.fronts.front LINK_FD LISTEN_FD`.

It serves the sidecar's routes on the listening socket it was handed, with a RemoteBatcher
for an engine, until the batching process says to close (its drain) or is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import pickle
import signal
import socket
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from carpool import event_loop, heap
from carpool.engine.metrics import SidecarMetrics
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.app import front_app
from carpool_sidecar.build import Front
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.converting import Converter
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.fronts import link
from carpool_sidecar.fronts.link import State
from carpool_sidecar.fronts.remote import RemoteBatcher
from carpool_sidecar.health import ModelState
from carpool_sidecar.reading import ReadingBudget
from carpool_sidecar.runner import SHUTDOWN_TIMEOUT_S, app_runner
from carpool_sidecar.sending import AnswerSending

log = logging.getLogger("carpool_sidecar.front")


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontProcess(Front):
    batcher: RemoteBatcher

    def jobs(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"link": self.batcher.run()}

    async def scrape(self) -> bytes:
        return await self.batcher.scrape()


def build_front(
    config: SidecarConfig, registry: CollectorRegistry, channel: link.Link
) -> FrontProcess:
    """A front with the pod's byte budgets shared equally among the fronts; needs a
    running event loop."""
    reading_bytes = config.max_reading_bytes // config.front_processes
    unsent_bytes = config.max_unsent_bytes // config.front_processes
    # A body or an answer larger than a front's share could never be held: the share is its
    # limit too, so that its caller hears 413, not a 503 that no retry gets past.
    config = dataclasses.replace(
        config,
        max_body_bytes=min(config.max_body_bytes, reading_bytes),
        max_answer_bytes=min(config.max_answer_bytes, unsent_bytes),
    )
    metrics = SidecarMetrics(registry, config.model_name)
    state = ModelState()
    answers = AnswerBudget(config.max_answer_bytes, unsent_bytes, metrics.unsent_answer_bytes)

    def take(news: State) -> None:
        state.ready, state.metadata = news.ready, news.metadata
        dataplane.stopping, dataplane.broken = news.stopping, news.broken
        metrics.keep_objective(news.settings.latency_objective_s)

    batcher = RemoteBatcher(channel, config.batching, registry, take)
    # Generation streams need one place that admits them to the model's running batch:
    # here every generate request takes the batcher (and is answered in one piece), its
    # generation metrics kept by the batching process.
    dataplane = DataPlane(
        config.model_name, batcher, state, answers, whole_generation=batcher.generated
    )
    reading = ReadingBudget(reading_bytes)
    return FrontProcess(
        config=config, registry=registry, metrics=metrics, dataplane=dataplane,
        reading=reading, converter=Converter(reading),
        sending=AnswerSending(config.body_timeout_s), batcher=batcher,
    )  # fmt: skip


async def serve(link_fd: int, listen_fd: int) -> int:
    channel = await link.connect(socket.socket(fileno=link_fd))
    first = channel.frames()
    code, _, payload = await anext(first)
    await first.aclose()
    if code != link.CONFIG:
        raise RuntimeError(f"front process: the first frame is {code}, not CONFIG")
    config: SidecarConfig = pickle.loads(payload)
    front = build_front(config, CollectorRegistry(), channel)
    runner = await app_runner(front_app(front), config)
    try:
        site = web.SockSite(runner, socket.socket(fileno=listen_fd))
        await site.start()
        heap.ready_to_serve()
        grace_s = await front.batcher.close_asked
        if grace_s is None:
            log.error("the sidecar's batching process is gone; this front stops")
            return 1
        front.sending.drained_by = asyncio.get_running_loop().time() + grace_s
        await site.stop()
        front.batcher.closed()
        # The batching process drains: every request sent to it gets its answer in time.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s + SHUTDOWN_TIMEOUT_S):
                await front.batcher.idle()
        await front.sending.finish(front.sending.drain_left_s())
    finally:
        await runner.cleanup()
    return 0


def main() -> None:
    link_fd, listen_fd = (int(arg) for arg in sys.argv[1:3])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The batching process leads the drain (CLOSE); a terminal's SIGINT to the whole group
    # is its to act on.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(event_loop.run(serve(link_fd, listen_fd)))


if __name__ == "__main__":
    main()
