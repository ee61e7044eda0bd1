"""Assembles one sidecar from its config: client, model state, forwarder, engine, data plane."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

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


@dataclass(frozen=True, slots=True)
class Sidecar:
    """The object graph of one sidecar; the HTTP app serves `dataplane` and runs `jobs`."""

    config: SidecarConfig
    registry: CollectorRegistry
    metrics: SidecarMetrics
    client: ModelClient
    state: ModelState
    batcher: ModelBatcher
    dataplane: DataPlane
    settings_file: SettingsFile | None
    reading: ReadingBudget
    converter: Converter
    sending: AnswerSending
    # Run before each scrape of `registry`, for counts kept elsewhere (gRPC's own).
    before_scrape: list[Callable[[], None]] = field(default_factory=list)

    def jobs(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The background tasks, by name; each runs until cancelled."""
        jobs = {
            "model-state": self.state.poll(
                self.client, lambda metadata: self.batcher.limit_batch_size(metadata.max_batch_size)
            ),
            "dispatcher": self.batcher.run(),
        }
        if self.settings_file is not None:
            jobs["settings-file"] = self.settings_file.watch()
        return jobs

    def job_died(self, name: str) -> None:
        """A job that ends early leaves the sidecar unable to serve: not live, not ready."""
        self.dataplane.mark_broken(f"its {name} task ended; see the sidecar log")


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
        config, registry, metrics, client, state, batcher, dataplane, settings_file, reading,
        Converter(reading), AnswerSending(config.body_timeout_s),
    )  # fmt: skip
