"""`grpc.health.v1.Health` kept in step with the sidecar's own liveness and readiness.

Kubernetes gRPC probes ask by service name: "" (the server) and
`inference.GRPCInferenceService` answer SERVING while the sidecar is ready, as REST's
/v2/health/ready does; `liveness` answers SERVING while it is live (/v2/health/live).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from grpc_health.v1 import health, health_pb2

from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.grpc.status import Context
from carpool_sidecar.grpc.unseen import Arrivals
from carpool_sidecar.health import POLL_INTERVAL_S

READINESS_SERVICES = ("", "inference.GRPCInferenceService")
LIVENESS_SERVICE = "liveness"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _CurrentHealth(health.aio.HealthServicer):
    """Check publishes first, so it never lags what ServerReady says; each call counts in
    `arrivals`."""

    def __init__(self, publish: Callable[[], Awaitable[None]], arrivals: Arrivals) -> None:
        super().__init__()
        self._publish = publish
        self._arrivals = arrivals

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> health_pb2.HealthCheckResponse:
        self._arrivals.count += 1
        await self._publish()
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Context) -> None:
        self._arrivals.count += 1
        await super().Watch(request, context)


class HealthFollower:
    """The health servicer and the task that copies the data plane's state into it
    (for Watch; Check reads the state itself)."""

    def __init__(self, dataplane: DataPlane, arrivals: Arrivals) -> None:
        self.servicer = _CurrentHealth(self._publish, arrivals)
        self._dataplane = dataplane
        self._published: tuple[bool, bool] | None = None  # (ready, live)

    async def follow(self) -> None:
        """Runs until cancelled, or until `shut_down`; watchers hear of every change."""
        while True:
            await self._publish()
            await asyncio.sleep(POLL_INTERVAL_S)

    async def shut_down(self) -> None:
        """NOT_SERVING for every service from now on, whatever the data plane says."""
        await self.servicer.enter_graceful_shutdown()

    async def _publish(self) -> None:
        state = (self._dataplane.ready, self._dataplane.live)
        if state == self._published:
            return
        self._published = state
        ready, live = state
        for service in READINESS_SERVICES:
            await self.servicer.set(service, SERVING if ready else NOT_SERVING)
        await self.servicer.set(LIVENESS_SERVICE, SERVING if live else NOT_SERVING)
