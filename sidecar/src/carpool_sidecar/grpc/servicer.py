"""`inference.GRPCInferenceService`: thin RPC methods over the sidecar's DataPlane.

ModelInfer shares the batcher with the REST routes, so gRPC and REST callers of one model
ride in the same batches. The call's gRPC deadline is the request's deadline, and a call
the client cancels cancels its queued items (grpc.aio cancels the method's task).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from importlib.metadata import version

from google.protobuf.message import DecodeError

from carpool.contract.oip_grpc.inference_pb2 import (
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelReadyRequest,
    ModelReadyResponse,
    ModelStreamInferResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from carpool.engine.bounds import RequestBounds
from carpool.engine.errors import BadRequest, DeadlineExceeded, QueueFull, SidecarError
from carpool_sidecar.build import Sidecar
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.grpc import codec, status, streaming
from carpool_sidecar.grpc.status import Context
from carpool_sidecar.inference import MODEL_VERSION, InferRequest

log = logging.getLogger(__name__)

PROTOCOL = "grpc"
# Metrics count answers by the HTTP status a REST caller would have got, so one dashboard
# panel reads both protocols: a call that left before its answer counts as REST's
# CLIENT_GONE (499), one whose deadline passed as DeadlineExceeded (504).
CLOCK_SLACK_S = 0.01


def _parsed(message: bytes, dataplane: DataPlane, bounds: RequestBounds) -> InferRequest:
    """The sidecar's request from a message, once it is decoded and names the served model."""
    try:
        request = ModelInferRequest.FromString(message)
    except DecodeError as error:
        raise BadRequest(f"the message is not a ModelInferRequest: {error}") from None
    dataplane.check_model(request.model_name, request.model_version or None)
    return codec.parse_request(request, bounds)


class InferenceServicer:
    """Every RPC of `inference.GRPCInferenceService` (`server.method_handlers` registers
    them by name)."""

    def __init__(self, sidecar: Sidecar) -> None:
        self._dataplane = sidecar.dataplane
        self._batcher = sidecar.batcher
        self._metrics = sidecar.metrics
        self._converter = sidecar.converter
        self._calls = 0  # ModelInfer calls in flight
        # gRPC refuses to send a larger message: such an answer is not even built.
        self._message_limit = sidecar.config.grpc_message_limit
        self._closing_streams = asyncio.Event()

    async def ServerLive(self, request: ServerLiveRequest, context: Context) -> ServerLiveResponse:
        return ServerLiveResponse(live=self._dataplane.live)

    async def ServerReady(
        self, request: ServerReadyRequest, context: Context
    ) -> ServerReadyResponse:
        return ServerReadyResponse(ready=self._dataplane.ready)

    async def ModelReady(self, request: ModelReadyRequest, context: Context) -> ModelReadyResponse:
        await self._check_model(request.name, request.version, context)
        return ModelReadyResponse(ready=self._dataplane.ready)

    async def ServerMetadata(
        self, request: ServerMetadataRequest, context: Context
    ) -> ServerMetadataResponse:
        return ServerMetadataResponse(name="carpool", version=version("carpool"))

    async def ModelMetadata(
        self, request: ModelMetadataRequest, context: Context
    ) -> ModelMetadataResponse:
        await self._check_model(request.name, request.version, context)
        try:
            metadata = self._dataplane.metadata()
        except SidecarError as error:
            await status.abort(context, error)
        tensor = ModelMetadataResponse.TensorMetadata
        return ModelMetadataResponse(
            name=self._dataplane.model_name,
            versions=[MODEL_VERSION],
            platform=metadata.platform,
            inputs=[tensor(**spec.as_v2()) for spec in metadata.inputs],
            outputs=[tensor(**spec.as_v2()) for spec in metadata.outputs],
        )

    async def ModelStreamInfer(
        self, requests: AsyncIterator[ModelInferRequest], context: Context
    ) -> AsyncIterator[ModelStreamInferResponse]:
        """Triton's streaming RPC (`grpc.streaming`); a message that is no request ends it
        with INVALID_ARGUMENT, `close_streams` with UNAVAILABLE."""
        limit, closing = self._message_limit, self._closing_streams
        try:
            async for response in streaming.answer(
                requests, self._dataplane, self._metrics, PROTOCOL, limit, closing
            ):
                yield response
        except SidecarError as error:
            await status.abort(context, error)

    def close_streams(self) -> None:
        """End every ModelStreamInfer stream once its requests are answered; they read no more."""
        self._closing_streams.set()

    async def ModelInfer(self, message: bytes, context: Context) -> ModelInferResponse:
        """Takes the message undecoded (see `server`): a call refused for load costs no
        decoding, and one that is not protobuf gets INVALID_ARGUMENT, not UNKNOWN and a
        traceback from grpc."""
        loop = asyncio.get_running_loop()
        arrived_at = loop.time()
        # Seconds left of the client's deadline; None when it set none.
        remaining = context.time_remaining()
        try:
            # Counted before the status goes out, so a caller who reads /metrics sees it.
            with self._metrics.answering(PROTOCOL) as answer:
                self._admit()
                self._calls += 1
                try:
                    response = await self._infer(message, context, arrived_at, remaining)
                except asyncio.CancelledError:
                    # grpc.aio cancels the method at the deadline by its own clock, which may
                    # run a hair ahead of the loop's: whichever ends the call, it counts as
                    # the sidecar's own timer counts it.
                    deadline = None if remaining is None else arrived_at + remaining
                    if deadline is not None and loop.time() >= deadline - CLOCK_SLACK_S:
                        answer.status = DeadlineExceeded.status
                        self._metrics.reject(DeadlineExceeded.rejected_reason)
                    raise
                finally:
                    self._calls -= 1
                answer.status = 200
        except SidecarError as error:
            await status.abort(context, error)
        except Exception:
            log.exception("unexpected error in ModelInfer")
            await status.abort(context, status.INTERNAL_ERROR)
        return response

    def _admit(self) -> None:
        """QueueFull, with Retry-After, once as many calls are in flight as the sidecar holds
        items at most, queued or at the model: each call holds one at least, so one more
        could not be served. A flood is refused here, before its messages are decoded."""
        settings = self._batcher.settings
        limit = settings.max_queue_items + settings.max_inflight_batches * settings.max_batch_size
        if self._calls >= limit:
            raise QueueFull(
                f"queue full: {self._calls} gRPC calls in flight, as many as the sidecar can "
                f"hold items (maxQueueItems + maxInflightBatches x maxBatchSize: {limit})",
                self._batcher.retry_after_s(),
            )

    async def _infer(
        self,
        message: bytes,
        context: Context,
        arrived_at: float,
        remaining: float | None,
    ) -> ModelInferResponse:
        dataplane = self._dataplane
        bounds = dataplane.bounds()
        infer_request = await self._converter.run(
            len(message), lambda: _parsed(message, dataplane, bounds)
        )
        deadline_ms = None if remaining is None else remaining * 1000
        response = await dataplane.infer(
            infer_request, deadline_ms, arrived_at, self._message_limit
        )
        if (held := response.held) is not None:
            # The call is done once grpc has sent the answer, or once it never will. (The
            # stubs type the callback as a class of their own, which no function is.)
            context.add_done_callback(lambda _: held.release())  # type: ignore[arg-type]
        return codec.encode_response(response)

    async def _check_model(self, name: str, model_version: str, context: Context) -> None:
        try:
            self._dataplane.check_model(name, model_version or None)
        except SidecarError as error:
            await status.abort(context, error)
