"""Assembles one sidecar from its config: client, model state, forwarder, engine, data plane.

`Front` is what the HTTP routes use; a front process of a sidecar with several
(`carpool_sidecar.fronts`) is one without an engine of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from carpool.engine.metrics import SidecarMetrics
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.client import ModelClient
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.converting import Converter
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.forwarder import ModelBatcher, ModelServerForwarder
from carpool_sidecar.health import ModelState
from carpool_sidecar.reading import ReadingBudget
from carpool_sidecar.reload import SettingsFile
from carpool_sidecar.sending import AnswerSending
from carpool_sidecar.streaming import GenerationMetrics, Streams

log = logging.getLogger("carpool_sidecar")


@dataclass(frozen=True, slots=True)
class Front:
    """What the HTTP routes serve from; the app runs its `jobs` while it serves."""

    config: SidecarConfig
    registry: CollectorRegistry
    metrics: SidecarMetrics
    dataplane: DataPlane
    reading: ReadingBudget
    converter: Converter
    sending: AnswerSending
    # Run before each scrape of `registry`, for counts kept elsewhere (gRPC's own).
    before_scrape: list[Callable[[], None]] = field(default_factory=list)

    def jobs(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The background tasks, by name; each runs until cancelled."""
        return {}

    def job_died(self, name: str) -> None:
        """A job that ends early leaves the sidecar unable to serve: not live, not ready."""
        self.dataplane.mark_broken(f"its {name} task ended; see the sidecar log")

    async def scrape(self) -> bytes:
        """The Prometheus text of /metrics."""
        for update in self.before_scrape:
            update()
        return generate_latest(self.registry)

    async def close(self) -> None:
        """After the jobs have ended."""
        self.converter.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Sidecar(Front):
    """The object graph of one sidecar that batches: its engine and its model client."""

    client: ModelClient
    state: ModelState
    batcher: ModelBatcher
    settings_file: SettingsFile | None

    def jobs(self) -> dict[str, Coroutine[Any, Any, None]]:
        jobs = {
            "model-state": self.state.poll(
                self.client, lambda metadata: self.batcher.limit_batch_size(metadata.max_batch_size)
            ),
            "dispatcher": self.batcher.run(),
        }
        if self.settings_file is not None:
            jobs["settings-file"] = self.settings_file.watch()
        return jobs

    async def close(self) -> None:
        self.converter.close()
        await self.client.close()

    async def drain(self, grace_s: float) -> None:
        """Send everything queued; what is left after `grace_s` is answered 503."""
        batcher = self.batcher
        log.info("draining %d queued items (grace %.1f s)", batcher.queued_items, grace_s)
        if not await batcher.drain(grace_s):
            log.warning("drain grace over with %d items queued", batcher.queued_items)
            # Every caller still waiting gets 503 before the connections close.
            await batcher.abort()


def build_sidecar(config: SidecarConfig, registry: CollectorRegistry) -> Sidecar:
    """Needs a running event loop (the engine's)."""
    metrics = SidecarMetrics(registry, config.model_name)
    client = ModelClient(config.model_server)
    state = ModelState()
    batcher = ModelBatcher(config.batching, ModelServerForwarder(client, state), metrics)
    settings_file = None
    if config.config_file is not None:
        settings_file = SettingsFile(Path(config.config_file), config.batching, batcher)
        settings_file.load(settings_file.read())
    answers = AnswerBudget(
        config.max_answer_bytes, config.max_unsent_bytes, metrics.unsent_answer_bytes
    )
    streams = Streams(client, GenerationMetrics(registry, config.model_name))
    dataplane = DataPlane(config.model_name, batcher, state, answers, streams)
    reading = ReadingBudget(config.max_reading_bytes)
    return Sidecar(
        config=config, registry=registry, metrics=metrics, dataplane=dataplane, reading=reading,
        converter=Converter(reading), sending=AnswerSending(config.body_timeout_s),
        client=client, state=state, batcher=batcher, settings_file=settings_file,
    )  # fmt: skip
