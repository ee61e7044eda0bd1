"""The sidecar's HTTP routes: thin wrappers over DataPlane; the one place errors become HTTP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from pathlib import Path

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from carpool.sidecar import kserve_v1, oip, openapi
from carpool.sidecar.client import ModelClient
from carpool.sidecar.config import SidecarConfig
from carpool.sidecar.dataplane import DataPlane, forwarder
from carpool.sidecar.engine import Batcher
from carpool.sidecar.errors import BadRequest, PayloadTooLarge, SidecarError
from carpool.sidecar.health import ModelState
from carpool.sidecar.metrics import SidecarMetrics
from carpool.sidecar.reload import SettingsFile

log = logging.getLogger(__name__)

DATAPLANE = web.AppKey("dataplane", DataPlane)
METRICS = web.AppKey("metrics", SidecarMetrics)
REGISTRY = web.AppKey("registry", CollectorRegistry)
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
TIMEOUT_HEADER = "X-Carpool-Timeout-Ms"
# Routes whose requests count in carpool_requests_total and its duration histogram.
INFERENCE_ROUTES = frozenset(["v2-infer", "v2-infer-version", "v1-predict"])
# Not an HTTP status: the client went away before its answer (nginx's convention).
CLIENT_GONE = 499

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(
    document: object, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(document), status=status, headers=headers, content_type="application/json"
    )


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return json_response({"error": message}, status, headers)


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    counted = request.match_info.route.name in INFERENCE_ROUTES
    started = asyncio.get_running_loop().time()
    response: web.StreamResponse | None = None
    try:
        try:
            response = await handler(request)
        except SidecarError as error:
            if error.rejected_reason is not None:
                metrics.reject(error.rejected_reason)
            response = error_response(error.status, error.message, error.headers)
        except web.HTTPException as error:
            # aiohttp's own refusals (unknown route, wrong method) speak JSON too.
            response = error_response(error.status, error.reason)
        except Exception:
            log.exception("unexpected error in %s %s", request.method, request.path)
            response = error_response(500, "internal error; see the sidecar log")
        return response
    finally:
        if counted:
            # No response: the handler was cancelled because the client left.
            status = CLIENT_GONE if response is None else response.status
            metrics.answered(status, asyncio.get_running_loop().time() - started, "rest")


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as error:
        raise PayloadTooLarge(
            f"body larger than the limit of {request.app[MAX_BODY_BYTES]} bytes"
        ) from error


def header_timeout_ms(request: web.Request) -> float | None:
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise BadRequest(f"{TIMEOUT_HEADER} must be milliseconds > 0, got {raw!r}")
    return value


def header_length(request: web.Request) -> int | None:
    raw = request.headers.get(oip.HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise BadRequest(f"{oip.HEADER_LENGTH} must be a byte count, got {raw!r}")
    return int(raw)


def check_model(request: web.Request) -> DataPlane:
    """The data plane, once the path names its model (and version, if any)."""
    dataplane = request.app[DATAPLANE]
    dataplane.check_model(request.match_info["name"], request.match_info.get("version"))
    return dataplane


async def write_parts(
    request: web.Request, parts: list[bytes | memoryview], headers: dict[str, str]
) -> web.StreamResponse:
    """Send a body given in parts (a JSON header, then binary outputs) without joining them."""
    if len(parts) == 1:
        return web.Response(body=parts[0], headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_length = sum(len(part) for part in parts)
    await response.prepare(request)
    for part in parts:
        await response.write(part)
    await response.write_eof()
    return response


async def v2_infer(request: web.Request) -> web.StreamResponse:
    # The deadline counts from here, not from when the body has been read and parsed.
    arrived_at = asyncio.get_running_loop().time()
    dataplane = check_model(request)
    body = await read_body(request)
    infer_request = oip.parse_request(body, header_length(request))
    response = await dataplane.infer(infer_request, header_timeout_ms(request), arrived_at)
    parts, headers = oip.encode_response(response)
    return await write_parts(request, parts, headers)


async def v1_predict(request: web.Request) -> web.Response:
    arrived_at = asyncio.get_running_loop().time()
    dataplane = check_model(request)
    body = await read_body(request)
    infer_request = kserve_v1.parse_request(body, dataplane.metadata())
    response = await dataplane.infer(infer_request, header_timeout_ms(request), arrived_at)
    return web.Response(body=kserve_v1.encode_response(response), content_type="application/json")


async def live(request: web.Request) -> web.Response:
    # Not live once a background task has died: the kubelet restarts the container.
    is_live = request.app[DATAPLANE].live
    return json_response({"live": is_live}, status=200 if is_live else 503)


async def ready(request: web.Request) -> web.Response:
    is_ready = request.app[DATAPLANE].ready
    return json_response({"ready": is_ready}, status=200 if is_ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return json_response(
        {"name": "carpool", "version": version("carpool"), "extensions": ["binary_tensor_data"]}
    )


async def model_metadata(request: web.Request) -> web.Response:
    dataplane = check_model(request)
    metadata = dataplane.metadata()
    return json_response(
        {
            "name": dataplane.model_name,
            "versions": [oip.MODEL_VERSION],
            "platform": metadata.platform,
            "inputs": [spec.as_v2() for spec in metadata.inputs],
            "outputs": [spec.as_v2() for spec in metadata.outputs],
        }
    )


async def model_ready(request: web.Request) -> web.Response:
    dataplane = check_model(request)
    is_ready = dataplane.ready
    body = {"name": dataplane.model_name, "ready": is_ready}
    return json_response(body, status=200 if is_ready else 503)


async def openapi_document(request: web.Request) -> web.Response:
    return json_response(openapi.document(version("carpool")))


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _background(
    config: SidecarConfig, client: ModelClient, state: ModelState, dataplane: DataPlane
) -> Callable[[web.Application], AsyncIterator[None]]:
    batcher = dataplane.batcher

    def watch(task: asyncio.Task[None]) -> None:
        """Each task runs until shutdown; one that ends early leaves the sidecar unable to
        serve, so it says why and stops being live and ready."""
        if task.cancelled():
            return
        error = task.exception()
        log.error("background task %s ended early", task.get_name(), exc_info=error)
        dataplane.mark_broken(f"its {task.get_name()} task ended; see the sidecar log")

    async def context(app: web.Application) -> AsyncIterator[None]:
        jobs = {
            "model-state": state.poll(
                client, lambda metadata: batcher.limit_batch_size(metadata.max_batch_size)
            ),
            "dispatcher": batcher.run(),
        }
        if config.config_file is not None:
            settings_file = SettingsFile(Path(config.config_file), config.batching, batcher)
            settings_file.load(settings_file.read())
            jobs["settings-file"] = settings_file.watch()
        tasks = [asyncio.create_task(job, name=name) for name, job in jobs.items()]
        for task in tasks:
            task.add_done_callback(watch)
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()

    return context


async def create_app(config: SidecarConfig, registry: CollectorRegistry) -> web.Application:
    """The sidecar app; its background tasks start and stop with it."""
    metrics_ = SidecarMetrics(registry, config.model_name)
    client = ModelClient(config.model_server)
    state = ModelState()
    batcher = Batcher(config.batching, forwarder(client, state), metrics_)
    app = web.Application(middlewares=[errors_and_metrics], client_max_size=config.max_body_bytes)
    dataplane = app[DATAPLANE] = DataPlane(config.model_name, batcher, state)
    app[METRICS] = metrics_
    app[REGISTRY] = registry
    app[MAX_BODY_BYTES] = config.max_body_bytes
    app.cleanup_ctx.append(_background(config, client, state, dataplane))
    routes = app.router
    routes.add_get("/v2/health/live", live)
    routes.add_get("/v2/health/ready", ready)
    routes.add_get("/v2", server_metadata)
    routes.add_get("/v2/models/{name}", model_metadata)
    routes.add_get("/v2/models/{name}/versions/{version}", model_metadata)
    routes.add_get("/v2/models/{name}/ready", model_ready)
    routes.add_get("/v2/models/{name}/versions/{version}/ready", model_ready)
    routes.add_post("/v2/models/{name}/infer", v2_infer, name="v2-infer")
    routes.add_post("/v2/models/{name}/versions/{version}/infer", v2_infer, name="v2-infer-version")
    routes.add_get("/v1/models/{name:[^/:]+}", model_ready)
    routes.add_post("/v1/models/{name:[^/:]+}:predict", v1_predict, name="v1-predict")
    routes.add_get("/metrics", metrics)
    routes.add_get("/openapi.json", openapi_document)
    return app
