"""The one place the sidecar's domain errors become gRPC status codes.

Every SidecarError carries the HTTP status a REST caller gets; gRPC callers get the code
that means the same, and the error's headers (Retry-After) as trailing metadata.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import grpc

from carpool.contract.oip_grpc.codes import code_of
from carpool.engine.errors import INTERNAL_MESSAGE, SidecarError

Context = grpc.aio.ServicerContext[Any, Any]
# What a caller hears of a bug in the sidecar; the log has the traceback.
INTERNAL_ERROR = SidecarError(INTERNAL_MESSAGE)


def trailing_metadata(error: SidecarError) -> tuple[tuple[str, str], ...]:
    """The error's headers as gRPC metadata, whose keys are lower case (`retry-after`)."""
    return tuple((key.lower(), value) for key, value in error.headers.items())


async def abort(context: Context, error: SidecarError) -> NoReturn:
    """End the call with the status for `error`; raises, as `context.abort` does.

    gRPC's core may have ended the call already (its deadline passed, its client left)
    before grpc.aio has heard: the status cannot go out, and the call ends as cancelled,
    quietly, as grpc.aio ends one it knows to be gone.
    """
    try:
        await context.abort(code_of(error.status), error.message, trailing_metadata(error))
    except grpc.aio.InternalError:
        raise asyncio.CancelledError from None
