"""HTTP statuses and the gRPC codes that mean the same, for both fronts and their clients.

Every carpool error carries the HTTP status a REST caller gets; a gRPC caller gets the code
listed here, and a load generator that counts gRPC answers counts them by the same status.
"""

from __future__ import annotations

import grpc

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
