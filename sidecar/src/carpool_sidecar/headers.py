"""The request headers the sidecar reads, parsed into values or BadRequest."""

from __future__ import annotations

from collections.abc import Mapping

from carpool.engine.errors import BadRequest
from carpool_sidecar.oip import HEADER_LENGTH

TIMEOUT_HEADER = "X-Carpool-Timeout-Ms"


def timeout_ms(headers: Mapping[str, str]) -> float | None:
    """The caller's deadline in milliseconds, if it gives one."""
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise BadRequest(f"{TIMEOUT_HEADER} must be milliseconds > 0, got {raw!r}")
    return value


def json_header_length(headers: Mapping[str, str]) -> int | None:
    raw = headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise BadRequest(f"{HEADER_LENGTH} must be a byte count, got {raw!r}")
    return int(raw)
