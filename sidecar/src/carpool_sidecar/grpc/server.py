"""The gRPC server's lifecycle: it serves while the block runs and stops after the drain.

    async with serving(config, sidecar):
        ...   # wait for SIGTERM, then drain the batcher: queued gRPC calls get answers
    # here the server has stopped, every call answered or ended

On the way out every health service turns NOT_SERVING, then grpc.aio finishes the calls in
flight within the grace and refuses new ones. Every call is counted once: ModelInfer by its
handler, and a call of any method that gRPC ends before a handler sees it by `unseen`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc

from carpool.contract.oip_grpc import inference_pb2
from carpool.engine.errors import DeadlineExceeded
from carpool_sidecar.build import Sidecar
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.grpc.health import HealthFollower
from carpool_sidecar.grpc.servicer import PROTOCOL, InferenceServicer
from carpool_sidecar.grpc.status import Context
from carpool_sidecar.grpc.unseen import Arrivals, UnseenCalls

log = logging.getLogger(__name__)

# Past the drain every accepted call has its answer; this only bounds sending them.
STOP_GRACE_S = 5.0
SERVICE_DESCRIPTOR = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
SERVICE = SERVICE_DESCRIPTOR.full_name
RAW_METHODS = frozenset({"ModelInfer"})


def options(config: SidecarConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.grpc_message_limit),
        ("grpc.max_send_message_length", config.grpc_message_limit),
        # Without this a second sidecar on the same port would share its traffic silently.
        ("grpc.so_reuseport", 0),
        # A peer that leaves a ping unanswered for the body timeout is gone, or has stopped
        # reading its socket with an answer unsent: its connection is closed (gRPC also sets
        # TCP_USER_TIMEOUT from these). The last two keep pings going while no data can,
        # as when an answer is stuck.
        ("grpc.keepalive_time_ms", int(1000 * config.body_timeout_s)),
        ("grpc.keepalive_timeout_ms", int(1000 * config.body_timeout_s)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", int(1000 * config.body_timeout_s)),
    ]


def _arriving(
    behaviour: Callable[[Any, Context], Awaitable[Any]], arrivals: Arrivals
) -> Callable[[Any, Context], Awaitable[Any]]:
    async def arrived(request: Any, context: Context) -> Any:
        arrivals.count += 1
        return await behaviour(request, context)

    return arrived


def _arriving_stream(
    behaviour: Callable[[Any, Context], AsyncIterator[Any]], arrivals: Arrivals
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    # An async generator function: grpc.aio tells streaming handlers apart by that.
    async def arrived(requests: Any, context: Context) -> AsyncIterator[Any]:
        arrivals.count += 1
        async for response in behaviour(requests, context):
            yield response

    return arrived


class _UnknownMethods(grpc.GenericRpcHandler):
    """Asked last, for a method no handler serves: counts it, and grpc answers UNIMPLEMENTED."""

    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals = arrivals

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        self._arrivals.count += 1


def method_handlers(
    servicer: InferenceServicer, arrivals: Arrivals
) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Every RPC of the service, as the generated code registers them, each counted in
    `arrivals`, but ModelInfer takes its message undecoded: the servicer decodes it after
    admitting the call."""
    handlers = {}
    for method in SERVICE_DESCRIPTOR.methods:
        request_type = getattr(inference_pb2, method.input_type.name)
        response_type = getattr(inference_pb2, method.output_type.name)
        if method.client_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                _arriving_stream(getattr(servicer, method.name), arrivals),
                request_deserializer=request_type.FromString,
                response_serializer=response_type.SerializeToString,
            )
            continue
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _arriving(getattr(servicer, method.name), arrivals),
            request_deserializer=None if method.name in RAW_METHODS else request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    return handlers


def _grace(sidecar: Sidecar) -> float:
    """Time left to send the last answers: what remains of the drain, once one ran."""
    if sidecar.sending.drained_by is None:
        return STOP_GRACE_S
    return sidecar.sending.drain_left_s()


def _report_early_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        log.error("gRPC health task ended early", exc_info=task.exception())


@asynccontextmanager
async def serving(config: SidecarConfig, sidecar: Sidecar) -> AsyncIterator[None]:
    """Serve `inference.GRPCInferenceService` and `grpc.health.v1.Health` on
    `config.grpc_port` while the block runs; port 0 serves nothing."""
    if not config.grpc_port:
        yield
        return
    server = grpc.aio.server(options=options(config))
    arrivals = Arrivals()
    servicer = InferenceServicer(sidecar)
    handlers = method_handlers(servicer, arrivals)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    health = HealthFollower(sidecar.dataplane, arrivals)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    server.add_generic_rpc_handlers((_UnknownMethods(arrivals),))
    address = f"{config.host}:{config.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as error:  # grpcio's way of saying the port is taken
        raise OSError(errno.EADDRINUSE, "address in use or not allowed") from error
    await server.start()
    # Calls gRPC ends unseen have mostly waited in its queue past their deadline.
    unseen = UnseenCalls(
        config.grpc_port,
        arrivals,
        sidecar.metrics.requests.labels(config.model_name, PROTOCOL, str(DeadlineExceeded.status)),
    )
    sidecar.before_scrape.append(unseen.update)
    follower = asyncio.create_task(health.follow(), name="grpc-health")
    follower.add_done_callback(_report_early_end)
    log.info("gRPC for %r listening on %s", config.model_name, address)
    try:
        yield
    finally:
        await health.shut_down()
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        sidecar.before_scrape.remove(unseen.update)
        unseen.update()
        # Streams kept open between requests would otherwise hold the exit for the grace.
        servicer.close_streams()
        await server.stop(_grace(sidecar))
        log.info("gRPC stopped")
