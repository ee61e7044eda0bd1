"""A scrape of a sidecar with front processes, when the batching process fails to gather."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from types import SimpleNamespace
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, Counter, Metric

from carpool.engine.errors import SidecarError
from carpool.engine.settings import BatchingSettings
from carpool_sidecar.build import Sidecar
from carpool_sidecar.fronts import hub as hub_module
from carpool_sidecar.fronts import link
from carpool_sidecar.fronts.hub import Hub
from carpool_sidecar.fronts.remote import RemoteBatcher


class Broken:
    """A collector with a bug."""

    def collect(self) -> Iterable[Metric]:
        raise RuntimeError("no figures today")


async def test_a_collector_that_raises_answers_the_scrape_with_a_500_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    registry.register(Broken())
    settings = BatchingSettings()
    # The little of a sidecar a hub reads: its state, to tell the front, and its metrics.
    sidecar = SimpleNamespace(
        registry=registry,
        before_scrape=[],
        state=SimpleNamespace(ready=True, metadata=None),
        batcher=SimpleNamespace(settings=settings, draining=False),
        dataplane=SimpleNamespace(stopping=False, broken=None),
    )
    hub = Hub(cast(Sidecar, sidecar))
    ours, theirs = socket.socketpair()
    front = RemoteBatcher(await link.connect(theirs), settings, CollectorRegistry(), print)
    hub_end = await link.connect(ours)
    serving = asyncio.create_task(hub.serve(hub_end))
    reading = asyncio.create_task(front.run())
    try:
        async with asyncio.timeout(1):  # not the front's 5 s wait for an answer
            with pytest.raises(SidecarError) as raised:
                await front.scrape()
    finally:
        hub_end.close()
        await asyncio.wait((serving, reading), timeout=5)
    assert raised.value.status == 500
    logged = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert [record.getMessage() for record in logged] == [
        "unexpected error gathering the pod's metrics"
    ]


async def test_a_front_slow_to_send_its_metrics_keeps_its_counts_in_the_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hub_module, "COLLECT_TIMEOUT_S", 0.05)
    settings = BatchingSettings()
    sidecar = SimpleNamespace(
        registry=CollectorRegistry(),
        before_scrape=[],
        state=SimpleNamespace(ready=True, metadata=None),
        batcher=SimpleNamespace(settings=settings, draining=False),
        dataplane=SimpleNamespace(stopping=False, broken=None),
    )
    hub = Hub(cast(Sidecar, sidecar))
    slow_registry = CollectorRegistry()
    Counter("answered", "Answers.", registry=slow_registry).inc(3)
    tasks: list[asyncio.Task[None]] = []
    links: list[link.Link] = []
    fronts: list[RemoteBatcher] = []
    for registry in (CollectorRegistry(), slow_registry):
        ours, theirs = socket.socketpair()
        front = RemoteBatcher(await link.connect(theirs), settings, registry, print)
        hub_end = await link.connect(ours)
        links.append(hub_end)
        fronts.append(front)
        tasks += [asyncio.create_task(hub.serve(hub_end)), asyncio.create_task(front.run())]
    scraper, _ = fronts
    try:
        assert b"answered_total 3.0" in await scraper.scrape()
        tasks[3].cancel()  # the slow front reads its link no more
        assert b"answered_total 3.0" in await scraper.scrape()
    finally:
        for hub_end in links:
            hub_end.close()
        await asyncio.wait(tasks, timeout=5)
