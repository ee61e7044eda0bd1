"""The sidecar's HTTP front: routes and middleware over the DataPlane.

Handlers are thin: parse with a codec (`oip`, `oip_generate`, `kserve_v1`), call the data
plane, encode.
The middleware is the one place errors become HTTP. The object graph comes from `build`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import cast

import orjson
from aiohttp import HttpVersion11, hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from carpool.contract.metadata import TensorSpec
from carpool.contract.pod import METRICS_PATH, SIDECAR_LIVE_PATH, SIDECAR_READY_PATH
from carpool.engine.errors import CLIENT_GONE, INTERNAL_MESSAGE, BodyTimeout, SidecarError
from carpool.engine.metrics import Answer
from carpool_sidecar import bodies, headers, kserve_v1, oip, oip_generate, openapi, reading
from carpool_sidecar import operations as op
from carpool_sidecar.answers import Held
from carpool_sidecar.build import Front, build_sidecar
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.generation import GenerateRequest
from carpool_sidecar.inference import MODEL_VERSION
from carpool_sidecar.operations import Operation
from carpool_sidecar.supervision import supervised

log = logging.getLogger(__name__)

SIDECAR = web.AppKey("sidecar", Front)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(
    document: object, status: int = 200, extra: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(document), status=status, headers=extra, content_type="application/json"
    )


def error_response(status: int, message: str, extra: dict[str, str] | None = None) -> web.Response:
    return json_response(bodies.Error(error=message), status, extra)


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    counted = request.match_info.route.name in INFERENCE_ROUTES
    return await answered(request, handler(request), request.app[SIDECAR], counted)


async def answered(
    request: web.BaseRequest,
    handling: Awaitable[web.StreamResponse],
    sidecar: Front,
    counted: bool,
) -> web.StreamResponse:
    """`handling`'s response, or its error as HTTP: the one place errors become answers. A
    `counted` request counts in carpool_requests_total and its duration histogram."""
    counting = sidecar.metrics.answering("rest") if counted else contextlib.nullcontext(Answer())
    try:
        with counting as answer:
            try:
                response = await handling
            except web.HTTPException as error:
                answer.status = error.status
                raise
            except ConnectionError:
                # The caller hung up as its answer went out: counted as gone (the answer's
                # status is left unset); aiohttp finds the connection closed and drops it.
                return web.Response(status=CLIENT_GONE)
            answer.status = response.status
    except SidecarError as error:
        response = error_response(error.status, error.message, error.headers)
        if error.close_connection:
            response.force_close()
    except web.HTTPException as error:
        # aiohttp's own refusals (unknown route, wrong method) speak JSON too, keeping their
        # other headers (a 405's Allow).
        kept = {name: value for name, value in error.headers.items() if name != "Content-Type"}
        response = error_response(error.status, error.reason, kept)
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        response = error_response(500, INTERNAL_MESSAGE)
    if sidecar.dataplane.stopping and not response.prepared:
        # Served from before the SIGTERM, answered after it: closes too (Connection: close).
        response.force_close()
    return response


def read_body(request: web.BaseRequest, sidecar: Front, deadline: float) -> Awaitable[bytearray]:
    # Not a coroutine itself: one frame less between the route and the read.
    return reading.read_body(
        request.content,
        request.content_length,
        max_bytes=sidecar.config.max_body_bytes,
        budget=sidecar.reading,
        idle_s=sidecar.config.body_timeout_s,
        deadline=deadline,
    )


def check_model(request: web.Request, sidecar: Front) -> DataPlane:
    """The data plane, once the path names its model (and version, if any)."""
    dataplane = sidecar.dataplane
    dataplane.check_model(request.match_info["name"], request.match_info.get("version"))
    return dataplane


async def send_answer(
    request: web.BaseRequest,
    sidecar: Front,
    held: Held | None,
    encode: Callable[[], tuple[Sequence[bytes | memoryview], dict[str, str]]],
) -> web.StreamResponse:
    """Encode and send an answer; its room in the answer budget is given back once sent, or
    once it never will be."""
    try:
        parts, extra = encode()
        return await sidecar.sending.send(request, parts, extra, close=sidecar.dataplane.stopping)
    finally:
        if held is not None:
            held.release()


async def v2_infer(request: web.Request) -> web.StreamResponse:
    path = request.match_info
    return await infer(request, request.app[SIDECAR], path["name"], path.get("version"))


async def infer(
    request: web.BaseRequest, sidecar: Front, name: str, version: str | None
) -> web.StreamResponse:
    """The v2 infer route, for model `name` (and `version`, if the path gives one)."""
    # The deadline counts from here, not from when the body has been read and parsed.
    arrived_at = asyncio.get_running_loop().time()
    dataplane = sidecar.dataplane
    dataplane.check_model(name, version)
    timeout_ms = headers.timeout_ms(request.headers)
    header_length = headers.json_header_length(request.headers)
    body = await read_body(request, sidecar, dataplane.deadline(arrived_at, timeout_ms))
    infer_request = await sidecar.converter.run(
        len(body), lambda: oip.parse_request(body, header_length, dataplane.bounds())
    )
    answer_limit = sidecar.config.max_answer_bytes
    response = await dataplane.infer(infer_request, timeout_ms, arrived_at, answer_limit)
    return await send_answer(request, sidecar, response.held, lambda: oip.encode_response(response))


async def v1_predict(request: web.Request) -> web.StreamResponse:
    arrived_at = asyncio.get_running_loop().time()
    sidecar = request.app[SIDECAR]
    dataplane = check_model(request, sidecar)
    timeout_ms = headers.timeout_ms(request.headers)
    body = await read_body(request, sidecar, dataplane.deadline(arrived_at, timeout_ms))
    metadata, bounds = dataplane.metadata(), dataplane.bounds()
    infer_request = await sidecar.converter.run(
        len(body), lambda: kserve_v1.parse_request(body, metadata, bounds)
    )
    answer_limit = sidecar.config.max_answer_bytes
    response = await dataplane.infer(infer_request, timeout_ms, arrived_at, answer_limit)
    encoded = kserve_v1.encode_response
    return await send_answer(
        request, sidecar, response.held, lambda: _json_parts(encoded(response))
    )


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """A generate request read and parsed, with what the data plane needs to answer it."""

    sidecar: Front
    dataplane: DataPlane
    request: GenerateRequest
    timeout_ms: float | None
    arrived_at: float
    answer_limit: int


async def read_generate(request: web.Request) -> GenerateCall:
    arrived_at = asyncio.get_running_loop().time()
    sidecar = request.app[SIDECAR]
    dataplane = check_model(request, sidecar)
    timeout_ms = headers.timeout_ms(request.headers)
    body = await read_body(request, sidecar, dataplane.deadline(arrived_at, timeout_ms))
    generate_request = oip_generate.parse_request(body, dataplane.metadata())
    answer_limit = sidecar.config.max_answer_bytes
    return GenerateCall(sidecar, dataplane, generate_request, timeout_ms, arrived_at, answer_limit)


async def v2_generate(request: web.Request) -> web.StreamResponse:
    call = await read_generate(request)
    response = await call.dataplane.generate(
        call.request, call.timeout_ms, call.arrived_at, call.answer_limit
    )
    encoded, extra = oip_generate.encode_response, oip_generate.answer_headers(call.request)
    return await send_answer(
        request,
        call.sidecar,
        response.held,
        lambda: _json_parts(encoded(response, call.request.id), extra),
    )


async def v2_generate_stream(request: web.Request) -> web.StreamResponse:
    call = await read_generate(request)
    dataplane, generate_request = call.dataplane, call.request
    pieces = dataplane.generate_stream(
        generate_request, call.timeout_ms, call.arrived_at, call.answer_limit
    )
    try:
        # Until the first piece an error is answered with its status, as for generate.
        piece = await anext(pieces)
        extra = oip_generate.answer_headers(generate_request)
        response = web.StreamResponse(headers={**SSE_HEADERS, **extra})
        if request.version < HttpVersion11:
            # No chunks before HTTP/1.1: the answer ends as its connection closes, whatever
            # keep-alive the client asked for (aiohttp would keep it).
            response.force_close()
        await response.prepare(request)
        sent = 0
        try:
            while True:
                event = oip_generate.encode_event(dataplane.model_name, generate_request.id, piece)
                await call.sidecar.sending.write(request, response, event, sent)
                sent += len(event)
                if piece.final is not None:
                    break
                piece = await anext(pieces)
        except BodyTimeout:
            raise  # the connection is cut: no event can follow
        except SidecarError as error:
            await response.write(oip_generate.encode_error_event(error.message))
    finally:
        # A caller who left ends its sequence on the model server here.
        await pieces.aclose()
    await response.write_eof()
    return response


SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _json_parts(
    body: bytes, extra: dict[str, str] | None = None
) -> tuple[list[bytes], dict[str, str]]:
    return [body], {"Content-Type": "application/json", **(extra or {})}


async def live(request: web.Request) -> web.Response:
    # Not live once a background task has died: the kubelet restarts the container.
    is_live = request.app[SIDECAR].dataplane.live
    return json_response(bodies.Live(live=is_live), status=200 if is_live else 503)


async def v1_live(request: web.Request) -> web.Response:
    # KServe v1 clients check liveness at the root; this answers while the process does.
    return json_response(bodies.V1Live(status="alive"))


async def ready(request: web.Request) -> web.Response:
    is_ready = request.app[SIDECAR].dataplane.ready
    return json_response(bodies.Ready(ready=is_ready), status=200 if is_ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return json_response(
        bodies.ServerMetadata(
            name="carpool", version=version("carpool"), extensions=["binary_tensor_data"]
        )
    )


async def model_metadata(request: web.Request) -> web.Response:
    dataplane = check_model(request, request.app[SIDECAR])
    metadata = dataplane.metadata()
    return json_response(
        bodies.ModelMetadata(
            name=dataplane.model_name,
            versions=[MODEL_VERSION],
            platform=metadata.platform,
            inputs=[_tensor(spec) for spec in metadata.inputs],
            outputs=[_tensor(spec) for spec in metadata.outputs],
        )
    )


def _tensor(spec: TensorSpec) -> bodies.TensorMetadata:
    return cast(bodies.TensorMetadata, spec.as_v2())


async def model_ready(request: web.Request) -> web.Response:
    dataplane = check_model(request, request.app[SIDECAR])
    is_ready = dataplane.ready
    body = bodies.ModelReady(name=dataplane.model_name, ready=is_ready)
    return json_response(body, status=200 if is_ready else 503)


async def batching(request: web.Request) -> web.Response:
    dataplane = check_model(request, request.app[SIDECAR])
    return json_response(bodies.Batching(batching=dataplane.batcher.settings.as_file()))


@functools.cache
def _openapi_body() -> bytes:
    # Rendering takes tens of milliseconds (pydantic); the routes never change.
    table = [(method, path, operation) for method, path, _, operation, _ in ROUTES]
    return orjson.dumps(openapi.document(table, version("carpool")))


async def openapi_document(request: web.Request) -> web.Response:
    return web.Response(body=_openapi_body(), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    body = await request.app[SIDECAR].scrape()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# (method, path, handler, what it takes and answers, route name)
ROUTES: list[tuple[str, str, Handler, Operation, str | None]] = [
    ("GET", "/", v1_live, op.V1_LIVE, None),
    ("GET", SIDECAR_LIVE_PATH, live, op.LIVE, None),
    ("GET", SIDECAR_READY_PATH, ready, op.READY, None),
    ("GET", "/v2", server_metadata, op.SERVER_METADATA, None),
    ("GET", "/v2/models/{name}", model_metadata, op.MODEL_METADATA, None),
    ("GET", "/v2/models/{name}/versions/{version}", model_metadata, op.MODEL_METADATA, None),
    ("GET", "/v2/models/{name}/ready", model_ready, op.MODEL_READY, None),
    ("GET", "/v2/models/{name}/versions/{version}/ready", model_ready, op.MODEL_READY, None),
    ("GET", "/v2/models/{name}/batching", batching, op.BATCHING, None),
    ("POST", "/v2/models/{name}/infer", v2_infer, op.INFER, "v2-infer"),
    ("POST", "/v2/models/{name}/versions/{version}/infer", v2_infer, op.INFER, "v2-infer-version"),
    ("POST", "/v2/models/{name}/generate", v2_generate, op.GENERATE, "v2-generate"),
    ("POST", "/v2/models/{name}/versions/{version}/generate", v2_generate, op.GENERATE,
     "v2-generate-version"),
    ("POST", "/v2/models/{name}/generate_stream", v2_generate_stream, op.GENERATE_STREAM,
     "v2-generate-stream"),
    ("POST", "/v2/models/{name}/versions/{version}/generate_stream", v2_generate_stream,
     op.GENERATE_STREAM, "v2-generate-stream-version"),
    ("GET", "/v1/models/{name:[^/:]+}", model_ready, op.MODEL_READY, None),
    ("POST", "/v1/models/{name:[^/:]+}:predict", v1_predict, op.PREDICT, "v1-predict"),
    ("GET", METRICS_PATH, metrics, op.METRICS, None),
    ("GET", "/openapi.json", openapi_document, op.OPENAPI, None),
]  # fmt: skip
# Routes whose requests count in carpool_requests_total and its duration histogram.
INFERENCE_ROUTES = frozenset(name for *_, name in ROUTES if name is not None)


async def background(app: web.Application) -> AsyncIterator[None]:
    """The sidecar's background tasks run while the app does; the client closes after them."""
    sidecar = app[SIDECAR]
    async with supervised(sidecar.jobs(), sidecar.job_died):
        yield
    await sidecar.close()


