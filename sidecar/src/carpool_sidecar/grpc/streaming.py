"""`ModelStreamInfer`, Triton's streaming RPC: each request of a stream answered by one or
more responses, the last with the parameter `triton_final_response` true.

The requests of one stream are answered beside one another as they come, as Triton answers
a decoupled model's: a short request is not held behind a long one sent before it. A
request's responses come in order and carry its id; those of different requests interleave.
At most REQUESTS_IN_FLIGHT requests of a stream are answered at once, and a request counts
until the client has read its last response: past that the stream's next request is not
read, and is slowed by gRPC's flow control. Each response holds its room in the answer
budget until gRPC has taken it, and its request makes no more until then: a client that
does not read its answers holds no more than the budget, as on every other path.

A generation request (one prompt) to a model server that streams tokens is answered piece by
piece as the tokens come; any other request in one response, as ModelInfer answers it. A
request that fails is answered with its `error_message`, and the stream goes on with the
next one, as Triton does. Each request counts in the metrics as a ModelInfer call does.

Clients keep a stream open between requests. Once the sidecar closes its streams (after the
drain), a stream ends with UNAVAILABLE as soon as it has no request unanswered, so that an
idle stream does not hold the sidecar's exit for what is left of the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Final

from google.protobuf.message import DecodeError

from carpool.contract.oip_grpc.inference_pb2 import (
    ModelInferRequest,
    ModelInferResponse,
    ModelStreamInferResponse,
)
from carpool.engine.errors import BadRequest, SidecarError, Unavailable
from carpool.engine.metrics import SidecarMetrics
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.grpc import codec, status

log = logging.getLogger(__name__)
FINAL = "triton_final_response"
# Requests of one stream answered, or their responses not read yet, at once.
REQUESTS_IN_FLIGHT = 64


class _Answered:
    """Put in a stream's queue of responses once a request has no more of them."""


_ANSWERED: Final = _Answered()
_Response = tuple[ModelStreamInferResponse, "asyncio.Future[None]"]


async def answer(
    requests: AsyncIterator[ModelInferRequest],
    dataplane: DataPlane,
    metrics: SidecarMetrics,
    protocol: str,
    message_limit: int,
    closing: asyncio.Event,
) -> AsyncIterator[ModelStreamInferResponse]:
    """Every response to the requests of one stream, each request's in order, requests
    beside one another; each request counts in `metrics` under `protocol`. Once `closing`
    is set, the stream reads no more and ends when its requests are answered."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(REQUESTS_IN_FLIGHT)
    unanswered = 0  # requests read whose last response the client has not taken
    # Responses, each with the future set once gRPC has taken it, and _ANSWERED after each
    # request's last; None once every request is.
    responses: asyncio.Queue[_Response | _Answered | None] = asyncio.Queue()

    async def answer_request(request: ModelInferRequest) -> None:
        try:
            async for response in _answer_one(request, dataplane, metrics, protocol, message_limit):
                taken = loop.create_future()
                responses.put_nowait((response, taken))
                # Its room in the answer budget is held until gRPC has taken it, as a
                # unary answer's is: a client that does not read holds the budget, not more.
                await taken
        finally:
            responses.put_nowait(_ANSWERED)

    async def read() -> None:
        nonlocal unanswered
        unreadable: BadRequest | None = None
        try:
            async with asyncio.TaskGroup() as answering:
                arriving = aiter(requests)
                while True:
                    await slots.acquire()
                    try:
                        request = await anext(arriving)
                    except StopAsyncIteration:
                        break
                    except DecodeError as error:
                        # It ends the stream once the requests read before it are answered.
                        message = f"a message is not a ModelInferRequest: {error}"
                        unreadable = BadRequest(message)
                        break
                    unanswered += 1
                    answering.create_task(answer_request(request))
        except BaseExceptionGroup as failed:
            # Reading the requests failed (an answer raises nothing of its own): the call
            # ends with that error, unwrapped.
            raise failed.exceptions[0] from None
        finally:
            responses.put_nowait(None)
        if unreadable is not None:
            raise unreadable

    def stop_reading_when_answered(_: object = None) -> None:
        if closing.is_set() and not unanswered:
            reader.cancel()  # waiting for a request: none is dropped that would be served

    reader = asyncio.create_task(read())
    watcher = asyncio.create_task(closing.wait())
    watcher.add_done_callback(stop_reading_when_answered)
    try:
        while (response := await responses.get()) is not None:
            if isinstance(response, _Answered):
                slots.release()
                unanswered -= 1
                stop_reading_when_answered()
            else:
                message, taken = response
                yield message
                if not taken.done():  # unless its request was cancelled meanwhile
                    taken.set_result(None)
        if closing.is_set() and reader.cancelled():
            raise Unavailable("the sidecar is shutting down; open a new stream")
        await reader  # the requests' own error, if reading them failed
    finally:
        watcher.cancel()
        reader.cancel()
        for task in (reader, watcher):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _answer_one(
    request: ModelInferRequest,
    dataplane: DataPlane,
    metrics: SidecarMetrics,
    protocol: str,
    limit: int,
) -> AsyncIterator[ModelStreamInferResponse]:
    loop = asyncio.get_running_loop()
    arrived_at = loop.time()
    failure: SidecarError | None = None
    try:
        with metrics.answering(protocol) as counted:
            dataplane.check_model(request.model_name, request.model_version or None)
            infer_request = codec.parse_request(request, dataplane.bounds())
            pieces = dataplane.infer_stream(infer_request, None, arrived_at, limit)
            try:
                async for response, final in pieces:
                    message = codec.encode_response(response)
                    message.parameters[FINAL].bool_param = final
                    yield ModelStreamInferResponse(infer_response=message)
            finally:
                await pieces.aclose()
            counted.status = 200
    except SidecarError as error:
        failure = error
    except Exception:
        log.exception("unexpected error in ModelStreamInfer")
        failure = status.INTERNAL_ERROR
    if failure is not None:
        # With the request's id, as Triton answers: the responses of a stream interleave.
        failed = ModelInferResponse(id=request.id)
        yield ModelStreamInferResponse(error_message=failure.message, infer_response=failed)
