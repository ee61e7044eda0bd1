"""The load generator's gRPC side: ModelInfer calls of requests serialised in advance.

Bodies go out as the bytes the workload prepared and answers come back unparsed, as the
HTTP sender reads a body without decoding it, so both protocols cost the client alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from carpool.contract.oip_grpc.codes import HTTP_STATUSES
from carpool.loadgen.loops import Send
from carpool.loadgen.workload import PreparedRequest

# Reported like an HTTP status: what a refusal with no REST equivalent counts as.
OTHER_ERROR = 500


def make_grpc_sender(
    channel: grpc.aio.Channel, prepared: Sequence[PreparedRequest], timeout_s: float
) -> Send:
    """A `send(index)` that calls prepared request `index % len(prepared)` (ModelInfer);
    its status is the HTTP status the answer stands for (200 for OK)."""
    if not prepared:
        raise ValueError("the workload holds no requests")
    # A request's path is its method; no serializers: the bodies are protobuf bytes already.
    methods: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {
        request.path: channel.unary_unary(request.path) for request in prepared
    }
    targets = [(methods[request.path], request.body) for request in prepared]

    async def send(index: int) -> int:
        method, body = targets[index % len(targets)]
        try:
            await method(body, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            return HTTP_STATUSES.get(error.code(), OTHER_ERROR)
        return 200

    return send