async def close_when_stopping(request: web.Request, response: web.StreamResponse) -> None:
    """From SIGTERM on, every answer says Connection: close, so keep-alive clients reconnect
    (elsewhere) rather than reuse a connection that is about to close."""
    if request.app[SIDECAR].dataplane.stopping:
        response.force_close()
        # The hook runs after aiohttp wrote the Connection header from keep_alive.
        response.headers[hdrs.CONNECTION] = "close"


async def create_app(config: SidecarConfig, registry: CollectorRegistry) -> web.Application:
    """The sidecar app; its background tasks start and stop with it."""
    return front_app(build_sidecar(config, registry))


def front_app(front: Front) -> web.Application:
    """The app that serves `front`'s routes and runs its background tasks."""
    # Bodies are read by `reading.read_body`, which enforces max_body_bytes itself.
    max_body_bytes = front.config.max_body_bytes
    app = web.Application(middlewares=[errors_and_metrics], client_max_size=max_body_bytes)
    app[SIDECAR] = front
    app.cleanup_ctx.append(background)
    app.on_response_prepare.append(close_when_stopping)
    # Inference routes first: aiohttp tries the routes under a path's prefix in the order
    # they were added, and no two routes match one path.
    for method, path, handler, _, name in sorted(ROUTES, key=lambda route: route[4] is None):
        app.router.add_route(method, path, handler, name=name)
    return app
