"""The process started as a sidecar with front processes: the engine, gRPC, and the fronts."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CollectorRegistry

from carpool import heap
from carpool_sidecar.build import build_sidecar
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.fronts.hub import Hub
from carpool_sidecar.fronts.pool import FrontPool, listeners
from carpool_sidecar.grpc import server as grpc_server
from carpool_sidecar.runner import SHUTDOWN_TIMEOUT_S, CannotListen, listening, signalled
from carpool_sidecar.supervision import supervised

log = logging.getLogger("carpool_sidecar")

# How long the fronts may take to close their ports once told.
CLOSE_TIMEOUT_S = 2.0


async def serve(config: SidecarConfig) -> int:
    """As `carpool_sidecar.main.serve`, with the REST port served by the front processes:
    on SIGTERM every front turns not ready at once, closes the port after the drain delay
    and answers what it took while the engine drains."""
    sidecar = build_sidecar(config, CollectorRegistry())
    hub = Hub(sidecar)
    address = f"{config.host}:{config.port}"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(sidecar.close)
        jobs = {**sidecar.jobs(), "fronts-state": hub.tell()}
        await stack.enter_async_context(supervised(jobs, sidecar.job_died))
        try:
            sockets = listeners(config.host, config.port, config.front_processes)
        except OSError as error:
            raise CannotListen(f"cannot listen on {address}: {error.strerror or error}") from error
        pool = FrontPool(config, hub, sockets, sidecar.job_died)
        stack.callback(pool.stop)
        await stack.enter_async_context(pool.running())
        log.info(
            "sidecar for %r: %d front processes listening on %s",
            config.model_name, config.front_processes, address,
        )  # fmt: skip
        grpc_address = f"{config.host}:{config.grpc_port} (gRPC)"
        await listening(
            stack.enter_async_context(grpc_server.serving(config, sidecar)), grpc_address
        )
        heap.ready_to_serve()
        await signalled()
        sidecar.dataplane.stop_soon()  # the fronts hear of it with the next state
        pool.stop()
        log.info(
            "not ready; serving %.1f s more before closing the port", config.drain_delay_seconds
        )
        await asyncio.sleep(config.drain_delay_seconds)
        sending = sidecar.sending
        sending.drained_by = asyncio.get_running_loop().time() + config.drain_seconds
        # The fronts' closing is part of the drain: a front slow to close takes from its grace.
        await hub.close_ports(config.drain_seconds, min(CLOSE_TIMEOUT_S, config.drain_seconds))
        await sidecar.drain(sending.drain_left_s())
        await pool.stopped(sending.drain_left_s() + SHUTDOWN_TIMEOUT_S)
    log.info("sidecar stopped")
    return 0
