"""`ModelStreamInfer`, Triton's streaming RPC: the requests of one stream answered in turn,
each by one or more responses, the last with the parameter `triton_final_response` true.

A generation request (one prompt) to a model server that streams tokens is answered piece by
piece as the tokens come; any other request in one response, as ModelInfer answers it. A
request that fails is answered with its `error_message`, and the stream goes on with the
next one, as Triton does. Each request counts in the metrics as a ModelInfer call does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest, ModelStreamInferResponse
from carpool.engine.errors import SidecarError
from carpool.engine.metrics import SidecarMetrics
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.grpc import codec, status

log = logging.getLogger(__name__)
FINAL = "triton_final_response"


async def answer(
    requests: AsyncIterator[ModelInferRequest],
    dataplane: DataPlane,
    metrics: SidecarMetrics,
    protocol: str,
    message_limit: int,
) -> AsyncIterator[ModelStreamInferResponse]:
    """Every response to the requests of one stream, in their order; each request counts
    in `metrics` under `protocol`."""
    async for request in requests:
        answers = _answer_one(request, dataplane, metrics, protocol, message_limit)
        async for response in answers:
            yield response


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
        with metrics.answering(protocol, loop.time, arrived_at) as counted:
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
        yield ModelStreamInferResponse(error_message=failure.message)
