"""The one place the sidecar's domain errors become gRPC status codes.

Every SidecarError carries the HTTP status a REST caller gets; gRPC callers get the code
that means the same, and the error's headers (Retry-After) as trailing metadata.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from carpool.sidecar.errors import SidecarError

Context = grpc.aio.ServicerContext[Any, Any]

# HTTP status of a domain error -> the gRPC code a caller sees for it.
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # as gRPC's own message size limit answers
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# The other way, for reports that count answers by HTTP status: the first status listed.
HTTP_STATUSES: dict[grpc.StatusCode, int] = {
    code: http_status for http_status, code in reversed(CODES.items())
}


def code_of(http_status: int) -> grpc.StatusCode:
    """The gRPC code for an HTTP status; unlisted ones by class (caller's or server's fault)."""
    code = CODES.get(http_status)
    if code is not None:
        return code
    return grpc.StatusCode.INVALID_ARGUMENT if http_status < 500 else grpc.StatusCode.INTERNAL


def trailing_metadata(error: SidecarError) -> tuple[tuple[str, str], ...]:
    """The error's headers as gRPC metadata, whose keys are lower case (`retry-after`)."""
    return tuple((key.lower(), value) for key, value in error.headers.items())


async def abort(context: Context, error: SidecarError) -> NoReturn:
    """End the call with the status for `error`; raises, as `context.abort` does."""
    await context.abort(code_of(error.status), error.message, trailing_metadata(error))
