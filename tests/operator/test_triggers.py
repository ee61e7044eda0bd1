"""Reconciles asked for by watch events: one at a time per model, coalesced, none kept after.

A model's pods and children send a burst of events while it rolls out; each reconcile reads
the latest from the cache, so the events that arrive while one runs need one more after it,
not one each. And the operator keeps nothing per model once its reconciles are done, however
many models come and go.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from carpool_operator.defaults import Defaults
from carpool_operator.kube import KubeClient
from carpool_operator.metrics import OperatorMetrics
from carpool_operator.reconcile import Runtime, reconcile
from carpool_operator.triggers import Triggers
from carpool_operator.types import Manifest


class Reconciles:
    """A reconcile that waits for `release`, and what it saw."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.running = 0
        self.overlapped = False
        self.release = asyncio.Event()

    async def __call__(self, namespace: str, name: str) -> None:
        self.started.append(name)
        self.running += 1
        self.overlapped |= self.running > 1
        try:
            await self.release.wait()
        finally:
            self.running -= 1


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_events_during_a_reconcile_ask_for_one_more_not_one_each() -> None:
    reconciles = Reconciles()
    triggers = Triggers(reconciles)
    triggers.ask("default", "m")
    await settle()
    for _ in range(50):  # a rollout's pod events, while the first reconcile runs
        triggers.ask("default", "m")
        await settle()
    reconciles.release.set()
    await settle()
    assert reconciles.started == ["m", "m"]
    assert not reconciles.overlapped
    triggers.ask("default", "m")  # after the last one ended: heard
    await settle()
    assert reconciles.started == ["m", "m", "m"]
    await triggers.close()


async def test_models_reconcile_side_by_side() -> None:
    reconciles = Reconciles()
    triggers = Triggers(reconciles)
    for name in ("a", "b"):
        triggers.ask("default", name)
    await settle()
    assert sorted(reconciles.started) == ["a", "b"]
    await triggers.close()


class Empty:
    """A cache that holds nothing: every model is gone."""

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        return None

    async def select(self, kind: str, namespace: str, selector: object) -> list[Manifest]:
        return []

    async def serves(self, kind: str) -> bool:
        return True

    def wrote(self, found: Manifest) -> None:
        pass

    def deleted(self, kind: str, namespace: str, name: str) -> None:
        pass


async def test_nothing_is_kept_for_models_that_came_and_went() -> None:
    kube = KubeClient()
    kube.store = Empty()
    runtime = Runtime(Defaults(), OperatorMetrics(CollectorRegistry()), kube)
    logger = logging.getLogger("test")
    await asyncio.gather(*(reconcile(runtime, "default", f"m{i}", logger) for i in range(100)))
    assert len(runtime.locks) == 0
