"""The operator's own Prometheus metrics, and the small HTTP server that exposes them.

kopf exports none; these say whether reconciles succeed, how long they take, how much the
operator writes to the API server and how many BatchedModels are Ready.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

RESULTS = ("success", "error", "degraded")
# A reconcile is a handful of API round trips: milliseconds, seconds when the server is slow.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """Every operator metric, registered in the registry given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._reconciles = Counter(
            "carpool_operator_reconciles",
            "Reconciles of a BatchedModel, by result: success, error (retried), degraded "
            "(finished, but the model is Degraded).",
            ["result"],
            registry=registry,
        )
        self._duration = Histogram(
            "carpool_operator_reconcile_duration_seconds",
            "Time one reconcile took, from reading the BatchedModel to writing its status.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._writes = Counter(
            "carpool_operator_writes",
            "Create, patch and delete requests the API server accepted from the reconciler, "
            "by kind (BatchedModel: its status).",
            ["kind"],
            registry=registry,
        )
        self._models = Gauge(
            "carpool_operator_models",
            "BatchedModels the operator has seen and not seen deleted, by their Ready status.",
            ["ready"],
            registry=registry,
        )
        self._resyncs = Counter(
            "carpool_operator_resyncs",
            "Passes of the periodic resync over every BatchedModel, finished.",
            registry=registry,
        )
        self._ready: dict[tuple[str, str], bool] = {}
        for result in RESULTS:
            self._reconciles.labels(result)  # every result appears, at 0, from the start
        self._count_models()

    def reconciled(self, result: str, seconds: float) -> None:
        self._reconciles.labels(result).inc()
        self._duration.observe(seconds)

    def wrote(self, kind: str) -> None:
        self._writes.labels(kind).inc()

    def resynced(self) -> None:
        self._resyncs.inc()

    def saw(self, namespace: str, name: str, ready: bool) -> None:
        self._ready[namespace, name] = ready
        self._count_models()

    def forget(self, namespace: str, name: str) -> None:
        if self._ready.pop((namespace, name), None) is not None:
            self._count_models()

    def _count_models(self) -> None:
        ready = sum(self._ready.values())
        self._models.labels("true").set(ready)
        self._models.labels("false").set(len(self._ready) - ready)


@contextlib.asynccontextmanager
async def serving(registry: CollectorRegistry, host: str, port: int) -> AsyncIterator[None]:
    """Serve GET /metrics on host:port for as long as the context is open."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        yield
    finally:
        await runner.cleanup()
