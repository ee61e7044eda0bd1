"""HTTP routes of the model server: thin wrappers around ModelService.

`data_app` serves everything, `/batch` included, on the UDS (or the TCP data port);
`probe_app` serves only health, metadata and metrics, for the kubelet and Prometheus.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from carpool.contract import wire
from carpool.contract.pod import METRICS_PATH, MODEL_SERVER_LIVE_PATH, MODEL_SERVER_READY_PATH
from carpool_model_server.errors import ServerError
from carpool_model_server.service import ModelService

log = logging.getLogger(__name__)
SERVICE = web.AppKey("service", ModelService)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_to_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place that turns domain errors into HTTP responses."""
    try:
        return await handler(request)
    except ServerError as error:
        return web.json_response({"error": str(error)}, status=error.status)
    except web.HTTPException:
        raise  # aiohttp's own answers: 404, 405, 413
    except Exception as error:
        log.exception("unexpected error on %s", request.path)
        return web.json_response({"error": f"internal error: {error!r}"}, status=500)


async def batch(request: web.Request) -> web.Response:
    answer = await request.app[SERVICE].infer_body(await request.read())
    return web.Response(body=answer, content_type=wire.CONTENT_TYPE)


async def healthz(request: web.Request) -> web.Response:
    # A failed device stays failed: only a restart of the process, by the kubelet, helps.
    failure = request.app[SERVICE].runner.failure
    if failure is not None:
        return web.json_response({"status": "failed", "error": failure}, status=500)
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if service.runner.failure is not None:
        return web.json_response({"status": "failed", "error": service.runner.failure}, status=503)
    if not service.ready:
        return web.json_response({"status": "loading"}, status=503)
    return web.json_response({"status": "ready"})


async def metadata(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].metadata())


async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if service.runner.failure is None:  # a failed device is not queried again
        service.runner.metrics.observe_gpu(service.runner.device)
    body = generate_latest(service.runner.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def probe_app(service: ModelService, client_max_size: int = 1024**2) -> web.Application:
    app = web.Application(middlewares=[errors_to_json], client_max_size=client_max_size)
    app[SERVICE] = service
    app.router.add_get(MODEL_SERVER_LIVE_PATH, healthz)
    app.router.add_get(MODEL_SERVER_READY_PATH, readyz)
    app.router.add_get("/metadata", metadata)
    app.router.add_get(METRICS_PATH, metrics)
    return app


def data_app(service: ModelService) -> web.Application:
    app = probe_app(service, client_max_size=wire.MAX_BODY_BYTES)
    app.router.add_post("/batch", batch)
    return app
